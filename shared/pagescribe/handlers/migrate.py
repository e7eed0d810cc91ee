"""Migrate function: a CloudFormation custom resource that applies the schema migrations on `sam deploy`."""

from __future__ import annotations

from typing import Any

import httpx  # noqa: F401 - every invocation answers CloudFormation with it: loaded at cold start
import psycopg  # noqa: F401 - the driver of the migration's engine: loaded at cold start
from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.data_classes import CloudFormationCustomResourceEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from pagescribe.aws import respond_to_cloudformation
from pagescribe.migrate import run_migration_resource, upgrade_through_data_api, upgrade_when_reachable
from pagescribe.runtime import get_runtime
from pagescribe.settings import get_settings
from pagescribe.store.postgres import DataApiDatabase

get_settings()  # validate the configuration at cold start
logger = Logger()


def _upgrade() -> None:
    """Through the Data API in the data-api profile, on a psycopg connection otherwise."""
    runtime = get_runtime()
    if isinstance(runtime.db, DataApiDatabase):
        upgrade_through_data_api(runtime.db.api)
    else:
        upgrade_when_reachable(runtime.database_url)


@logger.inject_lambda_context
@event_source(data_class=CloudFormationCustomResourceEvent)
def handler(event: CloudFormationCustomResourceEvent, context: LambdaContext) -> dict[str, Any]:
    status, reason, physical_id = run_migration_resource(
        event.request_type, _upgrade, physical_id=event.physical_resource_id
    )
    body = {
        "Status": status,
        "Reason": f"{reason} (log stream {context.log_stream_name})",
        "PhysicalResourceId": physical_id,
        "StackId": event.stack_id,
        "RequestId": event.request_id,
        "LogicalResourceId": event.logical_resource_id,
    }
    respond_to_cloudformation(event.response_url, body)
    return body
