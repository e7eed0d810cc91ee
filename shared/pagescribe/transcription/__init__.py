"""Transcribe: one page job from claim to fenced result, concurrently with the other pages of a batch."""
