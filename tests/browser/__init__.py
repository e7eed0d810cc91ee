"""The review page in a headless browser."""
