"""What one execution environment builds once and reuses on every warm invocation.

The settings are validated on first use (cold start). The database engine, the boto3 clients, the provider
client with its connection pool and the event loop that client belongs to are built lazily and kept for
the life of the environment; SIGTERM (Lambda's shutdown signal) closes them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
from collections.abc import Coroutine
from functools import cached_property
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType

from pagescribe.aws import (
    FailedInvocations,
    JobQueue,
    ObjectStore,
    rds_data_client,
    read_secret,
    read_secure_parameter,
    s3_client,
    sqs_client,
)
from pagescribe.settings import ConfigurationError, Settings, database_url_from_secret, get_settings
from pagescribe.timepolicy import Deadline, TimePolicy

# Each function builds only the parts it uses, so each part's module is imported where it is built: the sweeper
# does not load the API's service or the renderer. A function imports the modules it always needs at cold start
# through its own handler module.
if TYPE_CHECKING:
    from pagescribe.assembly import TranscriptWriter
    from pagescribe.batchlane import BatchLane
    from pagescribe.callbacks import CallbackNotifier
    from pagescribe.ingestion import Ingestor
    from pagescribe.providers.base import TranscriptionProvider
    from pagescribe.rendering import RenderPool
    from pagescribe.secondread import SecondReader
    from pagescribe.service import DocumentService
    from pagescribe.store.postgres import Database
    from pagescribe.sweeping import Sweeper
    from pagescribe.tenancy import KeyRing
    from pagescribe.transcription.sourcecache import SourceCache
    from pagescribe.transcription.transcriber import Transcriber

log = logging.getLogger(__name__)

# SECOND_READ=auto: the second read runs below the function's own work, on the CPU that would sit idle. With always,
# every page waits for its read, which is then part of the page's work: it runs at the function's own priority, as
# any other work on the machine could starve it past the page's deadline (a laptop's, a CI machine's: a first read of
# a small scan took 62 s at nice 10 beside four busy processes on two cores, 8 s at the function's priority).
READ_NICENESS = 10

T = TypeVar("T")


class WarmLoopBatchProcessor(AsyncBatchProcessor):
    """Powertools' async batch processor, run on the environment's one long-lived event loop.

    The stock processor uses ``asyncio.run`` outside Lambda, and a fresh loop per batch would break the
    pooled ``httpx.AsyncClient``, which belongs to the loop it first ran on."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(EventType.SQS, raise_on_entire_batch_failure=False)
        self._runtime = runtime

    def async_process(self) -> list[tuple[Any, ...]]:
        async def process_all() -> list[tuple[Any, ...]]:
            return list(await asyncio.gather(*(self._async_process_record(r) for r in self.records)))

        return self._runtime.run(process_all())


