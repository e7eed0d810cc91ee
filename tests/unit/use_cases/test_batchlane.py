"""The batch lane on the in-memory store, against the fake batch server in each dialect over real HTTP, with the
page images in S3 (a moto server) that the fake fetches through their presigned URLs, as a provider does."""

from __future__ import annotations

import secrets
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from pagescribe.assembly import TranscriptWriter
from pagescribe.aws import ObjectStore, s3_client
from pagescribe.batchlane import BatchLane, park_seconds
from pagescribe.domain import ClaimedJob, DocumentStatus, JobStatus, NewDocument, PendingDocument
from pagescribe.providers.batches import batch_api
from pagescribe.settings import Settings
from pagescribe.transcription.outcomes import thresholds

from tests.fakes.batch_server import Errors, Expire, Fail, FakeBatchServer, Partial
from tests.fakes.chat_server import expected_text
from tests.support.memory_store import MemoryStore
from tests.unit.use_cases.conftest import QueueSpy

MODEL = "vision/model"


@pytest.fixture
def fake_batches() -> Iterator[FakeBatchServer]:
    with FakeBatchServer() as fake:
        yield fake


@dataclass
class Lane:
    """The batch lane of a stack: its store, bucket, queue and settings, and the fake provider behind it."""

    store: MemoryStore
    objects: ObjectStore
    bucket: str
    settings: Settings
    fake: FakeBatchServer
    queue: QueueSpy = field(default_factory=QueueSpy)
    images: dict[str, bytes] = field(default_factory=dict)  # each page's kept image, by job id

    def lane(self) -> BatchLane:
        api = batch_api(self.settings.batch_dialect, base_url=self.fake.base_url, api_key="sk-test")
        writer = TranscriptWriter(self.settings, self.store, self.objects)
        return BatchLane(
            self.settings, self.store, self.queue, self.objects, api, writer.finish, thresholds(self.settings)
        )

    def parked_documents(self, documents: int, pages: int) -> list[str]:
        """``documents`` batch-lane documents of ``pages`` pages each, every page claimed, its image kept and parked
        as the transcribe function leaves it: their job ids."""
        job_ids: list[str] = []
        for _ in range(documents):
            pending_id = str(uuid.uuid4())
            key = f"uploads/{pending_id}.pdf"
            self.store.create_pending_document(
                PendingDocument(pending_id, self.bucket, key, "a.pdf", MODEL, None, None, None, lane="batch")
            )
            created = self.store.create_document(
                NewDocument(self.bucket, key, "etag", "", 1, MODEL), kind="pdf", pages=range(1, pages + 1),
                pending_id=pending_id,
            )  # fmt: skip
            claims = self.store.claim_jobs(created.job_ids, lease_seconds=60, max_attempts=3).claimed
            for job in claims.values():
                self.park(job)
            job_ids.extend(created.job_ids)
        return job_ids

    def park(self, job: ClaimedJob) -> None:
        image = f"page {job.page_number} of {job.document_id}".encode()
        image_key = f"transcripts/{job.document_id}/pages/{job.page_number:04d}.png"
        self.objects.put_bytes(self.bucket, image_key, image, content_type="image/png")
        self.images[job.job_id] = image
        evidence = {"ink": 0.1, "text_layer": "", "rotation": 0}
        assert self.store.park_for_batch(
            job, model=MODEL, image_key=image_key, evidence=evidence, wait_seconds=park_seconds(self.settings)
        )


def _lane(dialect: str, aws_env: str, fake: FakeBatchServer, **settings: Any) -> Lane:
    bucket = f"pagescribe-batch-{secrets.token_hex(4)}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    configured = Settings(
        bucket_name=bucket, batch_base_url=fake.base_url, second_read="off", **{"batch_dialect": dialect, **settings}
    )
    return Lane(MemoryStore(), ObjectStore(s3_client()), bucket, configured, fake)


@pytest.mark.parametrize("dialect", ["openai", "openrouter"])
def test_a_thousand_pages_through_the_batch_lane_each_done_once_despite_partial_failed_and_expired_batches(
    dialect: str, aws_env: str, fake_batches: FakeBatchServer
) -> None:
    # Given 1,000 pages parked in the batch lane (10 documents of 100), sent 250 to a batch, whose batches end: with 5
    # answers missing, expired after 100 answers, failed, and with 3 requests in error
    lane = _lane(dialect, aws_env, fake_batches, batch_max_pages=250)
    job_ids = lane.parked_documents(10, 100)
    fake_batches.script(Partial(missing=5), Expire(answered=100), Fail(), Errors(count=3))
    batches = lane.lane()

    # When the sweeper runs until no page waits
    sweeps = [batches.sweep() for _ in range(4)]

    # Then the first sweep sent four batches, the second collected them and sent again the 408 pages they did not
    # answer, and the third collected those: every page answered
    assert [(s.batches_submitted, s.pages_submitted) for s in sweeps] == [(4, 1000), (2, 408), (0, 0), (0, 0)]
    assert [s.pages_answered for s in sweeps] == [0, 592, 408, 0] and sweeps[-1].pages_waiting == 0
    # And every page is COMPLETED with the answer to its own image, kept once, from a provider that fetched its image
    store = lane.store
    for job_id in job_ids:
        row = store.state.jobs[job_id]
        assert (row.status, row.result_text) == (JobStatus.COMPLETED, expected_text(lane.images[job_id]))
    kept = Counter(a.job_id for a in store.state.attempts if a.outcome == "KEPT")
    assert set(kept) == set(job_ids) and set(kept.values()) == {1}
    assert Counter(fake_batches.answered_ids()) == kept  # no page answered twice, no answer paid and not kept
    assert fake_batches.fetches == 1000
    # And each answer is paid at the batch price; the three requests in error are recorded as calls that failed
    assert sum(a.cost or 0 for a in store.state.attempts) == pytest.approx(1000 * fake_batches.cost())
    assert Counter(a.outcome for a in store.state.attempts) == {"KEPT": 1000, "ERROR": 3}
    # And every document is finished with its transcript
    assert {d.status for d in store.state.documents.values()} == {DocumentStatus.COMPLETED}
