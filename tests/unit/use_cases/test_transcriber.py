"""The transcriber on the in-memory store: a page from its claim to its fenced result, with a scripted model in this
process, the real render processes, and S3 through moto in process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pagescribe.assembly import TranscriptWriter
from pagescribe.aws import ObjectStore
from pagescribe.domain import LOOP_CUT, ClaimedJob, NewDocument, PageResult, RateBucket, RateGrant, SpendVerdict
from pagescribe.grounding import PageText
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
HANG = 300  # seconds: a delivery still at work after this is stuck (a page waiting for one that waits for it)


@dataclass(frozen=True)
class Streamed:
    """An answer streamed as the adapter reads one: watched with the request's loop check every 64 characters, and cut
    (LOOP_CUT, no usage: it comes last) at the first loop it finds."""

    text: str

    def read(self, request: TranscriptionRequest, number: int) -> Transcription:
        for end in range(64, len(self.text) + 64, 64):
            received = self.text[:end]
            if request.loop_check is not None and request.loop_check(received):
                return Transcription(received, LOOP_CUT, request.model, None, len(received.split()), None, None, 0.1)
        return Transcription(self.text, "stop", request.model, 1000, 50, 0.002, f"gen-{number}", 0.1)


@dataclass
class ScriptedModel:
    """A model in this process that answers each call with the next of ``answers`` (a ProviderError is raised)."""

    answers: list[str | Streamed | ProviderError]
    asked: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "scripted"

    def answering_model(self, requested: str) -> str:
        return requested

    def serving(self, model: str) -> str:
        return self.name

    async def transcribe(self, request: TranscriptionRequest, *, call_seconds: float) -> Transcription:
        self.asked.append(request.model)
        answer = self.answers.pop(0)
        if isinstance(answer, ProviderError):
            raise answer
        if isinstance(answer, Streamed):
            return answer.read(request, len(self.asked))
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

    def transcriber(self, model: ScriptedModel, settings: Settings = SETTINGS) -> Transcriber:
        transcripts = TranscriptWriter(settings, self.store, self.objects)
        reader = SecondReader(lambda: self.renderer, language="en")
        parts = (self.queue, model, SourceCache(self.objects), self.renderer, transcripts, reader)
        return Transcriber(settings, self.store, *parts)

    def scanned_document(self, key: str = "uploads/scan.png") -> tuple[str, str]:
        """A one-page image (no text layer, so the model is asked): its document and job ids."""
        body = (CORPUS / "smile.png").read_bytes()
        self.objects.put_bytes(BUCKET, key, body, content_type="image/png")
        new = NewDocument(BUCKET, key, "", "", len(body), "small/model", escalation_model="big/model")
        created = self.store.create_document(new, kind="png", pages=[1])
        return created.document_id, created.job_ids[0]


@pytest.fixture
def setup(store: MemoryStore, objects: ObjectStore, renderer: RenderPool) -> Setup:
    return Setup(store, objects, renderer)


class GateSpy(MemoryStore):
    """The in-memory store, noting how many pages each pass of the cost gate and of the rate governor took."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[int] = []
        self.takes: list[int] = []
        self.settles: list[int] = []

    def admit_spends(
        self, jobs: Sequence[ClaimedJob], model: str, *, daily_budget_usd: float | None, max_output_tokens: int
    ) -> list[SpendVerdict]:
        self.gates.append(len(jobs))
        return super().admit_spends(jobs, model, daily_budget_usd=daily_budget_usd, max_output_tokens=max_output_tokens)

    def take_rate_slots(
        self, bucket: RateBucket, model: str, *, prepaid: Sequence[bool], max_wait: float
    ) -> list[RateGrant]:
        self.takes.append(len(prepaid))
        return super().take_rate_slots(bucket, model, prepaid=prepaid, max_wait=max_wait)

    def settle_rate_tokens(self, bucket: RateBucket, model: str, *, calls: Sequence[tuple[float, int]]) -> None:
        self.settles.append(len(calls))
        super().settle_rate_tokens(bucket, model, calls=calls)