class Runtime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    @cached_property
    def time_policy(self) -> TimePolicy:
        return TimePolicy.from_settings(self.settings)

    def deadline(self, seconds_left: float) -> Deadline:
        """The invocation's deadline, ``seconds_left`` from now (the Lambda context's remaining time): one per
        invocation, passed to everything that times its work."""
        return Deadline.after(seconds_left, self.time_policy)

    @cached_property
    def database_url(self) -> str:
        settings = self.settings
        if settings.database_url:
            return settings.sqlalchemy_url
        if settings.database_secret_arn:
            return database_url_from_secret(read_secret(settings.database_secret_arn), host=settings.database_host)
        raise ConfigurationError("set DATABASE_URL or DATABASE_SECRET_ARN: there is no database to use")

    @cached_property
    def db(self) -> Database:
        if self.settings.database_access == "data-api":
            from pagescribe.store.postgres import DataApi, DataApiDatabase

            cluster_arn, secret_arn = self.settings.data_api_target()
            return DataApiDatabase(
                DataApi(
                    rds_data_client(),
                    cluster_arn=cluster_arn,
                    secret_arn=secret_arn,
                    database=self.settings.database_name,
                )
            )
        from pagescribe.store.postgres import Database, create_database_engine

        return Database(create_database_engine(self.database_url))

    @cached_property
    def objects(self) -> ObjectStore:
        return ObjectStore(s3_client())

    @cached_property
    def bucket_origin(self) -> str:
        """Where the documents bucket's presigned URLs point: the review page's Content-Security-Policy names it."""
        return self.objects.origin(self.settings.require("bucket_name"))

    @cached_property
    def queue(self) -> JobQueue:
        return JobQueue(sqs_client(), self.settings.require("queue_url"))

    @cached_property
    def provider(self) -> TranscriptionProvider:
        """PROVIDER's provider; with ESCALATION_PROVIDER another than PROVIDER, ESCALATION_MODEL asked on that one."""
        settings = self.settings
        primary = self._provider_of(settings.provider_kind)
        routed = settings.escalation_provider_kind
        if routed is None or not settings.escalation_model:
            return primary
        from pagescribe.providers.routing import RoutingProvider

        return RoutingProvider(primary, {settings.escalation_model: self._provider_of(routed)})

    def _provider_of(self, kind: str) -> TranscriptionProvider:
        settings = self.settings
        if kind == "offline":
            from pagescribe.providers.offline import RapidOcrProvider  # an optional extra

            return RapidOcrProvider(
                language=settings.ocr_language,
                page_numbers=settings.page_numbers,
                orient=settings.detect_orientation,
                threads=settings.ocr_threads,
            )
        retry_rate_limited = settings.rate_limit_rpm == 0  # with the governor on, a 429 pauses everyone instead
        if kind == "bedrock":
            from pagescribe.providers.bedrock import BedrockProvider
            from pagescribe.providers.bedrock_prices import parse_prices

            return BedrockProvider(
                client=self.bedrock_client,
                prices=parse_prices(settings.bedrock_prices),
                max_connections=settings.page_concurrency,
                retry_rate_limited=retry_rate_limited,
                stream=settings.provider_stream != "off",
            )
        from pagescribe.providers.openai_compat import OpenAICompatibleProvider

        return OpenAICompatibleProvider(
            base_url=settings.provider_base_url,
            api_key=self.provider_key,
            max_connections=settings.page_concurrency,
            usage_accounting=settings.provider_usage_accounting,
            retry_rate_limited=retry_rate_limited,
            stream=settings.provider_stream,
            time=self.time_policy,
        )

    @cached_property
    def provider_key(self) -> str | None:
        settings = self.settings
        if settings.provider_api_key is not None:
            return settings.provider_api_key.get_secret_value()
        if settings.provider_api_key_parameter:
            return read_secure_parameter(settings.provider_api_key_parameter)
        return None

    @cached_property
    def batch_lane(self) -> BatchLane:
        """The sweeper's part of the batch lane, on the provider's batch API (BATCH_DIALECT at BATCH_BASE_URL)."""
        from pagescribe.batchlane import BatchLane
        from pagescribe.providers.batches import batch_api
        from pagescribe.transcription.outcomes import thresholds

        settings = self.settings
        api = batch_api(
            settings.batch_dialect,
            base_url=settings.batch_base_url or settings.provider_base_url,
            api_key=self.provider_key,
        )
        finish = self.transcripts.finish
        return BatchLane(settings, self.db, self.queue, self.objects, api, finish, thresholds(settings))

    @cached_property
    def bedrock_client(self) -> Any:
        """Bedrock's ``bedrock-runtime`` client, for the Bedrock provider. The local stack builds it before it points
        this process's AWS clients at moto, so that the models are called with the user's own AWS account."""
        from pagescribe.providers.bedrock import bedrock_client

        return bedrock_client(time=self.time_policy, max_connections=self.settings.page_concurrency)

    @cached_property
    def notifier(self) -> CallbackNotifier:
        from pagescribe.callbacks import CallbackNotifier

        settings = self.settings
        if settings.callback_secret is not None:
            secret: bytes | None = settings.callback_secret.get_secret_value().encode()
        elif settings.callback_secret_parameter:
            secret = read_secure_parameter(settings.callback_secret_parameter).encode()
        else:
            secret = None
        return CallbackNotifier(settings, self.db, secret)

    @cached_property
    def sources(self) -> SourceCache:
        from pagescribe.transcription.sourcecache import SourceCache

        return SourceCache(self.objects)

    @cached_property
    def transcripts(self) -> TranscriptWriter:
        from pagescribe.assembly import TranscriptWriter

        return TranscriptWriter(self.settings, self.db, self.objects)

    @cached_property
    def ingestor(self) -> Ingestor:
        from pagescribe.ingestion import Ingestor

        return Ingestor(self.settings, self.db, self.objects, self.queue, self.renderer, self.transcripts.finish)

    @cached_property
    def renderer(self) -> RenderPool:
        from pagescribe.rendering import RenderPool

        settings = self.settings
        return RenderPool(
            workers=settings.render_worker_count(),
            memory_limit_mb=settings.render_memory_limit_mb,
            timeout_seconds=self.time_policy.render_timeout,
        )

    @cached_property
    def transcriber(self) -> Transcriber:
        from pagescribe.transcription.transcriber import Transcriber

        built = (self.db, self.queue, self.provider, self.sources, self.renderer, self.transcripts, self.reader)
        return Transcriber(self.settings, *built)

    @cached_property
    def reader(self) -> SecondReader:
        """Second reads of pages, in a render process of their own (started on the first read): a read never holds
        up a page's render."""
        from pagescribe.secondread import SecondReader

        return SecondReader(lambda: self.reading_pool, language=self.settings.ocr_language)

    @cached_property
    def reading_pool(self) -> RenderPool:
        from pagescribe.rendering import RenderPool

        settings = self.settings
        return RenderPool(
            workers=1,
            memory_limit_mb=settings.second_read_memory_limit_mb,
            timeout_seconds=self.time_policy.render_timeout,
            niceness=0 if settings.second_read == "always" else READ_NICENESS,
        )

    @cached_property
    def documents(self) -> DocumentService:
        from pagescribe.service import DocumentService

        settings = self.settings
        signed = settings.callback_secret is not None or settings.callback_secret_parameter is not None
        return DocumentService(
            settings,
            self.db,
            self.objects,
            self.queue,
            lambda document_id: self.transcripts.rewrite(document_id),
            callbacks_signed=signed,
        )

    @cached_property
    def keyring(self) -> KeyRing:
        from pagescribe.tenancy import KeyRing

        return KeyRing(self.settings, self.db)

    @cached_property
    def sweeper(self) -> Sweeper:
        from pagescribe.sweeping import Sweeper

        failures = self.settings.upload_failures_queue_url
        failed_uploads = FailedInvocations(sqs_client(), failures) if failures else None
        return Sweeper(
            self.settings,
            self.db,
            self.queue,
            lambda document_id: self.transcripts.finish(document_id),  # the writer is built when a document finishes
            self.notifier,
            lambda: self.ingestor,
            failed_uploads,
            None if self.settings.uses_offline_provider else lambda: self.batch_lane,
        )

    @cached_property
    def batch_processor(self) -> WarmLoopBatchProcessor:
        return WarmLoopBatchProcessor(self)

    def close(self) -> None:
        """Release what this environment holds: provider connections, database pool, render processes,
        scratch files."""
        built = self.__dict__
        if "batch_lane" in built:
            self.batch_lane.close()
        if "provider" in built and not self.loop.is_running():
            self.run(self.provider.aclose())
        if "db" in built and hasattr(self.db, "engine"):
            self.db.engine.dispose()
        if "sources" in built:
            self.sources.close()
        if "renderer" in built:
            self.renderer.close()
        if "reading_pool" in built:
            self.reading_pool.close()
        if not self.loop.is_running():
            self.loop.close()


_lock = threading.Lock()
_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    """This environment's runtime, built on first use."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = Runtime(get_settings())
            _install_sigterm_handler()
        return _runtime


def freeze_what_init_loaded() -> None:
    """Take every object alive now (what a cold start loaded: modules, clients, settings, for as long as the
    environment lives) out of the garbage collector's walks. A collection of the oldest generation walks every object
    it tracks: with the function's libraries loaded, one that came during a batch stopped every thread of the
    pipeline benchmark for ~150 ms (10 ms after this). Garbage already among them (little, at import) is kept."""
    gc.freeze()


def shutdown_runtime() -> None:
    """Close and forget this environment's runtime (SIGTERM, or a local process that is stopping)."""
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.close()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    log.info("SIGTERM: closing the provider client and the database pool")
    shutdown_runtime()
    raise SystemExit(0)


def _install_sigterm_handler() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
