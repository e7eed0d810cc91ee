"""The deployed stack on one machine: AWS emulated by a moto server, the real handlers driven as Lambda would.

Nothing here is domain code. S3 sends ObjectCreated notifications for uploads/ to a queue (as the stack's
trigger would), and a poller plays the Lambda service: notifications → upload handler, job batches → the
transcribe handler with partial batch failures and visibility timeouts honoured, the sweeper on a schedule.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import boto3
from aws_lambda_powertools.utilities.typing import LambdaContext as PowertoolsLambdaContext

if TYPE_CHECKING:
    from moto.server import ThreadedMotoServer
    from mypy_boto3_sqs.type_defs import DeleteMessageBatchRequestEntryTypeDef

log = logging.getLogger(__name__)

REGION = "us-east-1"
# The documents bucket's CORS rule, as template.yaml sets it: the review page PUTs uploads to presigned URLs and shows
# page images from them, from the API's origin.
BUCKET_CORS_RULES: list[dict[str, Any]] = [
    {
        "AllowedMethods": ["GET", "PUT"],
        "AllowedOrigins": ["*"],
        "AllowedHeaders": ["Content-Type"],
        "MaxAgeSeconds": 3000,
    }
]
ACCOUNT = "123456789012"
SCHEDULED_EVENT: dict[str, Any] = {
    "version": "0",
    "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
    "detail-type": "Scheduled Event",
    "source": "aws.events",
    "account": ACCOUNT,
    "time": "2026-12-03T12:00:00Z",
    "region": REGION,
    "resources": [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/pagescribe-sweeper"],
    "detail": {},
}

Handler = Callable[[dict[str, Any], PowertoolsLambdaContext], Any]


class LambdaContext(PowertoolsLambdaContext):
    """A Lambda context with a real deadline, like the service's: remaining time runs down as you wait."""

    def __init__(self, timeout_seconds: float = 300.0, function_name: str = "pagescribe-local") -> None:
        self._function_name = function_name
        self._function_version = "$LATEST"
        self._invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function_name}"
        self._memory_limit_in_mb = 1024
        self._aws_request_id = str(uuid.uuid4())
        self._log_group_name = f"/aws/lambda/{function_name}"
        self._log_stream_name = "local/[$LATEST]pagescribe"
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:  # type: ignore[override]  # the stub is a staticmethod
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    """An SQS batch as the Lambda event source mapping delivers it, from ReceiveMessage results."""
    now = str(int(time.time() * 1000))
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": {
                    "ApproximateReceiveCount": m.get("Attributes", {}).get("ApproximateReceiveCount", "1"),
                    "SentTimestamp": m.get("Attributes", {}).get("SentTimestamp", now),
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": now,
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


