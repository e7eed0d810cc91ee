"""Running the ``pagescribe`` command as a user would: a subprocess against PostgreSQL and the fake provider."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.fakes.chat_server import FakeChatServer


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
