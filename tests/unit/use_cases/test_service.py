"""The document service (what the API and the CLI ask for) on the in-memory store: one way to refuse, and what
each operation leaves behind."""

from __future__ import annotations

from http import HTTPStatus

import boto3
import pytest
from pagescribe.aws import ObjectStore
from pagescribe.domain import DocumentStatus, JobStatus, NewDocument, PageOutcome
from pagescribe.service import DocumentService, NewUpload, Refused
from pagescribe.settings import Settings

from tests.support.memory_store import MemoryStore
from tests.unit.use_cases.conftest import QueueSpy

SETTINGS = Settings(bucket_name="bucket", max_document_retries=1, max_page_revisions=2)


def _service(store: MemoryStore, queue: QueueSpy | None = None) -> DocumentService:
    # presigning is computed here, with no request made: any credentials will do
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    return DocumentService(SETTINGS, store, ObjectStore(client), queue or QueueSpy(), lambda _: True, False)


def _refusal(call: object) -> Refused:
    assert callable(call)
    with pytest.raises(Refused) as refused:
        call()
    return refused.value


def _finished(store: MemoryStore, *, tenant: str = "default", failed: int = 0, pages: int = 2) -> str:
    """A finished document of ``pages`` pages, the last ``failed`` of them FAILED."""
    store.ensure_tenant(tenant)
    created = store.create_document(
        NewDocument("bucket", f"uploads/{tenant}/a.pdf", "e", "", 1, "m", tenant_id=tenant),
        kind="pdf",
        pages=range(1, pages + 1),
    )
    for number, job_id in enumerate(created.job_ids, start=1):
        [job] = store.claim_jobs([job_id], lease_seconds=60, max_attempts=3).claimed.values()
        if number > pages - failed:
            store.fail_job(job, "HTTP 500 three times")
        else:
            store.complete_job(job, PageOutcome(f"page {number}", "stop", 10, 5, 0.001, "m", "fake", "gen-1"))
    status = DocumentStatus.PARTIAL if failed else DocumentStatus.COMPLETED
    store.finish_document(created.document_id, status=status, error=None, transcript_key="t")
    return created.document_id


def test_a_new_upload_awaits_its_file_under_its_tenants_prefix(store: MemoryStore) -> None:
    store.ensure_tenant("acme")
    created = _service(store).create(NewUpload("report.pdf", "application/pdf", pages="1-2"), "acme")
    assert created.key == f"uploads/acme/{created.document_id}/report.pdf"
    assert created.key in created.upload_url and "Signature=" in created.upload_url
    record = store.get_document(created.document_id)
    assert record is not None and (record.status, record.tenant_id, record.requested_pages) == (
        DocumentStatus.AWAITING_UPLOAD, "acme", (1, 2),
    )  # fmt: skip


def test_an_idempotency_key_makes_one_document_and_refuses_another_request(store: MemoryStore) -> None:
    service = _service(store)
    upload = NewUpload("a.pdf", "application/pdf")
    first = service.create(upload, "default", idempotency_key="key-1")
    again = service.create(upload, "default", idempotency_key="key-1")
    assert again.document_id == first.document_id and len(store.state.documents) == 1
    refused = _refusal(
        lambda: service.create(NewUpload("b.pdf", "application/pdf"), "default", idempotency_key="key-1")
    )
    assert refused.code is HTTPStatus.UNPROCESSABLE_ENTITY and refused.fields == {"field": "Idempotency-Key"}


@pytest.mark.parametrize(
    ("upload", "field"),
    [
        (NewUpload("a.doc", "application/msword"), "content_type"),
        (NewUpload("a.pdf", "application/pdf", pages="3-1"), "pages"),
        (NewUpload("a.pdf", "application/pdf", callback_url="https://example.com/hook"), "callback_url"),
        (NewUpload("a.pdf", "application/pdf", model="not/allowed"), "model"),
    ],
)
def test_a_request_that_cannot_be_served_is_refused_naming_its_field(
    store: MemoryStore, upload: NewUpload, field: str
) -> None:
    refused = _refusal(lambda: _service(store).create(upload, "default"))
    assert (refused.code, refused.fields["field"]) == (HTTPStatus.UNPROCESSABLE_ENTITY, field)
    assert refused.body()["message"] == str(refused) and store.state.documents == {}


