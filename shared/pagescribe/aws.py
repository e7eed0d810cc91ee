"""AWS access for the functions: S3, SQS, Secrets Manager, SSM parameters and API Gateway keys. No other module the
functions run calls boto3 (the local emulation, ``pagescribe_local.stack``, sets up moto's resources with clients
of its own).

Clients honour the standard ``AWS_ENDPOINT_URL`` (and the per-service variants), so the same code runs
against moto locally and in tests.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import boto3
from aws_lambda_powertools.utilities import parameters
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient

log = logging.getLogger(__name__)

SQS_BATCH_LIMIT = 10
SQS_MAX_DELAY_SECONDS = 900

_CLIENT_CONFIG = Config(
    retries={"max_attempts": 4, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    max_pool_connections=20,
)
# Presigned URLs signed with SigV4 in every region (botocore still signs them with SigV2 in us-east-1 and eu-west-1
# unless told, and buckets created since June 2020 refuse SigV2), on the bucket's regional host: a SigV4 signature
# covers the host, so a URL on the global endpoint that S3 redirects to the region would not verify there.
_S3_CONFIG = _CLIENT_CONFIG.merge(Config(signature_version="s3v4", s3={"addressing_style": "virtual"}))


class ObjectMissingError(LookupError):
    """The object named by an event is no longer in the bucket."""


def s3_client() -> S3Client:
    return boto3.client("s3", config=_S3_CONFIG)


def rds_data_client() -> Any:
    """The RDS Data API's client (DATABASE_ACCESS=data-api); a resuming cluster is waited out by ``DataApi``."""
    return boto3.client("rds-data", config=_CLIENT_CONFIG)


def sqs_client() -> SQSClient:
    return boto3.client("sqs", config=_CLIENT_CONFIG)


class ObjectStore:
    """Reads uploads from, and writes transcripts to, the documents bucket."""

    def __init__(self, client: S3Client) -> None:
        self._client = client

    def download(
        self, bucket: str, key: str, destination: Path, *, version_id: str | None = None, etag: str | None = None
    ) -> None:
        """The object, as it was recorded: its version when the bucket keeps versions, and only while its ETag is
        still ``etag`` (a presigned URL's second PUT must not swap the file under a recorded document)."""
        extra: dict[str, Any] = {"VersionId": version_id} if version_id else {}
        if etag:
            extra["IfMatch"] = etag
        try:
            response = self._client.get_object(Bucket=bucket, Key=key, **extra)
            with destination.open("wb") as out:
                shutil.copyfileobj(response["Body"], out, 1 << 20)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in {"404", "NoSuchKey", "NoSuchVersion"}:
                raise ObjectMissingError(f"s3://{bucket}/{key} no longer exists") from exc
            if code in {"412", "PreconditionFailed"}:
                raise ObjectMissingError(f"s3://{bucket}/{key} was replaced after it was uploaded") from exc
            raise

    def put_bytes(self, bucket: str, key: str, body: bytes, *, content_type: str) -> None:
        self._client.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)

    def presign_get(self, bucket: str, key: str, *, expires_in: int) -> str:
        """A URL that reads the object, without credentials, for ``expires_in`` seconds."""
        return self._client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_in
        )

    def origin(self, bucket: str) -> str:
        """``scheme://host[:port]`` of the bucket's presigned URLs (a browser given one talks to that origin), found by
        presigning a URL: signing makes no network call."""
        parts = urlsplit(self.presign_get(bucket, "origin", expires_in=60))
        return f"{parts.scheme}://{parts.netloc}"

    def put_text(self, bucket: str, key: str, body: str, *, content_type: str) -> None:
        self.put_bytes(bucket, key, body.encode("utf-8"), content_type=content_type)

    def get_text(self, bucket: str, key: str) -> str:
        try:
            body = self._client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in {"404", "NoSuchKey"}:
                raise ObjectMissingError(f"s3://{bucket}/{key} does not exist") from exc
            raise
        return bytes(body).decode("utf-8")

    def presign_put(self, bucket: str, key: str, *, content_type: str, expires_in: int) -> str:
        """A URL the client PUTs the file to directly (files never pass through API Gateway or Lambda)."""
        return self._client.generate_presigned_url(
            "put_object",
            Params={"Bucket": bucket, "Key": key, "ContentType": content_type},
            ExpiresIn=expires_in,
            HttpMethod="PUT",
        )


def read_secret(arn: str) -> str:
    """A Secrets Manager secret's string, through Powertools' cached parameter provider."""
    return str(parameters.get_secret(arn, max_age=300))


def read_secure_parameter(name: str) -> str:
    """An SSM SecureString, decrypted, through Powertools' cached parameter provider."""
    return str(parameters.get_parameter(name, decrypt=True, max_age=300))


@dataclass(frozen=True)
class JobMessage:
    """The body of one SQS message: one page job."""

    job_id: str
    document_id: str
    page_number: int

    def to_json(self) -> str:
        return json.dumps({"job_id": self.job_id, "document_id": self.document_id, "page": self.page_number})


