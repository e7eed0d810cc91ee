"""The api function (API Gateway proxy events): the caller's key checked and its tenant found, then the request routed.

The review page (GET /review) is served from here too; it calls the rest of the API from the browser."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from pagescribe.handlers.api.access import authenticate
from pagescribe.handlers.api.routes import app, logger


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    refused, tenant = authenticate(event)
    if refused is not None:
        return refused
    app.context.update(tenant=tenant)  # cleared by resolve() when it is done
    return app.resolve(event, context)