def _deliver_at_once(transcriber: Transcriber, *job_ids: str) -> list[PageResult]:
    """One SQS batch naming these jobs, its messages transcribed at once, as the handler's batch processor does."""
    bodies = [json.dumps({"job_id": job_id}) for job_id in job_ids]
    batch = transcriber.batch(bodies, Deadline.after(600, TimePolicy.from_settings(SETTINGS)))

    async def run() -> list[PageResult]:
        return list(await asyncio.gather(*(batch.transcribe(body) for body in bodies)))

    return asyncio.run(asyncio.wait_for(run(), HANG))


def _deliver(transcriber: Transcriber, *job_ids: str) -> list[PageResult]:
    """One SQS batch naming these jobs, each message transcribed in turn."""
    bodies = [json.dumps({"job_id": job_id}) for job_id in job_ids]
    batch = transcriber.batch(bodies, Deadline.after(600, TimePolicy.from_settings(SETTINGS)))

    async def run() -> list[PageResult]:
        return [await batch.transcribe(body) for body in bodies]

    return asyncio.run(asyncio.wait_for(run(), HANG))


def test_the_pages_of_a_document_that_reach_the_gates_together_pass_each_at_once(
    objects: ObjectStore, renderer: RenderPool
) -> None:
    # Given a tenant with a daily budget, a rate limit, a priced call of the model and a four-page PDF of the tenant's
    store = GateSpy()
    setup = Setup(store, objects, renderer)
    assert store.set_daily_budget("default", 10.0)
    _, earlier = setup.scanned_document()
    # ... answers the checks let through as they are (they are not the pages' own words)
    relaxed = SETTINGS.model_copy(
        update={
            "flag_ungrounded_threshold": 1,
            "flag_ungrounded_block_chars": 0,
            "flag_missed_text_threshold": 1,
            "rate_limit_rpm": 600,
            "rate_limit_tpm": 6_000_000,
            "rate_limit_burst": 10,
        }
    )
    model = ScriptedModel([GOOD] * 5)
    transcriber = setup.transcriber(model, relaxed)
    assert _deliver(transcriber, earlier) == [PageResult.COMPLETED]
    body = (CORPUS / "pdflatex-4-pages.pdf").read_bytes()
    objects.put_bytes(BUCKET, "uploads/four.pdf", body, content_type="application/pdf")
    new = NewDocument(BUCKET, "uploads/four.pdf", "", "", len(body), "small/model")
    created = store.create_document(new, kind="pdf", pages=[1, 2, 3, 4])

    # When the four pages' messages come in one batch and are transcribed at once
    results = _deliver_at_once(transcriber, *created.job_ids)

    # Then the four pages passed the cost gate in one pass, took their slots of the rate governor in one and had their
    # calls' tokens settled in one once the batch was done (the earlier page each in one of its own), and each went
    # on to its call and was completed
    assert store.gates == [1, 4] and store.takes == [1, 4] and store.settles == [1, 4]
    assert results == [PageResult.COMPLETED] * 4 and len(model.asked) == 5
    day = store.tenant_day("default")
    assert day is not None and day.calls == 5


@dataclass
class SignallingModel(ScriptedModel):
    """A scripted model that says when it was first asked."""

    was_asked: asyncio.Event = field(default_factory=asyncio.Event)

    async def transcribe(self, request: TranscriptionRequest, *, call_seconds: float) -> Transcription:
        self.was_asked.set()
        return await super().transcribe(request, call_seconds=call_seconds)


class WordsOnceAsked(RenderPool):
    """A render pool that places a page's words only once the model was asked for the page (a transcriber that waited
    for the words before its call would wait for ever: the wait gives up after a minute, failing the page)."""

    def __init__(self, asked: asyncio.Event) -> None:
        super().__init__(workers=1, memory_limit_mb=1024, timeout_seconds=60)
        self._asked = asked
        self.placed: list[int] = []

    async def words(self, path: Path, page_number: int, *, dpi: int, max_long_edge: int) -> PageText:
        await asyncio.wait_for(self._asked.wait(), timeout=60)
        self.placed.append(page_number)
        return await super().words(path, page_number, dpi=dpi, max_long_edge=max_long_edge)