class JobQueue:
    """Sends page-job messages; a message only names its job, the database holds the truth."""

    def __init__(self, client: SQSClient, queue_url: str) -> None:
        self._client = client
        self._queue_url = queue_url

    def send(self, messages: Sequence[JobMessage], *, delay_seconds: int = 0) -> list[str]:
        """Send in batches of ten; return the job ids SQS accepted. A failed batch or entry is logged and
        left out: its job stays QUEUED with no ``enqueued_at`` and the sweeper sends it again."""
        delay = max(0, min(SQS_MAX_DELAY_SECONDS, delay_seconds))
        sent: list[str] = []
        for start in range(0, len(messages), SQS_BATCH_LIMIT):
            chunk = messages[start : start + SQS_BATCH_LIMIT]
            entries = [{"Id": str(i), "MessageBody": m.to_json(), "DelaySeconds": delay} for i, m in enumerate(chunk)]
            try:
                response = self._client.send_message_batch(QueueUrl=self._queue_url, Entries=entries)  # type: ignore[arg-type]
            except (ClientError, BotoCoreError) as exc:
                log.warning(
                    "SendMessageBatch failed; the sweeper will send these jobs",
                    extra={"job_ids": [m.job_id for m in chunk], "error": str(exc)},
                )
                continue
            for ok in response.get("Successful", []):
                sent.append(chunk[int(ok["Id"])].job_id)
            for failed in response.get("Failed", []):
                log.warning(
                    "SQS refused a job message; the sweeper will send it",
                    extra={"job_id": chunk[int(failed["Id"])].job_id, "error": failed.get("Message", "")},
                )
        return sent


@dataclass(frozen=True)
class FailedInvocation:
    """One record of an asynchronously invoked function's on-failure destination: the event it gave up on."""

    receipt: str
    event: dict[str, Any]
    error: str  # why Lambda gave up: the function's last error, or the condition (retries exhausted, too old)


class FailedInvocations:
    """An on-failure destination queue: Lambda writes a record there once an asynchronous invocation has failed
    its retries (``requestContext.condition``, ``requestPayload``: the event, ``responsePayload``: the error)."""

    def __init__(self, client: SQSClient, queue_url: str) -> None:
        self._client = client
        self._queue_url = queue_url

    def receive(self, limit: int) -> list[FailedInvocation]:
        """Up to ``limit`` records, each hidden from other readers for a minute; an unreadable one is logged and
        given with an empty event, so that it is deleted rather than read again for ever."""
        received: list[FailedInvocation] = []
        while len(received) < limit:
            response = self._client.receive_message(
                QueueUrl=self._queue_url, MaxNumberOfMessages=min(10, limit - len(received)), VisibilityTimeout=60
            )
            messages = response.get("Messages", [])
            if not messages:
                break
            for message in messages:
                received.append(_failed_invocation(message["ReceiptHandle"], message.get("Body", "")))
        return received

    def delete(self, receipts: Sequence[str]) -> None:
        for start in range(0, len(receipts), SQS_BATCH_LIMIT):
            chunk = receipts[start : start + SQS_BATCH_LIMIT]
            entries = [{"Id": str(i), "ReceiptHandle": receipt} for i, receipt in enumerate(chunk)]
            response = self._client.delete_message_batch(QueueUrl=self._queue_url, Entries=entries)  # type: ignore[arg-type]
            for failed in response.get("Failed", []):  # read again after a minute: recording it is idempotent
                log.warning("a failed-invocation record could not be deleted", extra={"error": failed.get("Message")})


def _failed_invocation(receipt: str, body: str) -> FailedInvocation:
    try:
        record = json.loads(body)
        event = record["requestPayload"]
        condition = str(record.get("requestContext", {}).get("condition") or "failed")
        response = record.get("responsePayload") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("an on-failure record is not a Lambda destination record", extra={"body": body[:500]})
        return FailedInvocation(receipt, {}, "unreadable record")
    error = condition
    if isinstance(response, dict) and response.get("errorMessage"):
        error = f"{condition}: {response.get('errorType') or 'Error'}: {response['errorMessage']}"
    return FailedInvocation(receipt, event if isinstance(event, dict) else {}, error)


def apigateway_client() -> Any:
    return boto3.client("apigateway", config=_CLIENT_CONFIG)


class ApiGatewayKeys:
    """A tenant's key in the stack's API Gateway usage plan: the same value, so that API Gateway lets it in and
    throttles it by the plan, while the API function finds its tenant by its hash."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def add(self, key: str, *, name: str, plan: str) -> str:
        created = self._client.create_api_key(name=name, value=key, enabled=True)
        self._client.create_usage_plan_key(usagePlanId=plan, keyId=created["id"], keyType="API_KEY")
        return str(created["id"])

    def remove(self, *, name: str) -> int:
        """Delete the keys of this name; how many."""
        found = self._client.get_api_keys(nameQuery=name, includeValues=False).get("items", [])
        for item in found:
            if item.get("name") == name:
                self._client.delete_api_key(apiKey=item["id"])
        return sum(item.get("name") == name for item in found)


def respond_to_cloudformation(response_url: str, body: dict[str, Any]) -> None:
    """Answer a CloudFormation custom resource request: a PUT of the JSON result to its presigned URL."""
    import httpx  # only the migrate function answers CloudFormation (and loads httpx at its cold start)

    payload = json.dumps(body).encode("utf-8")
    response = httpx.put(response_url, content=payload, headers={"Content-Type": ""}, timeout=30)
    response.raise_for_status()
