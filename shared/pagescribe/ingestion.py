"""Upload: an object in the bucket becomes a document and one queued job per page."""

from __future__ import annotations

import hashlib
import logging
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote_plus

from aws_lambda_powertools.utilities.data_classes import S3Event

from pagescribe.aws import JobMessage, JobQueue, ObjectMissingError, ObjectStore
from pagescribe.domain import DocumentRecord, DocumentStatus, NewDocument
from pagescribe.outbox import send_committed
from pagescribe.settings import Settings
from pagescribe.sources.documents import DocumentInfo, InvalidDocumentError
from pagescribe.store.ports import Store
from pagescribe.tenancy import TENANT_ID

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadedObject:
    """An object named by an S3 ``ObjectCreated`` record, its key already URL-decoded."""

    bucket: str
    key: str
    size: int
    etag: str
    version_id: str | None


@dataclass(frozen=True)
class IngestResult:
    bucket: str
    key: str
    document_id: str | None
    status: str
    pages: int = 0
    messages_sent: int = 0
    error: str | None = None


def uploaded_objects(event: dict[str, Any]) -> list[UploadedObject]:
    """The objects an S3 ``ObjectCreated`` event names, their keys URL-decoded (S3 sends them encoded: a space is
    ``+``); a record that is not S3's is left out."""
    return [
        UploadedObject(
            bucket=record.s3.bucket.name,
            key=unquote_plus(record.s3.get_object.key),
            size=record.s3.get_object.size,
            etag=record.s3.get_object.etag,
            version_id=record.s3.get_object.version_id,
        )
        for record in S3Event(event).records
        if record.get("s3")
    ]


