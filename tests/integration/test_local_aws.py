"""The local stack's stand-ins for AWS working apart from the handlers, as AWS does: moto in a process of its own, and
the SQS event source's calls on threads of their own, a long poll always out for the next batch."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.typing import LambdaContext
from pagescribe_local.stack import LocalAws, LocalResources, MotoProcess, ServerProcess, SqsEventSource

HANG = 60.0  # seconds a wait may take before the test fails: a bound on failure, never a guess of how long work takes

_SET_BY_LOCAL_AWS = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "BUCKET_NAME",
    "QUEUE_URL",
    "UPLOAD_FAILURES_QUEUE_URL",
)


@pytest.fixture
def moto_apart(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalAws, LocalResources]]:
    """The local stack's AWS with moto in a process of its own; the environment it sets is restored afterwards."""
    for name in _SET_BY_LOCAL_AWS:
        monkeypatch.setenv(name, "restored after the test")
    aws = LocalAws(own_process=True)
    resources = aws.start(visibility_timeout=60)
    try:
        yield aws, resources
    finally:
        aws.stop()


def _moto_pid(endpoint: str) -> int | None:
    """The process id behind the endpoint, as this machine's socket table says (None when no process listens)."""
    port = int(endpoint.rsplit(":", 1)[1])
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:  # a process gone meanwhile, or not ours to read
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            return int(pid)
    return None


def test_moto_apart_serves_the_stack_from_another_process_and_stops_with_it(
    moto_apart: tuple[LocalAws, LocalResources],
) -> None:
    # Given the local stack's AWS started with moto in a process of its own
    aws, resources = moto_apart
    # Then the server listens in a process other than this one
    pid = _moto_pid(resources.endpoint)
    assert pid is not None and pid != os.getpid()
    # And its S3 and SQS are one moto: an upload's notification reaches the stack's queue, as the trigger would send it
    boto3.client("s3").put_object(Bucket=resources.bucket, Key="uploads/a b.pdf", Body=b"%PDF-1.4")
    sqs = boto3.client("sqs")
    keys: list[str] = []
    deadline = time.monotonic() + HANG
    while not keys and time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=resources.notifications_url, WaitTimeSeconds=1).get("Messages", []):
            keys += [r["s3"]["object"]["key"] for r in json.loads(message["Body"]).get("Records", [])]
    assert [urllib.parse.unquote_plus(key) for key in keys] == ["uploads/a b.pdf"]  # URL-encoded, as S3 sends it
    # When it is stopped, then its process is gone and nothing answers on its port
    aws.stop()
    assert not os.path.exists(f"/proc/{pid}") or _zombie_or_gone(pid)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(resources.endpoint, timeout=5)


def _zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


class _Recording:
    """A transcribe handler that records the job ids of each batch it is given and, in its first batch, waits until
    the event source has received the next batch of ten (at most HANG); it fails the messages named in ``fail_once``
    the first time."""

    def __init__(self, sqs: Any, queue_url: str, fail_once: set[str]) -> None:
        self._sqs = sqs
        self._queue_url = queue_url
        self._fail_once = fail_once
        self.batches: list[list[str]] = []
        self.in_flight_during_first: int | None = None

    def __call__(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        ids = [json.loads(record["body"])["job_id"] for record in event["Records"]]
        if not self.batches:
            self.in_flight_during_first = self._wait_in_flight(len(ids) + 10)
        self.batches.append(ids)
        failed = [r["messageId"] for r in event["Records"] if json.loads(r["body"])["job_id"] in self._fail_once]
        self._fail_once -= set(ids)
        return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in failed]}

    def _wait_in_flight(self, at_least: int) -> int:
        """Messages in flight once at least ``at_least`` are (this batch's and the next one's), or at HANG."""
        deadline = time.monotonic() + HANG
        while True:
            attributes = self._sqs.get_queue_attributes(
                QueueUrl=self._queue_url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
            )["Attributes"]
            in_flight = int(attributes["ApproximateNumberOfMessagesNotVisible"])
            if in_flight >= at_least or time.monotonic() > deadline:
                return in_flight
            threading.Event().wait(0.05)


def test_an_event_source_receiving_ahead_delivers_each_message_once_and_deletes_what_was_handled(
    aws_env: str,
) -> None:
    # Given a queue holding 25 job messages, and an event source that receives ahead
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "300"})["QueueUrl"]
    jobs = [f"job-{n}" for n in range(25)]
    for start in range(0, 25, 10):
        entries = [
            {"Id": str(i), "MessageBody": json.dumps({"job_id": j})} for i, j in enumerate(jobs[start : start + 10])
        ]
        sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)  # type: ignore[arg-type]
    handler = _Recording(sqs, queue_url, fail_once={"job-3"})
    arn = "arn:aws:sqs:us-east-1:123456789012:jobs"
    source = SqsEventSource(
        sqs, queue_url, arn, handler, timeout_seconds=60, function_name="t", failed_visible_after=0, receive_ahead=True
    )
    # When batches are delivered until every job was handled, the failed one again too
    deliveries = 0
    try:
        while sum(map(len, handler.batches)) < 26 and deliveries < 30:
            source.deliver()
            deliveries += 1
    finally:
        source.close()
    # Then while the first batch was handled, the next one had been received already (its ten and the next ten)
    assert handler.in_flight_during_first == 20
    # And every job was handled once, but for the one that failed once and came back
    handled = [job for batch in handler.batches for job in batch]
    assert sorted(handled) == sorted([*jobs, "job-3"])
    # And what was handled was deleted: nothing is left in the queue or in flight
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    left = (attributes["ApproximateNumberOfMessages"], attributes["ApproximateNumberOfMessagesNotVisible"])
    assert left == ("0", "0")


def test_an_event_source_receiving_ahead_says_when_a_handled_batch_could_not_be_deleted(
    aws_env: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an event source receiving ahead, and a handler that deletes the queue under its batch
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName="jobs")["QueueUrl"]
    sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"job_id": "job-1"}))

    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        sqs.delete_queue(QueueUrl=queue_url)
        return {"batchItemFailures": []}

    arn = "arn:aws:sqs:us-east-1:123456789012:jobs"
    source = SqsEventSource(sqs, queue_url, arn, handler, timeout_seconds=60, function_name="t", receive_ahead=True)
    # When its batch is handled, then the deletes made on the event source's thread fail, and that is logged
    try:
        assert source.deliver()[0] == 1
        # And once a poll fails (the one out meanwhile may end empty first), its error is raised once: the next
        # delivery makes a poll afresh, which fails with an error of its own
        errors: list[Exception] = []
        for _ in range(4):
            try:
                source.deliver()
            except sqs.exceptions.QueueDoesNotExist as exc:
                errors.append(exc)
        assert len(errors) >= 2 and errors[-1] is not errors[-2]
    finally:
        source.close()
    assert "a handled batch's messages could not be deleted" in caplog.text


def _exit_at_once(code: int, connection: object) -> None:
    """A server process's target that ends before it serves."""
    raise SystemExit(code)


def test_a_moto_process_that_ends_as_it_starts_is_reported_with_its_exit_code() -> None:
    # Given moto's own process, standing for one that ends at once (its target exits with code 3)
    moto = MotoProcess("127.0.0.1", 0)
    moto.process = ServerProcess("moto", _exit_at_once, 3, start_seconds=MotoProcess.START_SECONDS)
    # When it is started, then the start fails at once, naming the exit code, not after START_SECONDS
    with pytest.raises(RuntimeError, match=r"the moto process ended as it started \(exit code 3"):
        moto.start()
