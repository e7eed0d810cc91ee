"""Upload function: S3 ObjectCreated events → one document and its page jobs each, enqueued after commit."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from pagescribe.ingestion import uploaded_objects
from pagescribe.runtime import freeze_what_init_loaded, get_runtime
from pagescribe.settings import get_settings

get_settings()  # validate the configuration at cold start
get_runtime().renderer.prestart()  # the render worker that opens uploads starts during init, not on the first event
logger = Logger()
freeze_what_init_loaded()  # the last of init


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    ingestor = get_runtime().ingestor
    results = [ingestor.ingest(uploaded) for uploaded in uploaded_objects(event)]
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
