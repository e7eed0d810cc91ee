"""The batch lane on the in-memory store, against the fake batch server in each dialect over real HTTP, with the
page images in S3 (a moto server) that the fake fetches through their presigned URLs, as a provider does."""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from pagescribe.assembly import TranscriptWriter
from pagescribe.aws import ObjectStore, s3_client
from pagescribe.batchlane import BatchLane, lane_of, park_seconds
from pagescribe.domain import (
    ClaimedJob,
    DocumentRecord,
    DocumentStatus,
    JobStatus,
    NewDocument,
    PageResult,
    PendingDocument,
    ProviderBatch,
)
from pagescribe.domain import Lane as LaneName
from pagescribe.providers.batches import batch_api
from pagescribe.providers.openai_compat import OpenAICompatibleProvider
from pagescribe.rendering import RenderPool
from pagescribe.secondread import SecondReader
from pagescribe.settings import Settings
from pagescribe.timepolicy import Deadline, TimePolicy
from pagescribe.transcription.outcomes import thresholds
from pagescribe.transcription.sourcecache import SourceCache
from pagescribe.transcription.transcriber import Transcriber
from pydantic import SecretStr

from tests.fakes.batch_server import Errors, Expire, Fail, FakeBatchServer, Hold, Partial, Repeat
from tests.fakes.chat_server import FakeChatServer, expected_text
from tests.support import CORPUS
from tests.support.memory_store import MemoryStore
from tests.unit.use_cases.conftest import QueueSpy