def api_gateway_event(
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


@dataclass(frozen=True)
class LocalResources:
    endpoint: str
    bucket: str
    queue_url: str
    queue_arn: str
    notifications_url: str
    upload_failures_url: str  # the upload function's on-failure destination


class LocalExtraMissing(RuntimeError):
    """The local stack's own dependencies (the 'local' extra) are not installed."""


class ServerProcess:
    """A server in a process of its own, spawned (not a fork of a process whose threads hold locks):
    ``target(*args, connection)`` sends what reaches it (its address) once it serves, answers what it is asked on the
    connection, and stops when told "stop" or when the connection ends. Its exit at its start is reported at once."""

    def __init__(self, name: str, target: Callable[..., None], *args: Any, start_seconds: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, self._theirs = context.Pipe()
        self._process = context.Process(target=target, args=(*args, self._theirs), name=name, daemon=True)
        self._name = name
        self._start_seconds = start_seconds

    def start(self) -> Any:
        """Start it, and return what it sent once serving."""
        self._process.start()
        self._theirs.close()  # the child's end is the child's: its exit is seen here as the end of the pipe
        if not self._connection.poll(self._start_seconds):
            self._process.kill()
            raise RuntimeError(f"the {self._name} process did not start within {self._start_seconds:.0f} s")
        try:
            return self._connection.recv()
        except EOFError:
            self._process.join()
            raise RuntimeError(
                f"the {self._name} process ended as it started (exit code {self._process.exitcode}; its error is above)"
            ) from None

    def ask(self, question: str) -> Any:
        """Its answer to ``question``."""
        self._connection.send(question)
        return self._connection.recv()

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # the process is gone already
            self._connection.send("stop")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._connection.close()


class MotoProcess:
    """A moto server in a process of its own, so that what it does for each call runs beside the handlers it serves,
    not on their interpreter, as AWS does (and less of it: ``quicker_sqs``). Its interface is ThreadedMotoServer's."""

    START_SECONDS = 120.0  # a fresh interpreter imports moto, compiling it where no bytecode was installed

    def __init__(self, host: str, port: int) -> None:
        _moto_server(host, port)  # moto is there (LocalExtraMissing otherwise), before a process is started for it
        self.process = ServerProcess("moto", _serve_moto, host, port, start_seconds=self.START_SECONDS)
        self._address: tuple[str, int] | None = None

    def start(self) -> None:
        host, port = self.process.start()
        self._address = (host, port)

    def get_host_and_port(self) -> tuple[str, int]:
        assert self._address is not None, "start() first"
        return self._address

    def stop(self) -> None:
        self.process.stop()


def _serve_moto(host: str, port: int, connection: Connection) -> None:
    """A moto server's process: serves until told to stop or its parent is gone."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = _moto_server(host, port)
    server.start()
    connection.send(server.get_host_and_port())
    with contextlib.suppress(EOFError):
        connection.recv()
    server.stop()
    # The threads of the connections the parent's clients keep alive would hold the process for as long as those
    # clients live (its stop then waited 10 s and killed it): nothing is left to flush, so it ends here.
    os._exit(0)


class LocalAws:
    """A moto server on this machine with the stack's bucket, queues and S3 trigger; in a thread of this process, or,
    with ``own_process``, in a process of its own."""

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, bucket: str = "pagescribe-local", own_process: bool = False
    ) -> None:
        self._server: ThreadedMotoServer | MotoProcess = (
            MotoProcess(host, port) if own_process else _moto_server(host, port)
        )
        self._bucket = bucket

    def start(self, *, visibility_timeout: int) -> LocalResources:
        """Start the server, point this process's AWS clients at it, and create the resources."""
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one access-log line per AWS call otherwise
        self._server.start()
        host, port = self._server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        os.environ.update(
            {
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": "local",
                "AWS_SECRET_ACCESS_KEY": "local",
                "AWS_DEFAULT_REGION": REGION,
            }
        )
        s3, sqs = boto3.client("s3"), boto3.client("sqs")
        s3.create_bucket(Bucket=self._bucket)
        s3.put_bucket_cors(Bucket=self._bucket, CORSConfiguration={"CORSRules": BUCKET_CORS_RULES})  # type: ignore[typeddict-item]
        dlq_url = sqs.create_queue(QueueName="pagescribe-jobs-dlq")["QueueUrl"]
        dlq_arn = _queue_arn(sqs, dlq_url)
        queue_url = sqs.create_queue(
            QueueName="pagescribe-jobs",
            Attributes={
                "VisibilityTimeout": str(visibility_timeout),
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}),
            },
        )["QueueUrl"]
        notifications_url = sqs.create_queue(QueueName="pagescribe-uploads")["QueueUrl"]
        failures_url = sqs.create_queue(QueueName="pagescribe-upload-failures")["QueueUrl"]
        s3.put_bucket_notification_configuration(
            Bucket=self._bucket,
            NotificationConfiguration={
                "QueueConfigurations": [
                    {
                        "QueueArn": _queue_arn(sqs, notifications_url),
                        "Events": ["s3:ObjectCreated:*"],
                        "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "uploads/"}]}},
                    }
                ]
            },
        )
        os.environ.update(
            {"BUCKET_NAME": self._bucket, "QUEUE_URL": queue_url, "UPLOAD_FAILURES_QUEUE_URL": failures_url}
        )
        return LocalResources(
            endpoint, self._bucket, queue_url, _queue_arn(sqs, queue_url), notifications_url, failures_url
        )

    def stop(self) -> None:
        self._server.stop()


UPLOAD_INVOCATIONS = 3  # Lambda's asynchronous invocation: the first and two retries (MaximumRetryAttempts 2)


def destination_record(event: dict[str, Any], error: BaseException, invocations: int, function: str) -> dict[str, Any]:
    """What Lambda sends to an on-failure destination when it gives up on an asynchronous invocation."""
    return {
        "version": "1.0",
        "timestamp": datetime.now(UTC).isoformat(),
        "requestContext": {
            "requestId": str(uuid.uuid4()),
            "functionArn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function}:$LATEST",
            "condition": "RetriesExhausted",
            "approximateInvokeCount": invocations,
        },
        "requestPayload": event,
        "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
        "responsePayload": {"errorMessage": str(error), "errorType": type(error).__name__, "stackTrace": []},
    }


def _moto_server(host: str, port: int) -> ThreadedMotoServer:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:  # the Lambda functions never need moto: it is the 'local' extra
        raise LocalExtraMissing(
            "the local stack emulates AWS with moto, which is not installed: pip install 'pagescribe[local]'"
        ) from exc
    quicker_sqs()
    return ThreadedMotoServer(ip_address=host, port=port, verbose=False)


