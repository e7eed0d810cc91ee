"""The one configuration model, read from the environment and validated once at cold start."""

# No ``from __future__ import annotations``: pydantic would compile and evaluate every field's annotation from
# its string at import (cold start): about a tenth of the time building the model takes.

import json
import os
from functools import lru_cache
from typing import Any, Literal, get_args

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)
from sqlalchemy import URL

from pagescribe.chunking import DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP, MAX_MAX_TOKENS, MIN_MAX_TOKENS
from pagescribe.settings_environment import ScalarEnvironment

# The offline engine's recognition models by language: those that ship inside the rapidocr wheel (3.10: one). Others
# (RapidOCR's latin, cyrillic, arabic... models) are downloaded by RapidOCR at run time, which pagescribe never does.
OCR_LANGUAGES = {"ch": "PP-OCRv6_rec_small.onnx"}

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"
HANDLER_MEMORY_MB = 256  # the transcribe handler's own process: runtime, clients, a batch's images

DEFAULT_PROMPT = (
    "Transcribe this document page faithfully into Markdown. Keep the reading order, headings, lists, "
    "tables and emphasis. Write a table as a Markdown table, or as an HTML <table> with rowspan and colspan where "
    "a cell spans rows or columns. Transcribe every word exactly as written; do not summarise, "
    "translate, correct or add commentary. Describe figures briefly in square brackets. "
    "If the page has no text at all, answer exactly: (blank page)"
)
# The prompt of the clean profile: the page as a reader or a retrieval index wants it, not as it stands
CLEAN_PROMPT = (
    "Transcribe this document page into clean Markdown for reading and retrieval. Keep the reading order, headings, "
    "lists and emphasis. Leave out running headers, running footers and page numbers. Write every table as an HTML "
    "<table>, with rowspan and colspan where a cell spans rows or columns. Write mathematics as LaTeX: \\( ... \\) "
    "inline and $$ ... $$ for display. Transcribe every word exactly as written; do not summarise, translate, correct "
    "or add commentary. Describe figures briefly in square brackets. "
    "If the page has no text at all, answer exactly: (blank page)"
)


class ConfigurationError(ValueError):
    """The environment does not describe a working configuration; raised at cold start."""


