"""The local stack's moto: its SQS made quicker (its clock, its retention check) decides as moto's own does."""

from __future__ import annotations

import importlib
from typing import Any

import boto3
import moto.core.utils
import pytest
from moto import mock_aws
from pagescribe_local.stack import REGION, quicker_sqs

MODELS: Any = importlib.import_module("moto.sqs.models")  # the names the local stack replaces are not in its types
ACCOUNT = "123456789012"  # moto's default account
CHECK = "is_message_valid_based_on_retention_period"
MOTOS_CHECK = getattr(MODELS.SQSBackend, CHECK)  # at import: before any local stack has made its server


@pytest.fixture
def motos_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's SQS as it comes, for the test, whatever a local stack made of it before (and that again after)."""
    assert MOTOS_CHECK.__module__ == "moto.sqs.models"
    monkeypatch.setattr(MODELS.SQSBackend, CHECK, MOTOS_CHECK)
    monkeypatch.setattr(MODELS, "unix_time", moto.core.utils.unix_time)
    monkeypatch.setattr(MODELS, "unix_time_millis", moto.core.utils.unix_time_millis)


@pytest.mark.usefixtures("motos_own")
def test_quicker_sqs_decides_as_motos_own() -> None:
    # Given a queue keeping messages 60 s, with a message sent now and one sent 61 s ago
    with mock_aws():
        sqs = boto3.client("sqs", region_name=REGION)
        url = sqs.create_queue(QueueName="kept", Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
        for body in ("old", "new"):
            sqs.send_message(QueueUrl=url, MessageBody=body)
        backend = MODELS.sqs_backends[ACCOUNT][REGION]
        old, new = backend.get_queue("kept")._messages
        old.sent_timestamp -= 61_000
        motos = [backend.is_message_valid_based_on_retention_period("kept", m) for m in (old, new)]
        before = MODELS.unix_time()
        # When the local stack makes moto's SQS quicker
        quicker_sqs()
        # Then its retention check and clock are the local stack's, and decide and read as moto's own did
        assert getattr(MODELS.SQSBackend, CHECK) is not MOTOS_CHECK
        assert MODELS.unix_time is not moto.core.utils.unix_time
        assert [backend.is_message_valid_based_on_retention_period("kept", m) for m in (old, new)] == motos
        assert motos == [False, True]
        assert abs(MODELS.unix_time() - moto.core.utils.unix_time()) < 1.0  # one clock, read two ways
        assert MODELS.unix_time() >= before
        assert abs(MODELS.unix_time_millis() - moto.core.utils.unix_time_millis()) < 1000.0
        # And messages are sent and received through them as before
        sqs.purge_queue(QueueUrl=url)
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": f"page {n}"} for n in range(3)])
        received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
        assert sorted(message["Body"] for message in received) == ["page 0", "page 1", "page 2"]
        assert sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []) == []  # in flight
