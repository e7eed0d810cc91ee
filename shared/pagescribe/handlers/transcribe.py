"""Transcribe function: SQS batches of page jobs, transcribed concurrently, with partial batch responses."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import async_process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSEvent, SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from pagescribe.domain import PageResult
from pagescribe.observability import publish_metrics
from pagescribe.providers import openai_compat  # the provider unless PROVIDER=offline: loaded at cold start
from pagescribe.runtime import freeze_what_init_loaded, get_runtime
from pagescribe.settings import get_settings

get_settings().check_model_call_time()  # validate the configuration at cold start
get_settings().check_render_memory()
get_settings().check_bedrock_prices()  # Bedrock reports tokens: a model without a price is refused here, not run free
# during init, warmed up: a batch's first renders wait neither for a worker's start nor for what it does first
get_runtime().renderer.prestart(get_runtime().renderer.workers, warm=True)
openai_compat.load_event_loop_network()  # nor its first model call for the HTTP client's event-loop machinery
logger = Logger()
freeze_what_init_loaded()  # the last of init


@publish_metrics
@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    runtime = get_runtime()
    deadline = runtime.deadline(context.get_remaining_time_in_millis() / 1000)
    batch = runtime.transcriber.batch([record.body for record in SQSEvent(event).records], deadline)

    async def record_handler(record: SQSRecord) -> PageResult:
        return await batch.transcribe(record.body)

    return dict(
        async_process_partial_response(
            event=event, record_handler=record_handler, processor=runtime.batch_processor, context=context
        )
    )
