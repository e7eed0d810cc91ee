"""Drive the real handlers the way AWS does: S3 notifications into upload, SQS batches into transcribe."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagescribe.handlers import transcribe as transcribe_app
from pagescribe.handlers import upload as upload_app
from pagescribe_local.stack import SCHEDULED_EVENT, SqsEventSource

from tests.support.aws_events import LambdaContext, s3_put_event

REPO = Path(__file__).resolve().parents[2]


INIT_ALLOWANCE_SECONDS = 120.0  # a new environment's start and imports, on a machine as busy as CI's


@dataclass
class Pipeline:
    s3: Any
    sqs: Any
    bucket: str
    queue_url: str
    queue_arn: str
    upload_failures_url: str  # the upload function's on-failure destination, which the sweeper drains
    function_timeout: float = 60.0

    def put(self, key: str, data: bytes | Path) -> dict[str, Any]:
        """Put an object and return the S3 notification AWS would send for it."""
        body = data.read_bytes() if isinstance(data, Path) else data
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)
        head = self.s3.head_object(Bucket=self.bucket, Key=key)
        return s3_put_event(self.bucket, key, size=head["ContentLength"], etag=head["ETag"].strip('"'))

    def upload(self, key: str, data: bytes | Path) -> dict[str, Any]:
        event = self.put(key, data)
        return dict(upload_app.handler(event, LambdaContext(120)))

    def receive(self, max_messages: int = 10) -> list[dict[str, Any]]:
        response = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=0,
            AttributeNames=["All"],
        )
        return list(response.get("Messages", []))

    def receive_all(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        while batch := self.receive():
            messages.extend(batch)
        return messages

    def invoke_transcribe(self, event: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return dict(transcribe_app.handler(event, LambdaContext(timeout or self.function_timeout)))

    def start_in_new_environment(
        self, function: str, event: dict[str, Any], timeout: float | None = None, *, linger: bool = False
    ) -> subprocess.Popen[str]:
        """Start one invocation in its own process (its own execution environment); the event is sent. With
        ``linger`` the environment stays warm after answering, until it is sent a signal."""
        command = [sys.executable, "-m", "tests.support.invoke", function, str(timeout or self.function_timeout)]
        command += ["linger"] if linger else []
        with tempfile.TemporaryFile("w+") as stdin:
            json.dump(event, stdin)
            stdin.seek(0)
            return subprocess.Popen(command, cwd=REPO, stdin=stdin, stdout=subprocess.PIPE, text=True)

    def invoke_in_new_environments(self, function: str, event: dict[str, Any], count: int) -> list[dict[str, Any]]:
        """Invoke ``function`` ``count`` times at once, each in its own process, all with the same event."""
        processes = [self.start_in_new_environment(function, event) for _ in range(count)]
        # a guard against a hung process, not a measure: the function's time plus the process's start and imports (an
        # environment's init, which Lambda does not count in the invocation's time and a busy machine slows)
        outputs = [p.communicate(timeout=self.function_timeout + INIT_ALLOWANCE_SECONDS)[0] for p in processes]
        assert all(p.returncode == 0 for p in processes), outputs
        return [json.loads(out.strip().splitlines()[-1]) for out in outputs]

    def run_until_idle(self, *, max_rounds: int = 200) -> list[dict[str, Any]]:
        """Poll the queue with the local stack's event source mapping, except that failed messages are visible
        again at once instead of after their visibility timeout. Returns the handler responses."""
        source = SqsEventSource(
            self.sqs,
            self.queue_url,
            self.queue_arn,
            transcribe_app.handler,
            timeout_seconds=self.function_timeout,
            function_name="pagescribe-transcribe",
            failed_visible_after=0,
        )
        responses: list[dict[str, Any]] = []
        for _ in range(max_rounds):
            handled, response = source.deliver()
            if not handled:
                return responses
            responses.append(response)
        raise AssertionError(f"the queue did not drain in {max_rounds} rounds")

    def sweep(self) -> dict[str, Any]:
        from pagescribe.handlers import sweeper as sweeper_app

        return dict(sweeper_app.handler(SCHEDULED_EVENT, LambdaContext(120)))

    def transcript(self, document_id: str) -> tuple[str, dict[str, Any]]:
        md = self.s3.get_object(Bucket=self.bucket, Key=f"transcripts/{document_id}.md")["Body"].read()
        js = self.s3.get_object(Bucket=self.bucket, Key=f"transcripts/{document_id}.json")["Body"].read()
        return md.decode("utf-8"), json.loads(js)
