"""The upload function's entry point (template.yaml: Handler app.handler): S3 ObjectCreated events.

The handler is the package module pagescribe.handlers.upload, shipped in the SharedLayer.
"""

from pagescribe.handlers.upload import handler

__all__ = ["handler"]
