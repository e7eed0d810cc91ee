"""The migrate function's entry point (template.yaml: Handler app.handler): the custom resource of sam deploy.

The handler is the package module pagescribe.handlers.migrate, shipped in the SharedLayer.
"""

from pagescribe.handlers.migrate import handler

__all__ = ["handler"]
