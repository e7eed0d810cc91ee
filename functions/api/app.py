"""The api function's entry point (template.yaml: Handler app.handler): API Gateway proxy events.

The handler is the package module pagescribe.handlers.api, shipped in the SharedLayer.
"""

from pagescribe.handlers.api import handler

__all__ = ["handler"]