def quicker_sqs() -> None:
    """Take from moto's SQS (5.2) the work it need not do, beside the handlers it serves (AWS's pollers cost the
    function nothing): its clock, read through datetime objects (a few microseconds a reading), and read for every
    message of the queue whenever one of its attributes is (sending a message reads one; the approximate counts
    among them read the clock for each message), becomes ``time.time()``; and a received message's retention check,
    which computed every attribute of the queue three times over, reads the retention period alone. A receive of ten
    messages from a queue of fifty took 55-100 ms through moto's server (9-13 ms now), a SendMessageBatch of ten at
    that depth 11 ms in moto itself (4-5 ms now). What moto decides is unchanged (tests/unit/test_local_moto.py)."""
    from moto.core.utils import unix_time, unix_time_millis

    models: Any = importlib.import_module("moto.sqs.models")  # the names replaced here are not in its types

    def seconds(dt: datetime | None = None) -> float:
        return time.time() if dt is None else unix_time(dt)

    def milliseconds(dt: datetime | None = None) -> float:
        return time.time() * 1000.0 if dt is None else unix_time_millis(dt)

    def within_retention(backend: Any, queue_name: str, message: Any) -> bool:
        period = int(backend.get_queue(queue_name).message_retention_period)
        return bool(period + message.sent_timestamp / 1000 > time.time())

    models.unix_time, models.unix_time_millis = seconds, milliseconds
    setattr(models.SQSBackend, "is_message_valid_based_on_retention_period", within_retention)  # noqa: B010 (moto's)


def _queue_arn(sqs: Any, queue_url: str) -> str:
    return str(sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])


def receive_batch(sqs: Any, queue_url: str, wait_seconds: int = 0) -> list[dict[str, Any]]:
    """Up to ten messages, with their attributes, as the event source mapping receives them."""
    response = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_seconds, AttributeNames=["All"]
    )
    return [dict(m) for m in response.get("Messages", [])]


def delete_handled(sqs: Any, queue_url: str, messages: list[dict[str, Any]]) -> None:
    """Delete handled messages, up to ten per call, as the event source does."""
    for start in range(0, len(messages), 10):
        entries: list[DeleteMessageBatchRequestEntryTypeDef] = [
            {"Id": str(number), "ReceiptHandle": message["ReceiptHandle"]}
            for number, message in enumerate(messages[start : start + 10])
        ]
        response = sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
        for failure in response.get("Failed", []):  # such a message is simply delivered again
            log.warning("a handled message could not be deleted: %s", failure.get("Message"))


class SqsEventSource:
    """Lambda's SQS event source mapping for one queue and one handler: batches of up to ten messages, partial
    batch responses honoured. What succeeded is deleted; what failed stays in flight until its visibility timeout,
    as with the real mapping, or, with ``failed_visible_after`` set, becomes visible again after that many seconds
    (0 lets a test redeliver at once).

    With ``receive_ahead``, the mapping's calls are made on threads of their own, as its pollers work apart from the
    function: a long poll (AHEAD_WAIT_SECONDS) is always out for the next batch, from the start and while a batch is
    handled, and a handled batch's messages are deleted while the next one is; ``deliver``'s ``wait_seconds`` is then
    that long poll's."""

    AHEAD_WAIT_SECONDS = 1

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        queue_arn: str,
        handler: Handler,
        *,
        timeout_seconds: float,
        function_name: str,
        failed_visible_after: int | None = None,
        receive_ahead: bool = False,
    ) -> None:
        self._sqs = sqs
        self.queue_url = queue_url
        self._queue_arn = queue_arn
        self._handler = handler
        self._timeout_seconds = timeout_seconds
        self._function_name = function_name
        self._failed_visible_after = failed_visible_after
        self._ahead: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None
        self._next: Future[list[dict[str, Any]]] | None = None
        if receive_ahead:
            self._ahead = (ThreadPoolExecutor(1, "event-source-poll"), ThreadPoolExecutor(1, "event-source-delete"))
            self._next = self._poll_ahead()

    def deliver(self, wait_seconds: int = 0) -> tuple[int, dict[str, Any]]:
        """One batch → the handler; how many messages it held and the handler's response ({} when none)."""
        if self._next is not None:
            received, self._next = self._next, self._poll_ahead()  # a failed poll's error is raised once
            messages = received.result()
        else:
            messages = receive_batch(self._sqs, self.queue_url, wait_seconds)
        if not messages:
            return 0, {}
        response = dict(
            self._handler(
                sqs_event(messages, self._queue_arn), LambdaContext(self._timeout_seconds, self._function_name)
            )
        )
        if self._ahead is not None:
            self._ahead[1].submit(self._settle, messages, response).add_done_callback(_log_failure)
        else:
            self._settle(messages, response)
        return len(messages), response

    def close(self) -> None:
        """Wait for the calls made ahead (the long poll out: at most AHEAD_WAIT_SECONDS). Messages it received stay
        in flight until their visibility timeout, as when a poller stops."""
        if self._ahead is not None:
            for calls in self._ahead:
                calls.shutdown()

    def _poll_ahead(self) -> Future[list[dict[str, Any]]]:
        assert self._ahead is not None
        return self._ahead[0].submit(receive_batch, self._sqs, self.queue_url, self.AHEAD_WAIT_SECONDS)

    def _settle(self, messages: list[dict[str, Any]], response: dict[str, Any]) -> None:
        """Delete what the handler handled; what failed becomes visible again as the mapping is set to."""
        failed = {item["itemIdentifier"] for item in response.get("batchItemFailures", [])}
        delete_handled(self._sqs, self.queue_url, [m for m in messages if m["MessageId"] not in failed])
        if self._failed_visible_after is not None:
            for message in (m for m in messages if m["MessageId"] in failed):
                self._sqs.change_message_visibility(
                    QueueUrl=self.queue_url,
                    ReceiptHandle=message["ReceiptHandle"],
                    VisibilityTimeout=self._failed_visible_after,
                )