def test_a_page_with_a_text_layer_rendered_at_its_claim_is_asked_before_its_words_are_placed_and_grounded_to_them(
    store: MemoryStore, objects: ObjectStore
) -> None:
    # Given a PDF page with a text layer, a model, and a render pool that places the page's words only once the model
    # was asked (the answer is not the page's text: the checks let it through as it is)
    model = SignallingModel([GOOD])
    pool = WordsOnceAsked(model.was_asked)
    relaxed = SETTINGS.model_copy(
        update={"flag_ungrounded_threshold": 1, "flag_ungrounded_block_chars": 0, "flag_missed_text_threshold": 1}
    )
    try:
        transcriber = Setup(store, objects, pool).transcriber(model, relaxed)
        body = (CORPUS / "pdflatex-4-pages.pdf").read_bytes()
        objects.put_bytes(BUCKET, "uploads/four.pdf", body, content_type="application/pdf")
        new = NewDocument(BUCKET, "uploads/four.pdf", "", "", len(body), "small/model")
        created = store.create_document(new, kind="pdf", pages=[2])

        # When its message is delivered
        results = _deliver(transcriber, *created.job_ids)
    finally:
        pool.close()

    # Then the page was asked, its words were placed meanwhile, and its answer was grounded to them
    assert results == [PageResult.COMPLETED] and model.asked == ["small/model"] and pool.placed == [2]
    [page] = store.load_pages(created.document_id)
    assert page.grounding is not None and page.grounding["source"] == "text_layer"


class SettleFails(MemoryStore):
    """The in-memory store, its rate bucket unwritable when calls are settled (the database went away meanwhile)."""

    def settle_rate_tokens(self, bucket: RateBucket, model: str, *, calls: Sequence[tuple[float, int]]) -> None:
        raise ConnectionError("the database went away")


def test_a_batch_whose_calls_cannot_be_settled_still_answers_for_its_pages(
    objects: ObjectStore, renderer: RenderPool
) -> None:
    # Given a token limit, and a store whose rate bucket cannot be written when the batch's calls are settled
    store = SettleFails()
    setup = Setup(store, objects, renderer)
    _, job_id = setup.scanned_document()
    limited = SETTINGS.model_copy(update={"rate_limit_rpm": 600, "rate_limit_tpm": 6_000_000})
    # When the page's message is delivered and answered
    results = _deliver(setup.transcriber(ScriptedModel([GOOD]), limited), job_id)
    # Then the page is completed and its message answered as such: the settle's failure is logged, not the page's
    assert results == [PageResult.COMPLETED]


class NotedImages(MemoryStore):
    """The in-memory store, noting the statements that note a page's image on their own."""

    def __init__(self) -> None:
        super().__init__()
        self.noted_alone: list[str] = []

    def keep_page_image(self, job: ClaimedJob, image_key: str) -> None:
        self.noted_alone.append(image_key)
        super().keep_page_image(job, image_key)


def test_a_pages_image_is_noted_by_the_write_that_ends_it_or_alone_when_it_goes_back_to_the_queue(
    objects: ObjectStore, renderer: RenderPool
) -> None:
    # Given two one-page images, and a model that answers the first and fails the second with a retryable error
    store = NotedImages()
    setup = Setup(store, objects, renderer)
    answered, first = setup.scanned_document("uploads/first.png")
    requeued, second = setup.scanned_document("uploads/second.png")
    transcriber = setup.transcriber(ScriptedModel([GOOD, ProviderError("the provider is down", retryable=True)]))
    # When each page's message is delivered
    results = _deliver(transcriber, first) + _deliver(transcriber, second)
    # Then the answered page's image was noted by its completion, and the requeued page's by a statement of its own
    assert results == [PageResult.COMPLETED, PageResult.REQUEUED]
    images = [store.page_image(document_id, 1) for document_id in (answered, requeued)]
    keys = [image.image_key if image else None for image in images]
    assert keys == [f"transcripts/{answered}/pages/0001.jpg", f"transcripts/{requeued}/pages/0001.jpg"]
    assert store.noted_alone == [keys[1]]


@dataclass
class SaysSent(ScriptedModel):
    """A scripted model that says each request is on its way, as the OpenAI-compatible adapter does, notes when it was
    asked in ``events``, and answers once it was asked for every one of its answers (as a model's answers come long
    after the requests)."""

    events: list[str] = field(default_factory=list)
    all_asked: asyncio.Event = field(default_factory=asyncio.Event)

    async def transcribe(self, request: TranscriptionRequest, *, call_seconds: float) -> Transcription:
        self.events.append(f"asked {request.page_number}")
        if request.on_sent is not None:
            request.on_sent()
        if sum(event.startswith("asked") for event in self.events) == len(self.answers) + len(self.asked):
            self.all_asked.set()
        await self.all_asked.wait()
        return await super().transcribe(request, call_seconds=call_seconds)


