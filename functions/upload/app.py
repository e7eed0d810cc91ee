"""Upload function: S3 ObjectCreated events → one document and its page jobs each, enqueued after commit."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_plus

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.data_classes import S3Event, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext
from pagescribe.ingestion import UploadedObject
from pagescribe.runtime import get_runtime
from pagescribe.settings import get_settings

get_settings()  # validate the configuration at cold start
logger = Logger()


@logger.inject_lambda_context
@event_source(data_class=S3Event)
def handler(event: S3Event, context: LambdaContext) -> dict[str, Any]:
    ingestor = get_runtime().ingestor
    results = [
        ingestor.ingest(
            UploadedObject(
                bucket=record.s3.bucket.name,
                key=unquote_plus(record.s3.get_object.key),  # S3 event keys arrive URL-encoded
                size=record.s3.get_object.size,
                etag=record.s3.get_object.etag,
                version_id=record.s3.get_object.version_id,
            )
        )
        for record in event.records
    ]
    return {
        "documents": [
            {
                "document_id": r.document_id,
                "key": r.key,
                "status": r.status,
                "pages": r.pages,
                "messages_sent": r.messages_sent,
                "error": r.error,
            }
            for r in results
        ]
    }
