"""The review page and its files (GET /review, /review/<name>): no API key, they carry no data; the user types the
key into the page, which calls the rest of the API from the browser."""

from __future__ import annotations

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from pagescribe.runtime import get_runtime
from pagescribe.service import Refused
from pagescribe.webpage import Asset, asset, page, security_headers

router = APIGatewayRouter()  # type: ignore[no-untyped-call]  # Powertools' __init__ is unannotated


def _review_response(served: Asset) -> Response[str]:
    headers = {**security_headers(get_runtime().bucket_origin), "Cache-Control": served.cache_control}
    return Response(status_code=200, content_type=served.content_type, body=served.body, headers=headers)


@router.get("/review", include_in_schema=False)
def review_page() -> Response[str]:
    """The review page."""
    return _review_response(page())


@router.get("/review/<name>", include_in_schema=False)
def review_asset(name: str) -> Response[str]:
    """One of the page's files, from a fixed allow-list (pagescribe.webpage)."""
    served = asset(name)
    if served is None:
        raise Refused.not_found("no such file")
    return _review_response(served)
