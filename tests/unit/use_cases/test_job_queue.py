"""The job queue's sends: a document's messages in batches of ten, in page order, each message once."""

from __future__ import annotations

import json

import boto3
import pytest
from pagescribe.aws import JobMessage, JobQueue


@pytest.fixture
def sqs(aws: None) -> object:
    """SQS through moto in this process."""
    return boto3.client("sqs")


def _received(sqs: object, queue_url: str) -> list[str]:
    ids: list[str] = []
    while True:
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])  # type: ignore[attr-defined]
        if not messages:
            return ids
        ids += [json.loads(m["Body"])["job_id"] for m in messages]


def test_a_documents_messages_reach_the_queue_in_page_order_each_once(sqs: object) -> None:
    # Given a queue and the messages of a 95-page document
    queue_url = sqs.create_queue(QueueName="jobs")["QueueUrl"]  # type: ignore[attr-defined]
    messages = [JobMessage(f"job-{n}", "doc-1", n) for n in range(1, 96)]
    # When they are sent
    sent = JobQueue(sqs, queue_url).send(messages)  # type: ignore[arg-type]
    # Then every job is reported sent, and the queue hands them out once each, in page order (batches sent at once
    # would reach it in any order, and rendering ahead, which renders the pages after a batch's, would miss)
    assert sent == [m.job_id for m in messages]
    assert _received(sqs, queue_url) == [m.job_id for m in messages]


def test_a_queue_that_refuses_every_batch_leaves_every_job_unsent_without_raising(sqs: object) -> None:
    # Given a queue URL SQS does not know (the queue is gone)
    sqs.create_queue(QueueName="jobs")  # type: ignore[attr-defined]
    gone = "https://sqs.us-east-1.amazonaws.com/123456789012/gone"
    # When 25 messages are sent to it, then no job is reported sent (the sweeper sends them later)
    assert JobQueue(sqs, gone).send([JobMessage(f"job-{n}", "doc-1", n) for n in range(25)]) == []  # type: ignore[arg-type]
