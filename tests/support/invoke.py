"""Invoke a handler in this process as a fresh Lambda execution environment would.

    python -m tests.support.invoke transcribe|upload|sweeper 60 [linger] < event.json
    # prints the handler's response as JSON; with "linger", the environment then stays warm until a signal

Tests run it as a subprocess to get truly separate environments (own event loop, pool and client) that
race each other, and to kill one mid-call.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from tests.support.aws_events import LambdaContext


def lambda_handler(function: str) -> Callable[[dict[str, Any], Any], Any]:
    """The handler of ``function`` (transcribe, sweeper or upload), loaded as in Lambda, which names the function in
    AWS_LAMBDA_FUNCTION_NAME (so its metrics are recorded, as deployed)."""
    if function not in ("transcribe", "sweeper", "upload"):
        raise ValueError(f"no such function: {function}")
    os.environ["AWS_LAMBDA_FUNCTION_NAME"] = f"pagescribe-{function}"
    handler: Callable[[dict[str, Any], Any], Any] = importlib.import_module(f"pagescribe.handlers.{function}").handler
    return handler


def main() -> None:
    function, timeout = sys.argv[1], float(sys.argv[2])
    event = json.load(sys.stdin)
    response = lambda_handler(function)(event, LambdaContext(timeout))
    print(json.dumps(response), flush=True)
    if sys.argv[3:] == ["linger"]:
        while True:  # like a frozen Lambda environment, until the service shuts it down with SIGTERM
            time.sleep(1)


if __name__ == "__main__":
    main()
