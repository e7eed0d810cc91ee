"""Running the ``pagescribe`` command as a user would: a subprocess against PostgreSQL and the fake provider."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from tests.fakes.chat_server import FakeChatServer

# The fake provider answers a page with a text of its own making (``expected_text``: what names the image), not with
# what is on the page, so every such answer would be ungrounded and leave the page's text missed: those two checks
# fire (at their default thresholds) only in the tests that set them to, with answers that are the page's own text.
NOT_GROUNDED = {"FLAG_UNGROUNDED_THRESHOLD": "1", "FLAG_UNGROUNDED_BLOCK_CHARS": "0", "FLAG_MISSED_TEXT_THRESHOLD": "1"}


def command_environment(database_url: str, provider: FakeChatServer) -> dict[str, str]:
    """This process's environment without AWS, provider and API settings, pointed at ``provider``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PROVIDER_", "API_KEY", "TEXT_LAYER"))}
    env.update(
        {
            "DATABASE_URL": database_url,
            "PROVIDER_BASE_URL": provider.base_url,
            "MODEL": "test/vision-model",
            "FUNCTION_TIMEOUT_SECONDS": "60",
            "PROVIDER_TIMEOUT_SECONDS": "30",
            **NOT_GROUNDED,
        }
    )
    return env


def pagescribe(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagescribe_local.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def start_serve(
    database_url: str,
    fake_provider: FakeChatServer,
    cwd: Path,
    *options: str,
    sigint_ignored: bool = False,
    settings: dict[str, str] | None = None,
    log: IO[str] | None = None,
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """``pagescribe serve`` with the API key ``local-key`` (and ``settings`` in its environment), and the endpoints
    it printed once it was up; its stderr (its access log) goes to ``log``, or nowhere. ``sigint_ignored``: started
    with SIGINT ignored, as a shell script's ``pagescribe serve &`` is."""
    env = {**command_environment(database_url, fake_provider), "API_KEY": "local-key", **(settings or {})}
    server = subprocess.Popen(
        [sys.executable, "-m", "pagescribe_local.cli", "serve", "--port", "0", *options],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=log if log is not None else subprocess.DEVNULL,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
    )
    assert server.stdout is not None
    endpoints = json.loads(server.stdout.readline())
    # The handlers' JSON logs follow on stdout: read them, so that a full pipe never blocks the server
    threading.Thread(target=server.stdout.read, daemon=True).start()
    return server, endpoints
