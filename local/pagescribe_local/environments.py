"""Lambda's execution environments for one function, on this machine: each is a process of its own that loads the
handler once (its cold start) and then runs one invocation at a time, as Lambda runs them.

A Lambda handler may keep per-invocation state in its module (Powertools' resolver keeps the current event, the
context and ``app.context`` on the module's ``app``; its logger keeps the invocation's keys), because Lambda never
runs two invocations in one environment at once. ``pagescribe serve`` takes many HTTP requests at a time, so it
runs each in an environment of this pool, never two in one, and answers as API Gateway does when an invocation
fails (502) or outlasts the integration's timeout (504).

``python -m pagescribe_local.environments FD MODULE FUNCTION TIMEOUT`` is one environment: it reads events from the
connection on file descriptor FD and answers each with the handler's response.
"""

from __future__ import annotations

import importlib
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

INTEGRATION_TIMEOUT_SECONDS = 29.0  # API Gateway's REST integration timeout: the caller gets a 504 after it
START_TIMEOUT_SECONDS = 120.0  # a cold start on a loaded machine; an environment that does not start is an error


def _gateway_response(status: int, message: str, error_type: str) -> dict[str, Any]:
    """An answer API Gateway gives itself, without the function's: its status, ``{"message": …}`` and error type."""
    return {
        "statusCode": status,
        "headers": {"Content-Type": "application/json", "x-amzn-ErrorType": error_type},
        "body": json.dumps({"message": message}),
    }


def timed_out() -> dict[str, Any]:
    return _gateway_response(504, "Endpoint request timed out", "IntegrationTimeoutException")


def function_failed() -> dict[str, Any]:
    """A function that raised, or whose environment died: API Gateway's 502 (the error is in the function's log)."""
    return _gateway_response(502, "Internal server error", "InternalServerErrorException")


class EnvironmentStartError(RuntimeError):
    """An environment could not be started."""


@dataclass
class _Environment:
    process: subprocess.Popen[bytes]
    connection: Connection

    def close(self) -> None:
        self.connection.close()  # the environment reads EOF and exits
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.connection.close()


class EnvironmentPool:
    """Up to ``size`` environments of one function's handler (``module``.handler), started when the invocations in
    flight need another, and reused warm (the most recently used first, as Lambda does)."""

    def __init__(
        self,
        module: str,
        *,
        size: int,
        function_name: str,
        timeout_seconds: float = INTEGRATION_TIMEOUT_SECONDS,
    ) -> None:
        if size < 1:
            raise ValueError(f"an environment pool needs at least one environment, not {size}")
        self._module = module
        self._function_name = function_name
        self._timeout_seconds = timeout_seconds
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[_Environment] = []
        self._all: list[_Environment] = []
        self._closed = False

    def invoke(self, event: dict[str, Any]) -> dict[str, Any]:
        """The handler's response to ``event``, run in an environment that runs nothing else meanwhile; API Gateway's
        own answer when the function fails or does not answer in time."""
        with self._slots:
            try:
                environment = self._take()
            except EnvironmentStartError:
                log.exception("no environment of %s to run the invocation in", self._module)
                return function_failed()
            try:
                environment.connection.send(event)
                if not environment.connection.poll(self._timeout_seconds):
                    log.warning(
                        "%s did not answer in %.0f s; its environment is stopped", self._module, self._timeout_seconds
                    )
                    self._discard(environment)
                    return timed_out()
                outcome, value = environment.connection.recv()
            except (EOFError, OSError):
                log.error("an environment of %s died during an invocation", self._module)
                self._discard(environment)
                return function_failed()
            self._put_back(environment)
            if outcome != "response":
                log.error("%s failed: %s", self._module, value)
                return function_failed()
            return dict(value)

    def start(self) -> None:
        """Start one environment now (a provisioned one), so that the first request does not wait for a cold start."""
        with self._slots:
            self._put_back(self._take())

    def close(self) -> None:
        """Stop every environment; invocations still running are answered as failed."""
        with self._lock:
            self._closed = True
            environments, self._all, self._idle = self._all, [], []
        for environment in environments:
            environment.close()

    def _take(self) -> _Environment:
        with self._lock:
            if self._closed:
                raise EnvironmentStartError(f"the environments of {self._module} are stopped")
            if self._idle:
                return self._idle.pop()
        environment = self._spawn()
        with self._lock:
            self._all.append(environment)
        return environment

    def _put_back(self, environment: _Environment) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(environment)
                return
        environment.close()

    def _discard(self, environment: _Environment) -> None:
        with self._lock:
            if environment in self._all:
                self._all.remove(environment)
        environment.kill()

    def _spawn(self) -> _Environment:
        ours, theirs = socket.socketpair()
        process = subprocess.Popen(  # noqa: S603 (our own interpreter and module; no shell, no user input)
            [
                sys.executable,
                "-m",
                __name__,
                str(theirs.fileno()),
                self._module,
                self._function_name,
                str(self._timeout_seconds),
            ],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        connection = Connection(ours.detach())
        environment = _Environment(process, connection)
        try:
            ready = connection.poll(START_TIMEOUT_SECONDS) and connection.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            environment.kill()
            raise EnvironmentStartError(f"an environment of {self._module} did not start (exit code {process.poll()})")
        return environment


def run_environment(fd: int, module: str, function_name: str, timeout_seconds: float) -> None:
    """One environment: load the handler, say so, then answer each event until the connection closes."""
    from pagescribe.runtime import shutdown_runtime

    from pagescribe_local.stack import LambdaContext

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: serve stops the pool
    connection = Connection(fd)
    handler: Callable[[dict[str, Any], Any], Any] = importlib.import_module(module).handler
    connection.send("ready")
    try:
        while True:
            try:
                event = connection.recv()
            except EOFError:
                return
            try:
                answer: tuple[str, Any] = ("response", handler(event, LambdaContext(timeout_seconds, function_name)))
            except Exception as exc:  # Lambda reports an unhandled error; the environment lives on
                log.exception("the handler raised")
                answer = ("error", f"{type(exc).__name__}: {exc}")
            connection.send(answer)
    finally:
        connection.close()
        shutdown_runtime()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    run_environment(int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4]))
