"""The sweeper function's entry point (template.yaml: Handler app.handler): the schedule, every minute.

The handler is the package module pagescribe.handlers.sweeper, shipped in the SharedLayer.
"""

from pagescribe.handlers.sweeper import handler

__all__ = ["handler"]
