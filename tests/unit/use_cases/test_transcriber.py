"""The transcriber on the in-memory store: a page from its claim to its fenced result, with a scripted model in this
process, the real render processes, and S3 through moto in process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from pagescribe.assembly import TranscriptWriter
from pagescribe.aws import ObjectStore
from pagescribe.domain import NewDocument, PageResult
from pagescribe.providers.base import ProviderError, Transcription, TranscriptionRequest
from pagescribe.rendering import RenderPool
from pagescribe.secondread import SecondReader
from pagescribe.settings import Settings
from pagescribe.timepolicy import Deadline, TimePolicy
from pagescribe.transcription.sourcecache import SourceCache
from pagescribe.transcription.transcriber import Transcriber

from tests.support import CORPUS
from tests.support.memory_store import MemoryStore
from tests.unit.use_cases.conftest import BUCKET, QueueSpy

SETTINGS = Settings(bucket_name=BUCKET, second_read="off", escalation_model="big/model", max_attempts=3)
GOOD = "# A page\n\nIt reads as the page does, every word of it in place."
LOOP = "the same words again " * 400


@dataclass
class ScriptedModel:
    """A model in this process that answers each call with the next of ``answers`` (a ProviderError is raised)."""

    answers: list[str | ProviderError]
    asked: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "scripted"

    def answering_model(self, requested: str) -> str:
        return requested

    async def transcribe(self, request: TranscriptionRequest, *, call_seconds: float) -> Transcription:
        self.asked.append(request.model)
        answer = self.answers.pop(0)
        if isinstance(answer, ProviderError):
            raise answer
        return Transcription(answer, "stop", request.model, 1000, 50, 0.002, f"gen-{len(self.asked)}", 0.1)

    async def aclose(self) -> None:
        """Nothing to release."""


@pytest.fixture(scope="module")
def renderer() -> Iterator[RenderPool]:
    pool = RenderPool(workers=1, memory_limit_mb=1024, timeout_seconds=60)
    yield pool
    pool.close()


@dataclass
class Setup:
    store: MemoryStore
    objects: ObjectStore
    renderer: RenderPool
    queue: QueueSpy = field(default_factory=QueueSpy)

    def transcriber(self, model: ScriptedModel) -> Transcriber:
        transcripts = TranscriptWriter(SETTINGS, self.store, self.objects)
        reader = SecondReader(lambda: self.renderer, language="en")
        parts = (self.queue, model, SourceCache(self.objects), self.renderer, transcripts, reader)
        return Transcriber(SETTINGS, self.store, *parts)

    def scanned_document(self) -> tuple[str, str]:
        """A one-page image (no text layer, so the model is asked): its document and job ids."""
        body = (CORPUS / "smile.png").read_bytes()
        self.objects.put_bytes(BUCKET, "uploads/scan.png", body, content_type="image/png")
        new = NewDocument(BUCKET, "uploads/scan.png", "", "", len(body), "small/model", escalation_model="big/model")
        created = self.store.create_document(new, kind="png", pages=[1])
        return created.document_id, created.job_ids[0]


@pytest.fixture
def setup(store: MemoryStore, objects: ObjectStore, renderer: RenderPool) -> Setup:
    return Setup(store, objects, renderer)


def _deliver(transcriber: Transcriber, *job_ids: str) -> list[PageResult]:
    """One SQS batch naming these jobs, each message transcribed in turn."""
    bodies = [json.dumps({"job_id": job_id}) for job_id in job_ids]
    batch = transcriber.batch(bodies, Deadline.after(600, TimePolicy.from_settings(SETTINGS)))

    async def run() -> list[PageResult]:
        return [await batch.transcribe(body) for body in bodies]

    return asyncio.run(run())


def test_a_page_answered_is_kept_with_its_call_and_its_document_written(setup: Setup) -> None:
    # Given a one-page document whose page the model answers well
    document_id, job_id = setup.scanned_document()
    model = ScriptedModel([GOOD])
    # When its message is delivered twice in one batch
    results = _deliver(setup.transcriber(model), job_id, job_id)
    # Then the page is completed once, by one call, and the finished document's transcript is written
    assert results == [PageResult.COMPLETED, PageResult.DUPLICATE] and model.asked == ["small/model"]
    [page] = setup.store.load_pages(document_id)
    assert page.text is not None and "every word of it in place" in page.text
    assert [a.outcome for a in setup.store.load_attempts(document_id)] == ["KEPT"]
    record = setup.store.get_document(document_id)
    assert record is not None and record.transcript_key == f"transcripts/{document_id}.md"
    assert "every word of it in place" in setup.objects.get_text(BUCKET, record.transcript_key)


def test_a_looping_answer_escalates_once_and_the_better_answer_is_kept(setup: Setup) -> None:
    document_id, job_id = setup.scanned_document()
    model = ScriptedModel([LOOP, GOOD])
    assert _deliver(setup.transcriber(model), job_id) == [PageResult.COMPLETED]
    assert model.asked == ["small/model", "big/model"]
    assert [a.outcome for a in setup.store.load_attempts(document_id)] == ["ESCALATED", "KEPT"]


def test_a_loop_the_escalation_repeats_fails_the_page_naming_it(setup: Setup) -> None:
    document_id, job_id = setup.scanned_document()
    assert _deliver(setup.transcriber(ScriptedModel([LOOP, LOOP])), job_id) == [PageResult.FAILED]
    [page] = setup.store.load_pages(document_id)
    assert page.error is not None and "repetition" in page.error
    assert [a.outcome for a in setup.store.load_attempts(document_id)] == ["ESCALATED", "REJECTED"]


def test_a_provider_outage_requeues_the_page_with_a_delay_and_a_refusal_fails_it(setup: Setup) -> None:
    document_id, job_id = setup.scanned_document()
    outage = ProviderError("HTTP 503 from the provider", retryable=True, status_code=503)
    assert _deliver(setup.transcriber(ScriptedModel([outage])), job_id) == [PageResult.REQUEUED]
    [page] = setup.store.load_pages(document_id)
    assert page.status.value == "QUEUED" and page.error is not None and "503" in page.error
    assert [m.job_id for m in setup.queue.sent] == [job_id]
    refusal = ProviderError("HTTP 400: the model does not take images", retryable=False, status_code=400)
    assert _deliver(setup.transcriber(ScriptedModel([refusal])), job_id) == [PageResult.FAILED]
    [page] = setup.store.load_pages(document_id)
    assert page.status.value == "FAILED" and "does not take images" in (page.error or "")
