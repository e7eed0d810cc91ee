"""The use cases on the in-memory store: no PostgreSQL, and the time a test needs passes at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from pagescribe.aws import JobMessage, JobQueue

from tests.support.memory_store import MemoryStore


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


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