def _uuid(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def _selection_error(requested: tuple[int, ...] | None, page_count: int) -> str | None:
    missing = [p for p in requested or () if p > page_count]
    if not missing:
        return None
    return f"pages {', '.join(map(str, missing))} were requested but the document has {page_count} pages"


class Inspector(Protocol):
    """Opens a file to find its type and page count, where a bomb cannot take the caller down (the render pool)."""

    def inspect(self, path: Path, *, max_pages: int, max_image_pixels: int) -> DocumentInfo: ...


@dataclass(frozen=True)
class _Examined:
    new: NewDocument  # with the file's SHA-256 once it was read
    kind: str | None = None
    pages: list[int] = field(default_factory=list)
    page_count: int | None = None  # the file's own
    donor: str | None = None  # a finished document of the same bytes and request, whose pages are reused
    error: str | None = None  # why it can never be transcribed


class Ingestor:
    def __init__(
        self,
        settings: Settings,
        db: Store,
        objects: ObjectStore,
        queue: JobQueue,
        inspector: Inspector,
        finish: Callable[[str], object],
    ) -> None:
        self._settings = settings
        self._db = db
        self._objects = objects
        self._queue = queue
        self._inspector = inspector
        self._finish = finish  # writes a finished document's transcript (pagescribe.assembly)

    def ingest(self, obj: UploadedObject) -> IngestResult:
        """Record the object as a document with its page jobs, then enqueue them (after commit).

        Inputs that can never be transcribed end as a FAILED document with the reason; nothing is raised
        for them, so S3 does not retry a hopeless input. Infrastructure errors are raised: the event is
        retried and the document is recorded once."""
        return self._record(obj, failure=None)

    def reject(self, obj: UploadedObject, reason: str) -> IngestResult:
        """Record the object as a FAILED document with ``reason`` (an API document awaiting it ends FAILED), unless it
        is already recorded: the upload function gave up on it, and its user must see why."""
        return self._record(obj, failure=reason)

    def _record(self, obj: UploadedObject, *, failure: str | None) -> IngestResult:
        """The object as a document: FAILED with ``failure`` when given, else opened and counted (under the render
        pool's limits) and FAILED with what is wrong, or PROCESSING with its jobs enqueued after the commit."""
        if not obj.key.startswith(self._settings.upload_prefix):
            log.info("ignoring an object outside %s", self._settings.upload_prefix, extra={"key": obj.key})
            return IngestResult(obj.bucket, obj.key, None, "IGNORED")
        named = self._named_document(obj)
        pending = named if self._awaits(named, obj) else None
        new = self._new_document(obj, pending)
        existing = self._db.find_document(new)
        if existing is not None:
            log.info("duplicate S3 event: the object is already recorded", extra={"document_id": existing})
            return IngestResult(obj.bucket, obj.key, existing, "DUPLICATE")
        if named is not None and pending is None:
            return self._refused(obj, named)

        seen = self._examine(obj, new, pending, failure)
        new, kind, pages, donor, error = seen.new, seen.kind, seen.pages, seen.donor, seen.error
        created = self._db.create_document(
            new,
            kind=kind,
            pages=pages,
            source_page_count=seen.page_count,
            error=error,
            pending_id=pending.document_id if pending else None,
            donor_id=donor,
        )
        if created.duplicate:
            return IngestResult(obj.bucket, obj.key, created.document_id, "DUPLICATE")
        if error is not None:
            log.warning("document rejected: %s", error, extra={"document_id": created.document_id, "key": obj.key})
            return IngestResult(obj.bucket, obj.key, created.document_id, DocumentStatus.FAILED, error=error)
        if created.reused:
            log.info(
                "the same file was transcribed for the same request: its pages are reused, no model call",
                extra={"document_id": created.document_id, "reused_from": donor, "pages": len(pages)},
            )
            self._finish(created.document_id)
            return IngestResult(obj.bucket, obj.key, created.document_id, DocumentStatus.COMPLETED, len(pages), 0)

        messages = [
            JobMessage(job_id, created.document_id, page) for job_id, page in zip(created.job_ids, pages, strict=True)
        ]
        sent = send_committed(self._queue, self._db, messages)
        log.info(
            "document accepted",
            extra={
                "document_id": created.document_id,
                "key": obj.key,
                "kind": kind,
                "pages": len(pages),
                "messages_sent": len(sent),
            },
        )
        return IngestResult(obj.bucket, obj.key, created.document_id, DocumentStatus.PROCESSING, len(pages), len(sent))

    def _examine(
        self, obj: UploadedObject, new: NewDocument, pending: DocumentRecord | None, failure: str | None
    ) -> _Examined:
        """What the object is: opened and counted under the render pool's limits (unless ``failure`` says why it
        failed already), its pages as asked for, and a finished document of the same bytes to reuse; or why not."""
        requested = pending.requested_pages if pending else None
        error = failure or self._precheck(obj)
        if error is not None:
            return _Examined(new, error=error)
        try:
            kind, page_count, digest = self._inspect(obj, selected=requested is not None)
        except InvalidDocumentError as exc:
            return _Examined(new, error=exc.reason)
        except ObjectMissingError as exc:
            return _Examined(new, error=str(exc))
        pages = list(requested or range(1, page_count + 1))
        new = new._replace(sha256=digest)
        error = _selection_error(requested, page_count)
        reuse = error is None and (pending.reuse if pending else True)
        donor = self._db.find_reusable_document(new, pages) if reuse else None
        return _Examined(new, kind, pages, page_count, donor, error)

    def _new_document(self, obj: UploadedObject, pending: DocumentRecord | None) -> NewDocument:
        return NewDocument(
            tenant_id=pending.tenant_id if pending else self._tenant_of(obj),
            bucket=obj.bucket,
            object_key=obj.key,
            etag=obj.etag,
            version_id=obj.version_id or "",
            size_bytes=obj.size,
            model=pending.model if pending else self._settings.model,
            prompt=pending.prompt if pending else None,
            escalation_model=pending.escalation_model if pending else self._settings.escalation_model,
            chunks=pending.chunks if pending else self._settings.chunks,
            merge_tables=pending.merge_tables if pending else self._settings.merge_tables,
            furniture=pending.furniture if pending else self._settings.furniture,
        )

    def _named_document(self, obj: UploadedObject) -> DocumentRecord | None:
        """The API-created document whose prefix the object is under, if any: uploads/<tenant>/<document-id>/<name>
        (that tenant's document), or uploads/<document-id>/<name> as keys were before tenants."""
        segments = obj.key[len(self._settings.upload_prefix) :].split("/")
        if len(segments) >= 3 and (document_id := _uuid(segments[1])) is not None:
            document = self._db.get_document(document_id)
            if document is not None and document.tenant_id == segments[0]:
                return document
        if len(segments) >= 2 and (document_id := _uuid(segments[0])) is not None:
            return self._db.get_document(document_id)
        return None

    def _tenant_of(self, obj: UploadedObject) -> str:
        """The tenant of a file put straight into the bucket: the one its key names (uploads/<tenant>/...) when it
        exists, else DEFAULT_TENANT."""
        segments = obj.key[len(self._settings.upload_prefix) :].split("/")
        if len(segments) > 1 and TENANT_ID.fullmatch(segments[0]) and self._db.tenant_exists(segments[0]):
            return segments[0]
        self._db.ensure_tenant(self._settings.default_tenant)
        return self._settings.default_tenant

    @staticmethod
    def _awaits(document: DocumentRecord | None, obj: UploadedObject) -> bool:
        """The document is waiting for this very object: its presigned upload has not been used yet."""
        return (
            document is not None
            and document.status is DocumentStatus.AWAITING_UPLOAD
            and (document.bucket, document.object_key) == (obj.bucket, obj.key)
        )

    def _refused(self, obj: UploadedObject, document: DocumentRecord) -> IngestResult:
        """An object under an API document's prefix that the document does not await: its upload URL was used
        already (or it never was the document's key, or the document has ended). It never becomes a document."""
        error = (
            f"{obj.key} is under the prefix of document {document.document_id}, which does not await it "
            f"({document.status.value}): a presigned upload makes one document, once"
        )
        log.warning("upload refused: %s", error, extra={"document_id": document.document_id, "key": obj.key})
        return IngestResult(obj.bucket, obj.key, document.document_id, "REFUSED", error=error)

    def _precheck(self, obj: UploadedObject) -> str | None:
        if obj.size == 0:
            return "the file is empty (0 bytes)"
        if obj.size > self._settings.max_upload_bytes:
            return (
                f"the file is {_megabytes(obj.size)} ({obj.size} bytes); the limit is "
                f"MAX_UPLOAD_BYTES={self._settings.max_upload_bytes} ({_megabytes(self._settings.max_upload_bytes)})"
            )
        return None

    def _inspect(self, obj: UploadedObject, *, selected: bool) -> tuple[str, int, bytes]:
        """The file's kind, page count and SHA-256."""
        # With a page selection (checked against MAX_PAGES when it was made), the document may be longer.
        max_pages = sys.maxsize if selected else self._settings.max_pages
        with tempfile.TemporaryDirectory(prefix="pagescribe-upload-") as scratch:
            path = Path(scratch) / "source"
            self._objects.download(obj.bucket, obj.key, path, version_id=obj.version_id, etag=obj.etag or None)
            with path.open("rb") as source:
                digest = hashlib.file_digest(source, "sha256").digest()
            info = self._inspector.inspect(path, max_pages=max_pages, max_image_pixels=self._settings.max_image_pixels)
        return info.kind.value, info.page_count, digest
