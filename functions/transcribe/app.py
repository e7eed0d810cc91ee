"""The transcribe function's entry point (template.yaml: Handler app.handler): SQS batches of page jobs.

The handler is the package module pagescribe.handlers.transcribe, shipped in the SharedLayer.
"""

from pagescribe.handlers.transcribe import handler

__all__ = ["handler"]