class NotedPuts(ObjectStore):
    """S3 through moto, noting in ``events`` each page image as its storing starts."""

    def __init__(self, objects: ObjectStore, events: list[str]) -> None:
        super().__init__(objects._client)
        self._events = events

    def put_bytes(self, bucket: str, key: str, body: bytes, *, content_type: str) -> None:
        if "/pages/" in key:
            self._events.append("stored")
        super().put_bytes(bucket, key, body, content_type=content_type)


def test_a_batchs_page_images_are_stored_once_every_page_has_sent_its_call(
    store: MemoryStore, objects: ObjectStore, renderer: RenderPool
) -> None:
    # Given three one-page images in one batch, rendered one after another by one render process, and a model that
    # says each request is on its way
    model = SaysSent([GOOD, GOOD, GOOD])
    setup = Setup(store, NotedPuts(objects, model.events), renderer)
    jobs = [setup.scanned_document(f"uploads/page-{n}.png")[1] for n in range(3)]
    # When the batch is delivered, its pages at work at once
    results = _deliver_at_once(setup.transcriber(model), *jobs)
    # Then every page was asked before any image was stored (the first page's, rendered first, waited for the last
    # page's call), and every image was stored
    assert results == [PageResult.COMPLETED] * 3
    assert [event.split()[0] for event in model.events] == ["asked"] * 3 + ["stored"] * 3


def test_a_page_whose_call_is_over_stores_its_image_without_waiting_for_the_pages_after_it(
    store: MemoryStore, objects: ObjectStore, renderer: RenderPool
) -> None:
    # Given two one-page images in one batch, and a model that never says a request is on its way (as a provider may)
    setup = Setup(store, objects, renderer)
    documents, jobs = zip(*(setup.scanned_document(f"uploads/turn-{n}.png") for n in range(2)), strict=True)
    # When the batch's messages are transcribed one after another (the second waits for the first to end, as pages
    # beyond PAGE_CONCURRENCY wait for a free place)
    results = _deliver(setup.transcriber(ScriptedModel([GOOD, GOOD])), *jobs)
    # Then each page stored its image and ended: the first did not wait for the second's call
    assert results == [PageResult.COMPLETED] * 2
    images = [store.page_image(document_id, 1) for document_id in documents]
    assert [image.image_key if image else None for image in images] == [
        f"transcripts/{document_id}/pages/0001.jpg" for document_id in documents
    ]


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


def test_a_loop_cut_as_it_streams_is_recorded_cut_priced_at_the_calls_gone_by_and_escalated(setup: Setup) -> None:
    # Given a page the model answered whole earlier, at a cost it reported, and a model now looping on the next page
    earlier, earlier_job = setup.scanned_document()
    looping, looping_job = setup.scanned_document("uploads/looping.png")
    model = ScriptedModel([GOOD, Streamed(LOOP), GOOD])
    transcriber = setup.transcriber(model)
    assert _deliver(transcriber, earlier_job) == [PageResult.COMPLETED]
    # When the looping page is transcribed
    assert _deliver(transcriber, looping_job) == [PageResult.COMPLETED]
    # Then its call was cut at the loop's start, recorded as cut and priced at the earlier call's price per token, and
    # the page escalated to the answer kept
    assert model.asked == ["small/model", "small/model", "big/model"]
    cut, kept = setup.store.load_attempts(looping)
    assert (cut.outcome, cut.finish_reason, kept.outcome) == ("LOOP_CUT", LOOP_CUT, "KEPT")
    assert cut.completion_tokens is not None and cut.completion_tokens < len(LOOP.split()) // 10
    assert cut.cost_estimated and cut.prompt_tokens == 1000 and cut.cost is not None
    assert cut.cost == pytest.approx(0.002 / 1050 * (1000 + cut.completion_tokens))
    assert setup.store.spend(looping).cost == pytest.approx(cut.cost + 0.002)
    assert [a.outcome for a in setup.store.load_attempts(earlier)] == ["KEPT"]


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
