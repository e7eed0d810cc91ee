"""Invoke a handler in this process as a fresh Lambda execution environment would.

    python -m tests.support.invoke transcribe|upload|sweeper 60 [linger] < event.json
    # prints the handler's response as JSON; with "linger", the environment then stays warm until a signal

Tests run it as a subprocess to get truly separate environments (own event loop, pool and client) that
race each other, and to kill one mid-call.
"""

from __future__ import annotations

import json
import sys
import time

from tests.support.aws_events import LambdaContext


def main() -> None:
    function, timeout = sys.argv[1], float(sys.argv[2])
    event = json.load(sys.stdin)
    if function == "transcribe":
        from pagescribe.handlers.transcribe import handler
    elif function == "sweeper":
        from pagescribe.handlers.sweeper import handler
    else:
        from pagescribe.handlers.upload import handler
    response = handler(event, LambdaContext(timeout))
    print(json.dumps(response), flush=True)
    if sys.argv[3:] == ["linger"]:
        while True:  # like a frozen Lambda environment, until the service shuts it down with SIGTERM
            time.sleep(1)


if __name__ == "__main__":
    main()
