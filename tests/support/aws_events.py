"""Real Lambda event shapes, built the way AWS builds them, and a Lambda context with a real deadline."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import quote_plus

from aws_lambda_powertools.utilities.typing import LambdaContext as PowertoolsLambdaContext

REGION = "us-east-1"
ACCOUNT = "123456789012"


def s3_put_event(bucket: str, key: str, *, size: int, etag: str, version_id: str | None = None) -> dict[str, Any]:
    """An ``ObjectCreated:Put`` notification as S3 sends it: the key URL-encoded (spaces as '+')."""
    obj: dict[str, Any] = {
        "key": quote_plus(key, safe="/"),
        "size": size,
        "eTag": etag,
        "sequencer": "0A1B2C3D4E5F678901",
    }
    if version_id:
        obj["versionId"] = version_id
    return {
        "Records": [
            {
                "eventVersion": "2.1",
                "eventSource": "aws:s3",
                "awsRegion": REGION,
                "eventTime": "2026-12-03T12:00:00.000Z",
                "eventName": "ObjectCreated:Put",
                "userIdentity": {"principalId": "AWS:AIDAEXAMPLE"},
                "requestParameters": {"sourceIPAddress": "127.0.0.1"},
                "responseElements": {
                    "x-amz-request-id": "C3D13FE58DE4C810",
                    "x-amz-id-2": "FMyUVURIY8/IgAtTv8xRjskZQpcIZ9KG4V5Wp6S7S/JRWeUWerMUE5JgHvANOjpD",
                },
                "s3": {
                    "s3SchemaVersion": "1.0",
                    "configurationId": "uploads",
                    "bucket": {
                        "name": bucket,
                        "ownerIdentity": {"principalId": "A3NL1KOZZKExample"},
                        "arn": f"arn:aws:s3:::{bucket}",
                    },
                    "object": obj,
                },
            }
        ]
    }


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    """An SQS batch as the Lambda event source mapping delivers it, from ReceiveMessage results."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": {
                    "ApproximateReceiveCount": m.get("Attributes", {}).get("ApproximateReceiveCount", "1"),
                    "SentTimestamp": m.get("Attributes", {}).get("SentTimestamp", str(int(time.time() * 1000))),
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": str(int(time.time() * 1000)),
                },
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": REGION,
            }
            for m in messages
        ]
    }


def sqs_record_for_body(body: str, queue_arn: str) -> dict[str, Any]:
    """One SQS record carrying ``body`` (for duplicate deliveries of a message already consumed)."""
    record: dict[str, Any] = sqs_event(
        [{"MessageId": str(uuid.uuid4()), "ReceiptHandle": str(uuid.uuid4()), "Body": body, "MD5OfBody": "x"}],
        queue_arn,
    )["Records"][0]
    return record


class LambdaContext(PowertoolsLambdaContext):
    """A Lambda context with a real deadline, like the service's: remaining time runs down as you wait."""

    def __init__(self, timeout_seconds: float = 300.0, function_name: str = "pagescribe-test") -> None:
        self._function_name = function_name
        self._function_version = "$LATEST"
        self._invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function_name}"
        self._memory_limit_in_mb = 1024
        self._aws_request_id = str(uuid.uuid4())
        self._log_group_name = f"/aws/lambda/{function_name}"
        self._log_stream_name = "2026/12/03/[$LATEST]local"
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:  # type: ignore[override]  # the stub is a staticmethod
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def job_ids_in(event: dict[str, Any]) -> list[str]:
    return [json.loads(r["body"])["job_id"] for r in event["Records"]]


def api_event(
    method: str,
    path: str,
    *,
    body: str | None = None,
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An API Gateway REST (v1) proxy event, as the {proxy+}-style integration sends it."""
    all_headers = {"Host": "abc123.execute-api.us-east-1.amazonaws.com", "User-Agent": "curl/8.5.0", **(headers or {})}
    if body is not None:
        all_headers.setdefault("Content-Type", "application/json")
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": all_headers,
        "multiValueHeaders": {k: [v] for k, v in all_headers.items()},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": "abc123",
            "httpMethod": method,
            "path": f"/v1{path}",
            "protocol": "HTTP/1.1",
            "requestId": str(uuid.uuid4()),
            "requestTimeEpoch": int(time.time() * 1000),
            "resourcePath": path,
            "stage": "v1",
            "identity": {"sourceIp": "127.0.0.1", "userAgent": "curl/8.5.0"},
        },
        "body": body,
        "isBase64Encoded": False,
    }
