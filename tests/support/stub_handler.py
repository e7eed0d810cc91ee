"""A Lambda handler for tests of the local environments: it answers with its process id and does what the event
says (answer, raise, hang, or end its process)."""

from __future__ import annotations

import os
import threading
from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    action = event.get("action", "answer")
    if action == "raise":
        raise RuntimeError("the handler failed")
    if action == "hang":
        threading.Event().wait()  # never answers
    if action == "exit":
        os._exit(3)
    return {"statusCode": 200, "body": str(os.getpid()), "echo": event.get("echo")}
