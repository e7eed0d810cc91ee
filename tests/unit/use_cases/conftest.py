"""The use cases on the in-memory store: no PostgreSQL, and the time a test needs passes at once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import boto3
import pytest
from moto import mock_aws
from pagescribe.aws import JobMessage, JobQueue, ObjectStore

from tests.support.memory_store import MemoryStore

BUCKET = "pagescribe-bucket"  # the stack's bucket: uploads/ and transcripts/


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """AWS through moto in this process, whatever the environment points boto3 at."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield


@pytest.fixture
def objects(aws: None) -> ObjectStore:
    """S3 through moto in this process, with the stack's bucket made."""
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return ObjectStore(client)


@dataclass
class QueueSpy(JobQueue):
    """The job queue as the use cases see it: what was sent, and a queue that can be made to refuse."""

    sent: list[JobMessage] = field(default_factory=list)
    refusing: bool = False

    def send(self, messages: Sequence[JobMessage], *, delay_seconds: int = 0) -> list[str]:
        if self.refusing:
            return []
        self.sent.extend(messages)
        return [m.job_id for m in messages]
