"""The API's routes on one resolver: create documents, poll status, fetch transcripts, retry failed pages, re-run or
correct one page; each refusal mapped to its HTTP answer; and the OpenAPI document generated from them."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Annotated, Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.models import APIKey, APIKeyIn
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponseContentModel, OpenAPIResponseContentSchema

from pagescribe.api_schemas import (
    CorrectionRequest,
    CorrectionResponse,
    CreateDocumentRequest,
    CreateDocumentResponse,
    DocumentList,
    DocumentStatusResponse,
    ErrorResponse,
    Estimate,
    ListedDocument,
    PageFigure,
    PageFiguresResponse,
    PageImageResponse,
    RerunRequest,
    RerunResponse,
    RetryResponse,
)
from pagescribe.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP
from pagescribe.handlers.api.review import router as review_router
from pagescribe.runtime import get_runtime
from pagescribe.service import (
    MAX_LIST_LIMIT,
    MAX_PAGE_NUMBER,
    ChunkBounds,
    NewUpload,
    Refused,
    TranscriptFormat,
)
from pagescribe.settings import get_settings

get_settings()  # validate the configuration at cold start
logger = Logger()
app = APIGatewayRestResolver(enable_validation=True)


def _error(code: HTTPStatus, body: dict[str, str]) -> Response[str]:
    return Response(status_code=code, content_type=content_types.APPLICATION_JSON, body=json.dumps(body))


def _refusal(refused: Refused) -> Response[str]:
    """Every refusal, the service's and the API's own, answered the one way: its status and its body."""
    return _error(refused.code, refused.body())


def _header(name: str) -> str | None:
    """The request's header of that name, however it is spelled."""
    return next((value for key, value in app.current_event.headers.items() if key.lower() == name.lower()), None)


def _tenant() -> str:
    return str(app.context["tenant"])


_ERROR_CONTENT: dict[str, OpenAPIResponseContentSchema | OpenAPIResponseContentModel] = {
    "application/json": {"model": ErrorResponse}
}
_NOT_FOUND: dict[int, Any] = {404: {"description": "No document has this id", "content": _ERROR_CONTENT}}


def _page_number(page: str) -> int:
    digits = page.lstrip("0")
    if not page.isascii() or not page.isdigit() or not digits:
        raise Refused(HTTPStatus.BAD_REQUEST, f"the page must be a page number (1, 2, ...), not {page[:40]!r}")
    if len(digits) > len(str(MAX_PAGE_NUMBER)) or int(digits) > MAX_PAGE_NUMBER:  # never int() of 4,301 digits
        shown = digits if len(digits) <= 20 else f"{digits[:20]}... ({len(digits)} digits)"
        message = f"the page number {shown} is over the largest, {MAX_PAGE_NUMBER}"
        raise Refused(HTTPStatus.UNPROCESSABLE_ENTITY, message)
    return int(digits)


@app.get("/health", summary="Liveness check (no API key needed)")
def health() -> dict[str, str]:
    return {"status": "ok"}


app.include_router(review_router)


@app.post(
    "/documents",
    status_code=201,
    summary="Create a document and get a presigned URL to PUT the file to",
    responses={
        201: {"description": "Created", "content": {"application/json": {"model": CreateDocumentResponse}}},
        422: {"description": "Invalid request", "content": _ERROR_CONTENT},
    },
)
def create_document(request: Annotated[CreateDocumentRequest, Body()]) -> CreateDocumentResponse:
    created = get_runtime().documents.create(
        NewUpload(
            filename=request.filename,
            content_type=request.content_type,
            pages=request.pages,
            model=request.model,
            escalation_model=request.escalation_model,
            prompt=request.prompt,
            callback_url=str(request.callback_url) if request.callback_url else None,
            reuse=request.reuse,
            max_cost_usd=request.max_cost_usd,
            second_read=request.second_read,
            chunks=request.chunks,
            merge_tables=request.merge_tables,
            furniture=request.furniture,
            profile=request.profile,
            lane=request.lane,
            deadline=request.deadline,
        ),
        _tenant(),
        idempotency_key=_header("Idempotency-Key"),
    )
    logger.info("document created", extra={"document_id": created.document_id, "key": created.key, "tenant": _tenant()})
    return CreateDocumentResponse(
        document_id=created.document_id,
        status="AWAITING_UPLOAD",
        upload_url=created.upload_url,
        upload_headers={"Content-Type": created.content_type},
        expires_at=created.expires_at,
        estimate=Estimate.model_validate(created.estimate),
    )