MODEL = "vision/model"
SETTINGS_TIME = Settings()  # the time policy of a default stack: what a delivery's deadline is timed with


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

    def parked_documents(self, documents: int, pages: int, *, escalation_model: str | None = None) -> list[str]:
        """``documents`` batch-lane documents of ``pages`` pages each, every page claimed, its image kept and parked
        as the transcribe function leaves it: their job ids."""
        job_ids: list[str] = []
        for _ in range(documents):
            pending_id = str(uuid.uuid4())
            key = f"uploads/{pending_id}.pdf"
            self.store.create_pending_document(
                PendingDocument(
                    pending_id, self.bucket, key, "a.pdf", MODEL, None, None, None, escalation_model, lane="batch"
                )
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
        bucket_name=bucket,
        provider_api_key=SecretStr("sk-test"),
        batch_base_url=fake.base_url,
        second_read="off",
        **{"batch_dialect": dialect, **settings},
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
    # (and the first batch of the pages sent again gives every answer twice)
    fake_batches.script(Partial(missing=5), Expire(answered=100), Fail(), Errors(count=3), Repeat())
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


@pytest.mark.parametrize("dialect", ["openai", "openrouter"])
def test_a_batch_the_provider_refuses_loses_no_page_its_pages_are_sent_by_the_next_sweep(
    dialect: str, aws_env: str, fake_batches: FakeBatchServer
) -> None:
    lane = _lane(dialect, aws_env, fake_batches)
    job_ids = lane.parked_documents(1, 3)
    fake_batches.refuse_batches = 1
    batches = lane.lane()
    refused = batches.sweep()
    assert (refused.batches_submitted, refused.pages_waiting) == (0, 3)
    assert batches.sweep().pages_submitted == 3
    assert batches.sweep().pages_answered == 3
    assert {lane.store.state.jobs[j].status for j in job_ids} == {JobStatus.COMPLETED}
    # (the refused batch is closed as not sent, its pages' submission not counted: each was sent once)
    assert sorted(b.status for b in lane.store.state.batches.values()) == ["completed", "not_sent"]
    assert {lane.store.state.jobs[j].batch_submissions for j in job_ids} == {1}


def _record(lane: str | None, deadline: datetime | None = None) -> DocumentRecord:
    store, document_id = MemoryStore(), str(uuid.uuid4())
    store.create_pending_document(
        PendingDocument(document_id, "b", "k", "a.pdf", MODEL, None, None, None, lane=lane, deadline=deadline)
    )
    record = store.get_document(document_id)
    assert record is not None
    return record


def test_the_lane_of_a_page() -> None:
    settings = Settings(provider_api_key=SecretStr("sk-test"), batch_sync_reserve_seconds=900)
    now = datetime.now(UTC)
    record = _record(lane=None)
    assert lane_of(record, None, settings) is LaneName.SYNC  # DEFAULT_LANE
    assert lane_of(record, None, settings.model_copy(update={"default_lane": "batch"})) is LaneName.BATCH
    assert lane_of(_record(lane="batch"), "sync", settings) is LaneName.SYNC  # a page moved to sync stays there
    assert lane_of(_record(lane="batch", deadline=now + timedelta(hours=1)), None, settings) is LaneName.BATCH
    assert lane_of(_record(lane="batch", deadline=now + timedelta(minutes=10)), None, settings) is LaneName.SYNC
    offline = settings.model_copy(update={"provider_api_key": None})
    assert lane_of(_record(lane="batch"), None, offline) is LaneName.SYNC  # the offline engine has no batch API
    bedrock = settings.model_copy(update={"provider": "bedrock"})
    assert lane_of(_record(lane="batch"), None, bedrock) is LaneName.SYNC  # nor does Bedrock, for the lane


def test_a_sweep_with_no_time_left_sends_and_polls_nothing_and_the_next_one_does(
    aws_env: str, fake_batches: FakeBatchServer
) -> None:
    lane = _lane("openrouter", aws_env, fake_batches)
    lane.parked_documents(1, 3)
    batches = lane.lane()
    spent = batches.sweep(0)
    assert (spent.batches_submitted, spent.pages_waiting, len(fake_batches.batches)) == (0, 3, 0)
    assert batches.sweep(60).pages_submitted == 3
    assert batches.sweep(0).batches_collected == 0 and batches.sweep(60).pages_answered == 3


def test_a_batch_polled_by_two_overlapping_sweeps_has_its_answers_taken_by_one(
    aws_env: str, fake_batches: FakeBatchServer
) -> None:
    # Given a batch sent, and a second sweeper that read the open batches before the first collected it
    lane = _lane("openai", aws_env, fake_batches)
    job_ids = lane.parked_documents(1, 2)
    first = lane.lane()
    first.sweep()
    stale = lane.store.open_batches(limit=10)

    class Overlapping(MemoryStore):
        def open_batches(self, *, limit: int) -> list[ProviderBatch]:
            return stale

    overlapping = Overlapping()
    overlapping.state = lane.store.state
    second = BatchLane(
        lane.settings, overlapping, lane.queue, lane.objects, first._api, lambda _: None, thresholds(lane.settings)
    )
    # When the first sweep collects it, then the second
    assert first.sweep().pages_answered == 2
    late = second.sweep()
    # Then the second takes no answer: each page's answer is recorded once
    assert (late.batches_collected, late.pages_answered, late.answers_not_kept) == (0, 0, 0)
    assert Counter(a.job_id for a in lane.store.state.attempts) == dict.fromkeys(job_ids, 1)


def test_a_hard_flagged_batch_answer_escalates_its_page_on_the_sync_lane_and_a_clean_one_completes(
    aws_env: str, fake_batches: FakeBatchServer
) -> None:
    # Given two parked pages of a document with an escalation model, the first of which the batch answers in a loop
    lane = _lane("openai", aws_env, fake_batches)
    job_ids = lane.parked_documents(1, 2, escalation_model="big/model")
    looping = lane.images[job_ids[0]]
    fake_batches.answer = lambda image: "the same words again " * 400 if image == looping else expected_text(image)
    batches = lane.lane()
    # When the sweeper sends them and collects their answers
    batches.sweep()
    assert batches.sweep().pages_answered == 2
    # Then the clean answer completes its page, and the looping one escalates its page: its answer recorded as
    # ESCALATED, the page QUEUED on the sync lane with its escalation pending and its message sent
    store = lane.store
    looped, clean = store.state.jobs[job_ids[0]], store.state.jobs[job_ids[1]]
    assert clean.status is JobStatus.COMPLETED
    assert (looped.status, looped.escalation, looped.lane) == (JobStatus.QUEUED, "PENDING", "sync")
    assert [m.job_id for m in lane.queue.sent] == [job_ids[0]]
    assert sorted(a.outcome for a in store.state.attempts) == ["ESCALATED", "KEPT"]
    # And its next claim goes to the escalation model, on the sync lane
    claimed = store.claim_jobs([job_ids[0]], lease_seconds=60, max_attempts=3).claimed[job_ids[0]]
    assert claimed.escalation_pending and claimed.lane == "sync"


# --- a deadline the batch cannot meet ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def renderer() -> Iterator[RenderPool]:
    pool = RenderPool(workers=1, memory_limit_mb=1024, timeout_seconds=60)
    yield pool
    pool.close()


def _transcriber(lane: Lane, chat: FakeChatServer, renderer: RenderPool) -> Transcriber:
    settings = lane.settings
    provider = OpenAICompatibleProvider(
        base_url=chat.base_url,
        api_key="sk-test",
        time=TimePolicy.from_settings(settings),
        max_connections=4,
        usage_accounting=True,
    )
    transcripts = TranscriptWriter(settings, lane.store, lane.objects)
    reader = SecondReader(lambda: renderer, language="en")
    parts = (lane.queue, provider, SourceCache(lane.objects), renderer, transcripts, reader)
    return Transcriber(settings, lane.store, *parts)


def _deliver(loop: asyncio.AbstractEventLoop, transcriber: Transcriber, job_ids: list[str]) -> list[PageResult]:
    """One SQS batch naming these jobs, its messages transcribed concurrently, on the environment's one loop."""
    bodies = [json.dumps({"job_id": job_id}) for job_id in job_ids]

    async def run() -> list[PageResult]:
        batch = transcriber.batch(bodies, Deadline.after(600, TimePolicy.from_settings(SETTINGS_TIME)))
        return list(await asyncio.gather(*(batch.transcribe(body) for body in bodies)))

    return loop.run_until_complete(run())


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The long-lived event loop of a transcribe environment (its provider client belongs to it)."""
    running = asyncio.new_event_loop()
    yield running
    running.close()


@pytest.mark.parametrize("dialect", ["openai", "openrouter"])
def test_pages_whose_batch_would_miss_the_deadline_finish_on_the_sync_lane_before_it_each_answer_kept_once(
    dialect: str,
    aws_env: str,
    fake_batches: FakeBatchServer,
    fake_provider: FakeChatServer,
    renderer: RenderPool,
    loop: asyncio.AbstractEventLoop,
) -> None:
    # Given a 4-page document in the batch lane due in two hours, whose pages the transcriber parked and the sweeper
    # sent in a batch that the provider holds (it would not answer in time)
    lane = _lane(
        dialect,
        aws_env,
        fake_batches,
        text_layer="off",
        model=MODEL,
        batch_sync_reserve_seconds=900,
        flag_ungrounded_threshold=1,  # the fakes answer a page with its image's digest, not its words
        flag_ungrounded_block_chars=0,
        flag_missed_text_threshold=1,
    )
    body = (CORPUS / "pdflatex-4-pages.pdf").read_bytes()
    key, pending_id = "uploads/late.pdf", str(uuid.uuid4())
    lane.objects.put_bytes(lane.bucket, key, body, content_type="application/pdf")
    deadline = datetime.now(UTC) + timedelta(hours=2)
    lane.store.create_pending_document(
        PendingDocument(
            pending_id, lane.bucket, key, "late.pdf", MODEL, None, None, None, lane="batch", deadline=deadline
        )
    )
    new = NewDocument(lane.bucket, key, "", "", len(body), MODEL)
    job_ids = list(lane.store.create_document(new, kind="pdf", pages=[1, 2, 3, 4], pending_id=pending_id).job_ids)
    transcriber = _transcriber(lane, fake_provider, renderer)
    assert _deliver(loop, transcriber, job_ids) == [PageResult.PARKED] * 4
    fake_batches.script(Hold())
    batches = lane.lane()
    assert batches.sweep().pages_submitted == 4
    assert batches.sweep().pages_waiting == 4 and fake_provider.calls == 0

    # When the deadline is nearer than BATCH_SYNC_RESERVE_SECONDS (an hour and fifty-one minutes later) and the sweeper
    # runs, then the pages' messages are delivered
    lane.store.state.clock.advance(timedelta(hours=1, minutes=51).total_seconds())
    moved = batches.sweep()
    assert moved.moved_to_sync == 4 and moved.pages_waiting == 0
    assert sorted(m.job_id for m in lane.queue.sent) == sorted(job_ids)
    assert _deliver(loop, transcriber, job_ids) == [PageResult.COMPLETED] * 4

    # Then every page is done on the sync lane before the deadline, its one call kept and paid once
    store = lane.store
    assert all(store.state.jobs[j].completed_at < deadline for j in job_ids)  # type: ignore[operator]
    assert store.state.documents[pending_id].status is DocumentStatus.COMPLETED
    assert fake_provider.calls == 4
    assert Counter((a.job_id, a.outcome) for a in store.state.attempts) == {(j, "KEPT"): 1 for j in job_ids}
    # And the batch no page waits in any more is cancelled where the API allows it (OpenAI's); OpenRouter's, which
    # offers no cancellation, answers at last: its answers are recorded with their cost, and none is kept
    if dialect == "openai":
        assert list(fake_batches.cancelled) == list(fake_batches.batches)
        assert batches.sweep().answers_not_kept == 0
    else:
        fake_batches.release()
        assert batches.sweep().answers_not_kept == 4
        late = [a for a in store.state.attempts if a.outcome == "LEASE_LOST"]
        assert sorted(a.job_id for a in late) == sorted(job_ids)
        assert sum(a.cost or 0 for a in late) == pytest.approx(4 * fake_batches.cost())
    # And the answer each page keeps is its sync call's
    assert {store.state.jobs[j].provider.split(":")[0] for j in job_ids} == {"openai-compatible"}  # type: ignore[union-attr]