def _log_failure(settled: Future[None]) -> None:
    """A handled batch's deletes, made on the event source's thread, failed: said, as the thread has no caller."""
    if (error := settled.exception()) is not None:
        log.error("a handled batch's messages could not be deleted: %s", error, exc_info=error)


class LambdaService:
    """Plays the Lambda service for the three event-driven functions, one poll at a time; job batches received
    ahead with ``receive_ahead`` (SqsEventSource)."""

    def __init__(
        self,
        resources: LocalResources,
        *,
        upload: Handler,
        transcribe: Handler,
        sweeper: Handler,
        transcribe_timeout: float,
        sweep_every: float = 60.0,
        receive_ahead: bool = False,
    ) -> None:
        self._resources = resources
        self._upload = upload
        self._sweeper = sweeper
        self._sweep_every = sweep_every
        self._next_sweep = time.monotonic() + sweep_every
        self._sqs = boto3.client("sqs")
        self._jobs = SqsEventSource(
            self._sqs,
            resources.queue_url,
            resources.queue_arn,
            transcribe,
            timeout_seconds=transcribe_timeout,
            function_name="pagescribe-transcribe",
            receive_ahead=receive_ahead,
        )

    def close(self) -> None:
        self._jobs.close()

    def deliver_uploads(self) -> int:
        """S3 notifications → the upload function, invoked asynchronously as Lambda does: a failed invocation is
        tried again later, and after UPLOAD_INVOCATIONS failed ones the event goes to the on-failure destination
        as a destination record."""
        notifications = self._resources.notifications_url
        messages = receive_batch(self._sqs, notifications)
        for message in messages:
            event = json.loads(message["Body"])
            if event.get("Event") == "s3:TestEvent":  # S3 sends one when notifications are configured
                delete_handled(self._sqs, notifications, [message])
                continue
            try:
                self._upload(event, LambdaContext(120, "pagescribe-upload"))
            except Exception as exc:
                invocations = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
                if invocations < UPLOAD_INVOCATIONS:
                    log.exception("the upload function failed; the event will be tried again")
                    continue
                log.exception("the upload function failed %d times; the event goes to its destination", invocations)
                record = destination_record(event, exc, invocations, "pagescribe-upload")
                self._sqs.send_message(QueueUrl=self._resources.upload_failures_url, MessageBody=json.dumps(record))
            delete_handled(self._sqs, notifications, [message])
        return len(messages)

    def deliver_jobs(self, wait_seconds: int = 0) -> int:
        """One batch of up to ten job messages → the transcribe function, honouring partial failures:
        failed messages stay in flight until their visibility timeout, as with the real event source."""
        handled, _ = self._jobs.deliver(wait_seconds)
        return handled

    def sweep_if_due(self, *, force: bool = False) -> None:
        if force or time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self._sweep_every
            self._sweeper(dict(SCHEDULED_EVENT), LambdaContext(120, "pagescribe-sweeper"))

    def step(self, wait_seconds: int = 0) -> int:
        """Deliver what is waiting once; return how many messages were handled."""
        handled = self.deliver_uploads() + self.deliver_jobs(wait_seconds)
        self.sweep_if_due()
        return handled

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set. In-flight work is finished; anything left is the sweeper's."""
        while not stop.is_set():
            try:
                self.step(wait_seconds=1)
            except Exception:
                log.exception("a poll failed; polling goes on")
                stop.wait(1.0)