class Settings(BaseSettings):
    """Every setting pagescribe reads, with its environment variable name (upper case)."""

    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    database_url: str | None = Field(
        default=None, description="PostgreSQL URL (postgresql://user:pass@host:port/db); psycopg 3 is used."
    )
    database_secret_arn: str | None = Field(
        default=None,
        description="Secrets Manager secret with the database connection (RDS JSON, {'url': …} or a URL); "
        "used when DATABASE_URL is not set.",
    )
    database_host: str | None = Field(
        default=None, description="Overrides the secret's host (the RDS Proxy endpoint when the stack makes one)."
    )
    database_access: Literal["direct", "data-api"] = Field(
        default="direct",
        description="direct: psycopg connections (DATABASE_URL or DATABASE_SECRET_ARN). data-api: every statement "
        "over the RDS Data API (HTTPS, no connection) to DATABASE_CLUSTER_ARN with DATABASE_SECRET_ARN's credentials.",
    )
    database_cluster_arn: str | None = Field(
        default=None, description="The Aurora cluster the Data API reaches (DATABASE_ACCESS=data-api)."
    )
    database_name: str = Field(default="pagescribe", description="The database the Data API's statements run in.")
    bucket_name: str | None = Field(default=None, description="S3 bucket holding uploads/ and transcripts/.")
    queue_url: str | None = Field(default=None, description="SQS queue carrying one message per page job.")
    upload_prefix: str = "uploads/"
    transcript_prefix: str = "transcripts/"

    provider_base_url: str = OPENROUTER_BASE_URL
    provider: Literal["auto", "openai-compatible", "bedrock", "offline"] = Field(
        default="auto",
        description="auto: the OpenAI-compatible endpoint when a key (or a non-default base URL) is configured, "
        "else the offline OCR provider. bedrock: Amazon Bedrock's Converse API over the function's IAM role, MODEL a "
        "Bedrock model id or inference profile.",
    )
    escalation_provider: Literal["openai-compatible", "bedrock"] | None = Field(
        default=None,
        description="The provider ESCALATION_MODEL is asked on, when it is not PROVIDER's (e.g. MODEL on bedrock, "
        "ESCALATION_MODEL on the OpenAI-compatible endpoint); empty: PROVIDER's.",
    )
    bedrock_prices: str = Field(
        default="",
        description="Bedrock prices in USD per million tokens, JSON {model id: {input_per_mtok, output_per_mtok}}, "
        "merged over pagescribe.providers.bedrock_prices' table; a Bedrock model without a price is refused at cold "
        "start.",
    )
    provider_api_key: SecretStr | None = None
    provider_api_key_parameter: str | None = Field(
        default=None, description="SSM SecureString holding the provider key (read at cold start, cached)."
    )
    provider_usage_accounting: bool = Field(
        default=True, description="Ask the provider to report cost (OpenRouter's usage.include)."
    )
    provider_stream: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Stream the model's answers (server-sent events) and cut a call at the first loop in its answer. "
        "auto: stream, and call unstreamed an endpoint that rejects the stream parameter; on: always stream; off: "
        "never (an answer is checked once it is whole, and paid whole).",
    )
    model: str = "google/gemini-2.5-flash"
    escalation_model: str | None = Field(
        default=None,
        description="A stronger model asked once more for a page whose answer carries a hard flag; empty: off.",
    )
    prompt: str = DEFAULT_PROMPT
    max_output_tokens: int = Field(default=8192, gt=0)

    flag_repetition_threshold: int = Field(
        default=8,
        ge=2,
        description="repetition: a unit repeated this often (back to back, or as most lines) is a loop.",
    )
    flag_refusal_threshold: float = Field(
        default=0.5, gt=0, le=1, description="refusal: this share of the answer's words in refusal sentences."
    )
    flag_ink_threshold: float = Field(
        default=0.002, gt=0, le=1, description="empty: a page with this share of dark pixels has something on it."
    )
    flag_blank_render_threshold: float = Field(
        default=0.00001, ge=0, le=1, description="blank_render: a render with less than this share of marked pixels."
    )
    flag_ungrounded_threshold: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="ungrounded: more than this share of the answer's characters in runs of words that nothing on the "
        "page (its text layer, or the second read) supports.",
    )
    flag_ungrounded_block_chars: int = Field(
        default=12,
        ge=0,
        description="ungrounded: also raised, whatever the share, by a block or a table's row of at least this many "
        "letters and digits that nothing on the page supports as a whole (an invented paragraph or row on a dense "
        "page); 0 turns this off.",
    )
    flag_missed_text_threshold: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="missed_text: more than this share of the page's own text (text layer or second read) in runs "
        "of words the answer leaves out.",
    )
    flag_low_confidence_threshold: float = Field(
        default=0.8, ge=0, le=1, description="low_confidence: the offline engine's mean confidence below this."
    )

    provider_timeout_seconds: float = Field(default=180.0, gt=0)
    provider_connect_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Longest wait for a connection to the provider (within the call's time)."
    )
    function_timeout_seconds: float = Field(default=300.0, gt=0)
    result_reserve_seconds: float = Field(
        default=10.0, ge=0, description="Time kept back from every model call to write its result."
    )
    min_call_budget_seconds: float = Field(
        default=5.0, gt=0, description="A page whose model call would get less than this is not claimed."
    )
    lease_margin_seconds: float = Field(default=60.0, ge=0)
    page_concurrency: int = Field(default=10, ge=1, le=100)

    max_attempts: int = Field(default=3, ge=1)
    max_document_retries: int = Field(
        default=3,
        ge=0,
        le=100,
        description="How many times one document's pages may be queued again: each POST /retry of its failed pages "
        "and each re-run of one of its pages counts.",
    )
    max_page_reruns: int = Field(
        default=2, ge=0, le=100, description="How many times one page may be re-run (POST .../pages/N/rerun)."
    )
    max_page_revisions: int = Field(
        default=50,
        ge=1,
        le=10_000,
        description="How many corrections one page may be saved with (PUT .../pages/N/correction); each writes the "
        "document's transcript files again.",
    )
    allowed_models: str | None = Field(
        default=None,
        description="Models an API caller may name (model, escalation_model), comma-separated; by default MODEL "
        "and ESCALATION_MODEL only: every other model on the provider account is refused.",
    )
    resend_after_seconds: float = Field(
        default=1800.0, gt=900, description="A QUEUED job sent this long ago without progress is sent again."
    )
    finish_grace_seconds: float = Field(
        default=120.0, ge=0, description="A document with every page done but unfinished this long is finished."
    )
    sweep_batch_size: int = Field(default=500, ge=1, le=10_000)
    retry_base_seconds: float = Field(default=10.0, ge=0)
    rate_limit_rpm: float = Field(
        default=0.0,
        ge=0,
        description="The provider's requests per minute, per provider and model, shared by every environment through "
        "PostgreSQL (the rate governor); 0 turns the governor off and each page backs off alone on a 429.",
    )
    rate_limit_tpm: float = Field(
        default=0.0,
        ge=0,
        description="The provider's tokens (prompt + completion) per minute, per provider and model; 0: not limited.",
    )
    rate_limit_burst: float = Field(
        default=1.0,
        ge=1,
        description="Calls the governor lets start at once after a quiet spell; 1 paces calls evenly, so no minute "
        "ever sees more than RATE_LIMIT_RPM.",
    )
    daily_budget_usd: float | None = Field(
        default=None,
        ge=0,
        description="What each tenant may spend on model calls per UTC day unless the tenant has its own budget "
        "(pagescribe tenants budget); pages that would exceed it end SKIPPED (reason: budget). Unset: no budget.",
    )
    max_pages: int = Field(default=500, ge=1)
    max_upload_bytes: int = Field(default=100 * 1024 * 1024, ge=1)
    max_image_pixels: int = Field(default=60_000_000, ge=1)

    api_key: SecretStr | None = Field(
        default=None, description="When set, every API request but /health must carry it in x-api-key."
    )
    default_tenant: str = Field(
        default="default",
        pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$",
        description="The tenant of API_KEY's callers, and of files put straight into the bucket (unless their key "
        "starts with uploads/<tenant>/ for an existing tenant).",
    )
    tenant_keys_only: Literal["auto", "true", "false"] = Field(
        default="auto",
        description="true: refuse any API key that is neither API_KEY nor a tenant's key in the database. auto: the "
        "same once any tenant holds a key (the stack serves several clients); until then, and always with false, a "
        "key that is no tenant's (API Gateway checked it) is the default tenant's when API_KEY is unset.",
    )
    api_key_cache_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="How long a warm API environment keeps what it looked up about a key: a revoked key is "
        "refused within this time.",
    )
    upload_url_expiry_seconds: int = Field(default=900, ge=60, le=7 * 24 * 3600)
    keep_page_images: bool = Field(
        default=True,
        description="Store the image each page was sent to the model as, under the transcript's prefix "
        "(transcripts/<id>/pages/), for GET /documents/{id}/pages/{n}/image and the review page.",
    )
    image_url_expiry_seconds: int = Field(
        default=300, ge=30, le=3600, description="How long a page image link from the API stays valid."
    )
    upload_grace_seconds: int = Field(
        default=900,
        ge=0,
        le=7 * 24 * 3600,
        description="A document created through the API whose file has not arrived this long after its upload URL "
        "expired ends FAILED ('upload never arrived').",
    )
    upload_failures_queue_url: str | None = Field(
        default=None,
        description="The upload function's on-failure destination (an SQS queue), drained by the sweeper: each "
        "event the function gave up on becomes a FAILED document with the reason.",
    )
    callback_secret: SecretStr | None = Field(default=None, description="HMAC-SHA256 key for callbacks.")
    callback_secret_parameter: str | None = Field(
        default=None, description="SSM SecureString holding the callback HMAC key."
    )
    callback_timeout_seconds: float = Field(
        default=5.0, gt=0, le=60, description="Longest wait for each step of a callback (connect, write, read)."
    )
    callback_deadline_seconds: float = Field(
        default=15.0,
        gt=0,
        le=120,
        description="Longest a whole callback delivery may take, from resolving its host to its answer's last byte.",
    )
    callback_concurrency: int = Field(
        default=8, ge=1, le=100, description="Callbacks delivered at once in one round (the sweeper's)."
    )
    callback_max_attempts: int = Field(default=5, ge=1, le=20)
    callback_allow_private_networks: bool = Field(
        default=False,
        description="Allow callbacks to loopback, private and link-local addresses (off: no requests to the "
        "instance metadata service or the VPC on a caller's behalf).",
    )

    text_layer: Literal["off", "fallback", "auto"] = Field(
        default="fallback",
        description="What a PDF page's own text layer may stand in for. fallback: a page whose render is blank; auto: "
        "every page with a usable one (no model call); off: nothing (it is still checked against).",
    )
    chunks: bool = Field(
        default=False,
        description="Write transcripts/<id>.chunks.jsonl, the transcript cut into chunks for retrieval, beside every "
        "transcript (a document's own chunks in POST /documents decides for it).",
    )
    furniture: Literal["mark", "drop", "keep"] = Field(
        default="mark",
        description="How the markdown shows running headers, footers and page numbers: mark (as comments), drop (not "
        "at all; the JSON keeps them) or keep (as text); a document's own furniture in POST /documents decides for it.",
    )
    merge_tables: bool = Field(
        default=True,
        description="Join a table that ends one page to the table that starts the next when their columns agree "
        "(pagescribe.tables); a document's own merge_tables in POST /documents decides for it.",
    )
    chunk_max_tokens: int = Field(
        default=DEFAULT_MAX_TOKENS,
        ge=MIN_MAX_TOKENS,
        le=MAX_MAX_TOKENS,
        description="The bound of each stored chunk, in estimated tokens (pagescribe.chunking).",
    )
    chunk_overlap: int = Field(
        default=DEFAULT_OVERLAP,
        ge=0,
        description="Tokens of a stored chunk's last whole sentences, rows or items carried into the next; under "
        "half of CHUNK_MAX_TOKENS.",
    )
    second_read: Literal["auto", "always", "off"] = Field(
        default="auto",
        description="A page without a usable text layer is read a second time by the offline engine, in a render "
        "process, while its model call is in flight, to ground the answer to. auto: when a render process is free "
        "as the call starts, and for no longer than the call itself takes; always: whenever the page's time "
        "allows, its process at the function's own priority (under auto, below it); off: never. A page that goes "
        "without says why.",
    )
    second_read_memory_limit_mb: int = Field(
        default=1536,
        ge=512,
        description="Address-space limit of the second read's process: the engine and a dense page take about "
        "1.5 GB of address space (about 730 MB resident).",
    )
    ocr_language: str = Field(
        default="ch",
        description="The offline engine's recognition model, by language: ch (PP-OCRv6 small, the only one that "
        "ships in the rapidocr wheel: Chinese, English and other Latin-script languages).",
    )
    ocr_threads: int = Field(
        default=0,
        ge=0,
        description="Threads each read of the offline engine computes on: 0, the machine's cores (shared by the "
        "engine's workers). 1 where many reads run at once on few cores (a test suite's parallel workers): "
        "onnxruntime's threads busy-wait for each other, which costs CPU time when they share cores with others.",
    )
    page_numbers: Literal["mark", "drop"] = Field(
        default="mark",
        description="A page number the offline engine reads at a page's top or bottom: mark (as an HTML comment, "
        "<!-- page number: 7 -->) or drop.",
    )
    detect_orientation: bool = Field(
        default=True, description="Turn a scan whose text reads sideways or upside down upright before sending it."
    )
    render_dpi: int = Field(default=150, ge=36, le=600)
    render_max_long_edge: int = Field(default=1568, ge=256, le=10_000)
    render_format: Literal["jpeg", "png"] = "jpeg"
    render_workers: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="Render processes per execution environment. Default: as many as the function's memory "
        "holds at RENDER_MEMORY_LIMIT_MB each (at least one), at most the CPUs.",
    )
    render_memory_limit_mb: int = Field(
        default=768,
        ge=128,
        description="Address-space limit of each render process: a page that needs more (a decompression "
        "bomb) fails with this limit named, and the function lives on.",
    )
    render_timeout_seconds: float = Field(default=60.0, gt=0, le=900, description="Longest render of one page.")
    render_ahead_pages: int = Field(
        default=10,
        ge=0,
        le=100,
        description="Pages rendered ahead while a batch's model calls run: the pages after the batch's own in its "
        "documents, kept (at most this many images) for the next batch this environment gets. 0: render only "
        "what is claimed.",
    )
    aws_lambda_function_memory_size: int | None = Field(
        default=None, description="Set by Lambda: the function's memory (MB), which the render processes share."
    )
    # The batch lane (pagescribe.batchlane): pages sent in a provider's batch at its batch price, collected by the
    # sweeper.
    default_lane: Literal["sync", "batch"] = Field(
        default="sync",
        description="The lane of a document that names none (an upload to the bucket, or POST /documents without "
        "lane): sync, one model call per page as it comes; batch, its pages sent in the provider's batch API at its "
        "batch price and collected by the sweeper within the batch's window.",
    )
    batch_dialect: Literal["openai", "openrouter"] = Field(
        default="openai",
        description="The batch API spoken: openai (POST /files of JSONL, then POST /batches; the flow many "
        "OpenAI-compatible endpoints serve) or openrouter (POST /beta/batches with the requests inline, results in "
        "the batch). Both send each page as a presigned URL of its kept image.",
    )
    batch_base_url: str | None = Field(
        default=None, description="The batch API's base URL, where it is not PROVIDER_BASE_URL."
    )
    batch_price_factor: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A batch call's price against a synchronous one's (0.5: half): what estimates of the batch lane "
        "use.",
    )
    batch_max_pages: int = Field(default=500, ge=1, le=50_000, description="The most pages sent in one batch.")
    batch_window_hours: int = Field(
        default=24, ge=1, le=168, description="The batch's completion window (the provider's, 24h for most)."
    )
    batch_image_url_seconds: int = Field(
        default=7 * 24 * 3600,
        ge=3600,
        le=7 * 24 * 3600,
        description="How long a page image's presigned URL sent in a batch stays valid: at least the batch's window "
        "(SigV4 allows 7 days; a URL signed with temporary credentials ends with them).",
    )
    batch_sync_reserve_seconds: float = Field(
        default=900,
        ge=0,
        description="A batch page of a document with a deadline moves to the sync lane this long before the deadline "
        "(a sync call's time and the sweeper's interval, with room to spare).",
    )
    batch_max_submissions: int = Field(
        default=2,
        ge=1,
        le=10,
        description="Batches a page is sent in before one that no batch answered moves to the sync lane.",
    )
    tiles: Literal["auto", "off"] = Field(
        default="auto",
        description="Dense pages read in tiles: a page whose text is small at the render's scale (TILE_MIN_TEXT_PX), "
        "or whose answer was truncated at the output limit, is read again as overlapping horizontal bands at a higher "
        "scale, each a model call, their answers stitched in reading order. off: never.",
    )
    tile_min_text_px: float = Field(
        default=11.0,
        ge=2,
        le=200,
        description="A page is dense when the median height of its words (text-layer glyphs, or the offline engine's "
        "lines on a scan) is below this many pixels of its render; its tiles aim at twice this height.",
    )
    tile_max_tiles: int = Field(default=6, ge=2, le=24, description="The most tiles (model calls) a page is read in.")
    tile_max_pixels: int = Field(
        default=1_600_000, ge=100_000, le=40_000_000, description="The most pixels of one tile's image."
    )
    tile_max_long_edge: int = Field(
        default=2048,
        ge=256,
        le=10_000,
        description="The longest edge of a tile's image (a band's width): at most what the model takes without "
        "shrinking it.",
    )
    tile_overlap: float = Field(
        default=0.15, ge=0.05, le=0.5, description="The share of a band's height the next band repeats."
    )

    @field_validator("database_url")
    @classmethod
    def _postgresql_only(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in {"postgresql", "postgres", "postgresql+psycopg"}:
            raise ValueError(
                f"DATABASE_URL must be a PostgreSQL URL (postgresql://…); got scheme {scheme or '(none)'!r}"
            )
        return value

    @field_validator(
        "database_secret_arn",
        "database_cluster_arn",
        "database_host",
        "escalation_model",
        "escalation_provider",
        "provider_api_key_parameter",
        "callback_secret_parameter",
        "daily_budget_usd",
        "batch_base_url",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # CloudFormation passes an unset optional parameter as an empty string.
        return None if value == "" else value

    @field_validator("chunk_overlap")
    @classmethod
    def _overlap_under_half_the_bound(cls, value: int, info: ValidationInfo) -> int:
        bound = info.data.get("chunk_max_tokens")
        if bound is not None and value >= bound // 2:
            raise ValueError(f"CHUNK_OVERLAP={value} must be under half of CHUNK_MAX_TOKENS={bound}")
        return value

    @field_validator("bedrock_prices")
    @classmethod
    def _price_table(cls, value: str) -> str:
        from pagescribe.providers.bedrock_prices import parse_prices

        parse_prices(value)
        return value

    @field_validator("ocr_language")
    @classmethod
    def _shipped_language(cls, value: str) -> str:
        if value not in OCR_LANGUAGES:
            raise ValueError(
                f"OCR_LANGUAGE={value!r} has no recognition model in the rapidocr wheel, and pagescribe never "
                f"downloads models; the languages that ship: {', '.join(sorted(OCR_LANGUAGES))}"
            )
        return value

    @field_validator("batch_image_url_seconds")
    @classmethod
    def _image_urls_outlive_the_window(cls, value: int, info: ValidationInfo) -> int:
        hours = info.data.get("batch_window_hours")
        if hours is not None and value < hours * 3600:
            raise ValueError(
                f"BATCH_IMAGE_URL_SECONDS={value} must be at least BATCH_WINDOW_HOURS={hours} (= {hours * 3600} s): "
                "a page's image must still be there when the provider reads it"
            )
        return value

    @field_validator("upload_prefix", "transcript_prefix")
    @classmethod
    def _prefix_ends_with_slash(cls, value: str) -> str:
        if not value.endswith("/"):
            raise ValueError(f"an S3 prefix must end with '/'; got {value!r}")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The default sources, made cheaper at cold start: the environment read by :class:`ScalarEnvironment`,
        and no .env file or secrets directory unless one is configured (never, as deployed): those sources would
        read nothing, yet each would still walk every field."""
        sources = [init_settings, ScalarEnvironment.replacing(env_settings)]
        if not isinstance(dotenv_settings, DotEnvSettingsSource) or dotenv_settings.env_file is not None:
            sources.append(dotenv_settings)
        if not isinstance(file_secret_settings, SecretsSettingsSource) or file_secret_settings.secrets_dir is not None:
            sources.append(file_secret_settings)
        return tuple(sources)

    def data_api_target(self) -> tuple[str, str]:
        """DATABASE_ACCESS=data-api: the cluster ARN and the secret ARN it needs, both set."""
        if not (self.database_cluster_arn and self.database_secret_arn):
            raise ConfigurationError(
                "DATABASE_ACCESS=data-api needs DATABASE_CLUSTER_ARN and DATABASE_SECRET_ARN "
                f"(got {self.database_cluster_arn or '(none)'!r} and {self.database_secret_arn or '(none)'!r})"
            )
        return self.database_cluster_arn, self.database_secret_arn

    def check_model_call_time(self) -> None:
        """For a function that calls the model: its calls must fit inside the function's own timeout.

        Checked at the cold start of such a function only; the upload function never calls the model, so a
        shorter timeout there is fine."""
        ceiling = self.function_timeout_seconds - self.result_reserve_seconds
        if self.provider_timeout_seconds >= ceiling:
            raise ConfigurationError(
                f"PROVIDER_TIMEOUT_SECONDS={self.provider_timeout_seconds:g} must be below "
                f"FUNCTION_TIMEOUT_SECONDS={self.function_timeout_seconds:g} less "
                f"RESULT_RESERVE_SECONDS={self.result_reserve_seconds:g} (= {ceiling:g}); "
                "raise the function timeout or lower the provider timeout"
            )

    def check_escalation(self) -> None:
        """For a function that calls the model: escalation needs a model to escalate to, which OCR is not."""
        if self.escalation_model and self.uses_offline_provider and self.escalation_provider is None:
            raise ConfigurationError(
                f"ESCALATION_MODEL={self.escalation_model!r} needs a vision model provider (PROVIDER_API_KEY or "
                "PROVIDER_BASE_URL, or ESCALATION_PROVIDER); the offline OCR engine has no stronger model to ask"
            )

    @property
    def escalation_provider_kind(self) -> str | None:
        """The provider ESCALATION_MODEL is asked on when it is another than PROVIDER's, else None."""
        if not self.escalation_model or self.escalation_provider is None:
            return None
        return None if self.escalation_provider == self.provider_kind else self.escalation_provider

    @property
    def provider_kind(self) -> str:
        """The provider PROVIDER names, ``auto`` resolved: offline, openai-compatible or bedrock."""
        if self.uses_offline_provider:
            return "offline"
        return "openai-compatible" if self.provider == "auto" else self.provider

    def bedrock_models(self) -> list[str]:
        """The models asked on Bedrock: the models callers may name, on PROVIDER=bedrock, except an escalation model
        routed elsewhere; and ESCALATION_MODEL when ESCALATION_PROVIDER=bedrock."""
        routed = self.escalation_provider_kind
        models = sorted(self.model_allow_list) if self.provider == "bedrock" else []
        if routed is not None and self.escalation_model:
            models = [m for m in models if m != self.escalation_model]
            models += [self.escalation_model] if routed == "bedrock" else []
        return models

    def check_bedrock_prices(self) -> None:
        """For a function that calls the model: every model asked on Bedrock has a price (Bedrock reports tokens, not
        dollars), or the function refuses to start rather than record its calls as free."""
        from pagescribe.providers.bedrock_prices import SETTING, parse_prices, price_of

        prices = parse_prices(self.bedrock_prices)
        unpriced = [model for model in self.bedrock_models() if price_of(model, prices) is None]
        if unpriced:
            raise ConfigurationError(
                f"no Bedrock price for {', '.join(map(repr, unpriced))}: Bedrock reports tokens, not dollars; add "
                f'{SETTING}=\'{{"{unpriced[0]}": {{"input_per_mtok": <USD>, "output_per_mtok": <USD>}}}}\''
            )

    @property
    def model_allow_list(self) -> frozenset[str]:
        """The models API callers may name: ALLOWED_MODELS, else MODEL and ESCALATION_MODEL."""
        if self.allowed_models:
            return frozenset(name.strip() for name in self.allowed_models.split(",") if name.strip())
        return frozenset(name for name in (self.model, self.escalation_model) if name)

    def render_worker_count(self) -> int:
        """RENDER_WORKERS, or the default: what the function's memory holds beside the handler's own process."""
        if self.render_workers is not None:
            return self.render_workers
        cpus = os.cpu_count() or 1
        if self.aws_lambda_function_memory_size is None:
            return min(cpus, 4)
        fits = (self.aws_lambda_function_memory_size - HANDLER_MEMORY_MB) // self.render_memory_limit_mb
        return max(1, min(cpus, fits))

    def check_render_memory(self) -> None:
        """For the transcribe function: its render processes at their limit must fit the function's memory,
        or a bomb would take the whole environment down instead of failing its page."""
        memory = self.aws_lambda_function_memory_size
        if memory is None:
            return
        needed = self.render_worker_count() * self.render_memory_limit_mb + HANDLER_MEMORY_MB
        if needed > memory:
            raise ConfigurationError(
                f"RENDER_WORKERS={self.render_worker_count()} x RENDER_MEMORY_LIMIT_MB={self.render_memory_limit_mb}"
                f" + {HANDLER_MEMORY_MB} MB for the handler = {needed} MB does not fit the function's "
                f"{memory} MB (AWS_LAMBDA_FUNCTION_MEMORY_SIZE); lower them or give the function more memory"
            )

    @property
    def sqlalchemy_url(self) -> str:
        """The database URL with the psycopg 3 driver named, as SQLAlchemy wants it."""
        return to_sqlalchemy_url(self.require("database_url"))

    @property
    def has_batch_api(self) -> bool:
        """Whether the provider has a batch API the batch lane can drive: an OpenAI-compatible endpoint (BATCH_DIALECT);
        the offline engine has none, and Bedrock's batch inference is not driven by the lane."""
        return self.provider_kind == "openai-compatible"

    @property
    def uses_offline_provider(self) -> bool:
        if self.provider != "auto":
            return self.provider == "offline"
        has_key = self.provider_api_key is not None or self.provider_api_key_parameter is not None
        return not has_key and self.provider_base_url == OPENROUTER_BASE_URL

    def require(self, name: Literal["database_url", "bucket_name", "queue_url"]) -> str:
        """The value of a setting that this code path cannot run without."""
        value: str | None
        if name == "database_url":
            value = self.database_url
        elif name == "bucket_name":
            value = self.bucket_name
        else:
            value = self.queue_url
        if not value:
            raise ConfigurationError(f"{name.upper()} is not set; it is required here")
        return value


def to_sqlalchemy_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"postgresql+psycopg://{rest}" if scheme != "postgresql+psycopg" else url


def database_url_from_secret(secret: str, *, host: str | None = None) -> str:
    """A SQLAlchemy URL from a Secrets Manager secret: RDS's JSON (username, password, host, port, dbname),
    a JSON object with "url", or a plain URL. ``host`` (an RDS Proxy endpoint) replaces the secret's host."""
    text = secret.strip()
    if not text.startswith("{"):
        if host:
            raise ConfigurationError("DATABASE_HOST cannot override a plain-URL database secret; store RDS JSON")
        return to_sqlalchemy_url(text)
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"the database secret is not valid JSON: {exc.msg}") from exc
    if "url" in fields and not host:
        return to_sqlalchemy_url(str(fields["url"]))
    missing = [k for k in ("username", "password") if k not in fields]
    if missing or not (host or fields.get("host")):
        raise ConfigurationError(
            f"the database secret lacks {', '.join(missing or ['host'])}; expected RDS JSON "
            "{username, password, host, port, dbname}"
        )
    url = URL.create(
        "postgresql+psycopg",
        username=str(fields["username"]),
        password=str(fields["password"]),
        host=host or str(fields["host"]),
        port=int(fields.get("port", 5432)),
        database=str(fields.get("dbname") or fields.get("database") or "postgres"),
        query={"sslmode": "require"},
    )
    return url.render_as_string(hide_password=False)


def _describe_error(error: Any) -> str:
    """``NAME: message (got 'value')``, the value left out for a secret or a URL with credentials."""
    name = ".".join(map(str, error["loc"]))
    field = Settings.model_fields.get(name)
    secret = name == "database_url" or (field is not None and SecretStr in get_args(field.annotation))
    shown = "" if secret or name == "" else f" (got {error['input']!r})"
    return f"{name.upper() or 'the settings'}: {error['msg']}{shown}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process, validated on first use (cold start) and then reused."""
    try:
        return Settings()
    except ValidationError as exc:
        # Each problem by its variable, its message and the value, unless the value is a secret or holds one (a
        # DATABASE_URL carries its password): the error, and any exception it chained to, ends up in logs.
        problems = "; ".join(map(_describe_error, exc.errors(include_url=False, include_context=False)))
        raise ConfigurationError(f"invalid pagescribe configuration: {problems}") from None
    except ValueError as exc:
        raise ConfigurationError(f"invalid pagescribe configuration: {exc}") from exc