def test_another_tenants_document_is_not_found_as_an_unknown_one_is(store: MemoryStore) -> None:
    document_id = _finished(store, tenant="acme")
    service = _service(store)
    assert service.describe(document_id, "acme").summary.document_id == document_id
    for tenant, asked in (("default", document_id), ("acme", "not-a-document")):
        assert _refusal(lambda t=tenant, a=asked: service.describe(a, t)).code is HTTPStatus.NOT_FOUND


def test_failed_pages_are_retried_once_and_sent_after_the_commit(store: MemoryStore) -> None:
    # Given a finished document with one failed page of two
    document_id, queue = _finished(store, failed=1), QueueSpy()
    service = _service(store, queue)
    # When it is retried, then retried again
    assert service.retry(document_id, "default") == [2]
    # Then the page was queued afresh and its message sent; the second retry is past MAX_DOCUMENT_RETRIES=1
    assert [m.page_number for m in queue.sent] == [2]
    assert store.load_pages(document_id)[1].status is JobStatus.QUEUED
    refused = _refusal(lambda: service.retry(document_id, "default"))
    assert refused.code is HTTPStatus.TOO_MANY_REQUESTS and "MAX_DOCUMENT_RETRIES=1" in str(refused)


def test_a_document_without_failed_pages_has_nothing_to_retry(store: MemoryStore) -> None:
    document_id = _finished(store)
    assert _refusal(lambda: _service(store).retry(document_id, "default")).code is HTTPStatus.CONFLICT


def test_a_finished_page_is_corrected_up_to_its_revisions(store: MemoryStore) -> None:
    document_id = _finished(store)
    service = _service(store)
    assert [service.correct_page(document_id, 1, f"fix {n}", "default").revision for n in (1, 2)] == [1, 2]
    refused = _refusal(lambda: service.correct_page(document_id, 1, "fix 3", "default"))
    assert refused.code is HTTPStatus.TOO_MANY_REQUESTS
    assert _refusal(lambda: service.correct_page(document_id, 9, "x", "default")).code is HTTPStatus.NOT_FOUND
    assert store.load_pages(document_id)[0].current_text == "fix 2"


def test_a_page_still_being_read_is_not_rerun(store: MemoryStore) -> None:
    created = store.create_document(NewDocument("bucket", "uploads/b.pdf", "e", "", 1, "m"), kind="pdf", pages=[1])
    refused = _refusal(lambda: _service(store).rerun_page(created.document_id, 1, "default", model=None))
    assert refused.code is HTTPStatus.CONFLICT and "only a finished page is re-run" in str(refused)


def test_a_finished_page_is_rerun_and_sent(store: MemoryStore) -> None:
    document_id, queue = _finished(store), QueueSpy()
    assert _service(store, queue).rerun_page(document_id, 2, "default", model=None) == "m"  # the document's model
    [sent] = queue.sent
    assert (sent.document_id, sent.page_number) == (document_id, 2)
    record = store.get_document(document_id)
    assert record is not None and record.status is DocumentStatus.PROCESSING and record.finished_at is None


def test_a_listing_limit_out_of_range_is_refused(store: MemoryStore) -> None:
    refused = _refusal(lambda: _service(store).list_documents("default", limit=0, cursor=None))
    assert (refused.code, refused.fields) == (HTTPStatus.UNPROCESSABLE_ENTITY, {"field": "limit"})


@pytest.mark.parametrize("provider", ["offline", "bedrock"])
def test_the_batch_lane_is_refused_where_the_provider_has_no_batch_api(store: MemoryStore, provider: str) -> None:
    # Given a stack whose provider has no batch API the lane drives
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    settings = SETTINGS.model_copy(update={"provider": provider})
    service = DocumentService(settings, store, ObjectStore(client), QueueSpy(), lambda _: True, False)
    # When a document asks for the batch lane
    refused = _refusal(lambda: service.create(NewUpload("a.pdf", "application/pdf", lane="batch"), "default"))
    # Then it is refused naming the field and the provider, and nothing is recorded
    assert (refused.code, refused.fields["field"]) == (HTTPStatus.UNPROCESSABLE_ENTITY, "lane")
    assert f"PROVIDER={provider}" in str(refused) and store.state.documents == {}