@app.get(
    "/documents",
    summary="The caller's tenant's documents, newest first, a page at a time",
    responses={
        200: {"description": "A page of documents", "content": {"application/json": {"model": DocumentList}}},
        422: {"description": "A limit out of range, or a cursor this API did not give", "content": _ERROR_CONTENT},
    },
)
def list_documents(
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = 20, cursor: Annotated[str | None, Query()] = None
) -> DocumentList:
    listed, next_cursor = get_runtime().documents.list_documents(_tenant(), limit=limit, cursor=cursor)
    return DocumentList(documents=[ListedDocument.model_validate(d._asdict()) for d in listed], next_cursor=next_cursor)


@app.get("/documents/<document_id>", summary="Status, progress, per-page errors, tokens and cost", responses=_NOT_FOUND)
def get_document(document_id: str) -> DocumentStatusResponse:
    described = get_runtime().documents.describe(document_id, _tenant())
    estimate = Estimate.model_validate(described.estimate.as_dict())
    return DocumentStatusResponse(**dict(described.summary), estimate=estimate)


@app.get(
    "/documents/<document_id>/transcript",
    summary="The transcript (markdown; JSON with ?format=json; chunks for retrieval with ?format=chunks); 409 while "
    "the document is not finished",
    description="?format=chunks cuts the JSON transcript into chunks for retrieval: sections cut at headings, "
    "packed to at most max_tokens (estimated without a tokenizer: a run of ASCII letters and digits counts one token "
    "per four characters, any other character that is not white space one), never cutting a sentence, a list item "
    "or a table row, the last whole units of a chunk (up to overlap tokens) carried into the next. Each chunk has a "
    "stable id (a UUID), its heading path, the pages it spans, its blocks with their boxes, and the document's and "
    "tenant's ids.",
    responses={
        200: {"description": "The transcript", "content": {"text/markdown": {}, "application/json": {}}},
        409: {"description": "Not finished", "content": _ERROR_CONTENT},
        **_NOT_FOUND,
    },
)
def get_transcript(
    document_id: str,
    format: Annotated[TranscriptFormat, Query()] = TranscriptFormat.MARKDOWN,
    max_tokens: Annotated[int, Query(description="chunks only: the bound of each chunk")] = DEFAULT_MAX_TOKENS,
    overlap: Annotated[int, Query(description="chunks only: tokens carried into the next chunk")] = DEFAULT_OVERLAP,
) -> Response[str]:
    bounds = ChunkBounds(max_tokens, overlap)
    body = get_runtime().documents.transcript(document_id, format, _tenant(), bounds)
    content_type = (
        "text/markdown; charset=utf-8" if format is TranscriptFormat.MARKDOWN else content_types.APPLICATION_JSON
    )
    return Response(status_code=200, content_type=content_type, body=body)


@app.get(
    "/documents/<document_id>/pages/<page>/image",
    summary="A short-lived link to the image a page was sent to the model as",
    responses={
        200: {"description": "The link", "content": {"application/json": {"model": PageImageResponse}}},
        400: {"description": "The page is not a page number", "content": _ERROR_CONTENT},
        404: {"description": "No document has this id, or the page has no image kept", "content": _ERROR_CONTENT},
    },
)
def get_page_image(document_id: str, page: str) -> PageImageResponse:
    number = _page_number(page)
    image = get_runtime().documents.page_image(document_id, number, _tenant())
    return PageImageResponse(document_id=document_id, page_number=number, url=image.url, expires_in=image.expires_in)


@app.get(
    "/documents/<document_id>/pages/<page>/figures",
    summary="Short-lived links to the figures kept from a page (cropped from its image, stored beside the transcript)",
    responses={
        200: {"description": "The links", "content": {"application/json": {"model": PageFiguresResponse}}},
        400: {"description": "The page is not a page number", "content": _ERROR_CONTENT},
        404: {"description": "No document has this id, or it has no such page", "content": _ERROR_CONTENT},
    },
)
def get_page_figures(document_id: str, page: str) -> PageFiguresResponse:
    number = _page_number(page)
    figures, expires_in = get_runtime().documents.page_figures(document_id, number, _tenant())
    return PageFiguresResponse(
        document_id=document_id,
        page_number=number,
        figures=[PageFigure.model_validate(figure) for figure in figures],
        expires_in=expires_in,
    )


