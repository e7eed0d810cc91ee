"""Real Lambda event shapes, built the way AWS builds them, and a Lambda context with a real deadline."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote_plus

from pagescribe_local.stack import ACCOUNT, REGION, LambdaContext, api_gateway_event, sqs_event

api_event = api_gateway_event

__all__ = ["ACCOUNT", "REGION", "LambdaContext", "api_event", "s3_put_event", "sqs_event", "sqs_record_for_body"]


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


def sqs_record_for_body(body: str, queue_arn: str) -> dict[str, Any]:
    """One SQS record carrying ``body`` (for duplicate deliveries of a message already consumed)."""
    record: dict[str, Any] = sqs_event(
        [{"MessageId": str(uuid.uuid4()), "ReceiptHandle": str(uuid.uuid4()), "Body": body, "MD5OfBody": "x"}],
        queue_arn,
    )["Records"][0]
    return record
