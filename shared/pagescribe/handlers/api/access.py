"""Who may call the API: the caller's tenant from its key, and the refusals made before a request is parsed."""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import content_types
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent

from pagescribe.runtime import get_runtime
from pagescribe.tenancy import KeyRefused

MAX_BODY_BYTES = 64 * 1024
UNAUTHENTICATED_PATHS = {"/health", "/review"}
REVIEW_PREFIX = "/review/"  # the review page's files: one path segment after it, from a fixed allow-list


def authenticate(raw_event: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """Before any parsing or validation: the refusal of an oversized body or a request whose key names no caller,
    else the caller's tenant (None on the unauthenticated paths).

    API Gateway checks the key in front (usage plan); this finds the key's tenant (API_KEY is the default tenant's,
    other keys are looked up hashed in PostgreSQL and remembered briefly: pagescribe.tenancy), so a local run is
    protected the same way and every read is the caller's own."""
    event = APIGatewayProxyEvent(raw_event)
    refusal: tuple[HTTPStatus, str] | None = None
    tenant: str | None = None
    if not _unauthenticated(event.path):
        given = event.headers.get("x-api-key") or event.headers.get("X-Api-Key") or None
        try:
            tenant = get_runtime().keyring.tenant_for(given)
        except KeyRefused as exc:
            refusal = (HTTPStatus.UNAUTHORIZED if exc.missing else HTTPStatus.FORBIDDEN), str(exc)
    if refusal is None and len((event.body or "").encode()) > MAX_BODY_BYTES:
        refusal = HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request body exceeds {MAX_BODY_BYTES} bytes"
    if refusal is None and event.body and _holds_an_unparseable_number(event.body):
        refusal = HTTPStatus.UNPROCESSABLE_ENTITY, "invalid request: body: a number in it has too many digits"
    if refusal is None:
        return None, tenant
    return {
        "statusCode": int(refusal[0]),
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": json.dumps({"message": refusal[1]}),
        "isBase64Encoded": False,
    }, None


_LONG_DIGITS = re.compile(r"\d{4301}")  # more digits than Python converts to an int (sys.get_int_max_str_digits)


def _holds_an_unparseable_number(body: str) -> bool:
    """Does the body parse as JSON but for an integer longer than Python converts (4,300 digits)? The validation
    that follows would fail on it with a ValueError that is not a JSON error, as a 500. Only a body with such a run
    of digits is parsed here: every other body is parsed once, by the validation."""
    if not _LONG_DIGITS.search(body):
        return False
    try:
        json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return False  # malformed, or nested too deep: the validation refuses it, saying so
    except ValueError:
        return True
    return False


def _unauthenticated(path: str) -> bool:
    """The health check and the review page's files: they carry no data."""
    if path in UNAUTHENTICATED_PATHS:
        return True
    name = path.removeprefix(REVIEW_PREFIX)
    return name != path and bool(name) and "/" not in name


def gate(raw_event: dict[str, Any]) -> dict[str, Any] | None:
    """The refusal of the request (``pagescribe serve`` asks before it reads a request's body), or None."""
    return authenticate(raw_event)[0]