@app.post(
    "/documents/<document_id>/pages/<page>/rerun",
    status_code=202,
    summary="Queue one finished page again, optionally on another model; its earlier attempts and costs are kept",
    responses={
        202: {"description": "Queued", "content": {"application/json": {"model": RerunResponse}}},
        400: {"description": "The page is not a page number", "content": _ERROR_CONTENT},
        404: {"description": "No document has this id, or it has no such page", "content": _ERROR_CONTENT},
        409: {
            "description": "The page is not finished (queued or being transcribed), or it failed on a render limit "
            "that is still set as it was",
            "content": _ERROR_CONTENT,
        },
        422: {"description": "A model that is not allowed", "content": _ERROR_CONTENT},
        429: {
            "description": "The document has used its retries (MAX_DOCUMENT_RETRIES: re-runs count), or the page its "
            "re-runs (MAX_PAGE_RERUNS)",
            "content": _ERROR_CONTENT,
        },
    },
)
def rerun_page(document_id: str, page: str, request: Annotated[RerunRequest, Body()]) -> RerunResponse:
    number = _page_number(page)
    model = get_runtime().documents.rerun_page(document_id, number, _tenant(), model=request.model)
    logger.info("page queued again", extra={"document_id": document_id, "page": number, "model": model})
    return RerunResponse(document_id=document_id, page_number=number, model=model)


@app.put(
    "/documents/<document_id>/pages/<page>/correction",
    summary="Save a person's text for one page of a finished document as its next revision; the model's answer is kept",
    responses={
        200: {
            "description": "Saved, and the transcript shows it",
            "content": {"application/json": {"model": CorrectionResponse}},
        },
        400: {"description": "The page is not a page number", "content": _ERROR_CONTENT},
        404: {"description": "No document has this id, or it has no such page", "content": _ERROR_CONTENT},
        409: {"description": "The document is not finished (e.g. a page is being re-run)", "content": _ERROR_CONTENT},
        422: {"description": 'A body that is not {"markdown": text}', "content": _ERROR_CONTENT},
        429: {"description": "The page has used its corrections (MAX_PAGE_REVISIONS)", "content": _ERROR_CONTENT},
    },
)
def correct_page(document_id: str, page: str, request: Annotated[CorrectionRequest, Body()]) -> CorrectionResponse:
    number = _page_number(page)
    saved = get_runtime().documents.correct_page(document_id, number, request.markdown, _tenant())
    return CorrectionResponse(
        document_id=document_id, page_number=number, revision=saved.revision, corrected_at=saved.corrected_at
    )


@app.post(
    "/documents/<document_id>/retry",
    status_code=202,
    summary="Requeue the FAILED pages of a document",
    responses={
        202: {"description": "Requeued", "content": {"application/json": {"model": RetryResponse}}},
        409: {"description": "No failed pages", "content": _ERROR_CONTENT},
        429: {
            "description": "The document has used its retries (MAX_DOCUMENT_RETRIES: re-runs of its pages count)",
            "content": _ERROR_CONTENT,
        },
        **_NOT_FOUND,
    },
)
def retry_document(document_id: str) -> RetryResponse:
    pages = get_runtime().documents.retry(document_id, _tenant())
    logger.info("failed pages requeued", extra={"document_id": document_id, "pages": pages})
    return RetryResponse(document_id=document_id, pages_requeued=pages)


@app.exception_handler(Refused)  # type: ignore[untyped-decorator]
def _refused(exc: Refused) -> Response[str]:
    return _refusal(exc)


@app.exception_handler(RequestValidationError)  # type: ignore[untyped-decorator]
def _invalid_request(exc: RequestValidationError) -> Response[str]:
    problems = [
        {"field": ".".join(str(part) for part in error["loc"][1:]) or "body", "message": error["msg"]}
        for error in exc.errors()
    ]
    summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
    return Response(
        status_code=HTTPStatus.UNPROCESSABLE_ENTITY,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps({"message": f"invalid request: {summary}", "field": problems[0]["field"], "errors": problems}),
    )


@app.not_found
def _no_route(exc: NotFoundError) -> Response[str]:
    # Registered so that the catch-all below does not turn an unknown route or method into a 500.
    return _refusal(Refused.not_found("no such route"))


@app.exception_handler(RecursionError)  # type: ignore[untyped-decorator]
def _too_deep(exc: RecursionError) -> Response[str]:
    # The JSON parser recurses per nesting level: "[[[[..." within the size limit must not be a 500.
    return _refusal(Refused.invalid("invalid request: the JSON body is nested too deeply", field="body"))


@app.exception_handler(Exception)  # type: ignore[untyped-decorator]
def _unexpected(exc: Exception) -> Response[str]:
    logger.exception("unexpected error")
    return _error(HTTPStatus.INTERNAL_SERVER_ERROR, {"message": "internal error; the request id is in the logs"})


def openapi_json() -> str:
    """The OpenAPI document of this API, generated from the handler's models (committed as docs/openapi.json)."""
    return app.get_openapi_json_schema(
        title="pagescribe",
        version="1.0.0",
        description="Documents in, faithful page-by-page markdown out. Upload files to the presigned URL.",
        security_schemes={"apiKey": APIKey.model_validate({"in": APIKeyIn.header, "name": "x-api-key"})},
        security=[{"apiKey": []}],
    )
