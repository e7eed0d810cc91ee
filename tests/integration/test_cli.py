"""The local commands as a user runs them: real subprocesses, the fake provider, PostgreSQL, plain HTTP."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import resource
import signal
import socket
import time
from pathlib import Path
from typing import Any

import boto3
import httpx
import pypdfium2 as pdfium
import pytest
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe.sources.textlayer import extract_text_layer
from pagescribe.store.postgres import Database
from PIL import Image

from tests.fakes.chat_server import FakeChatServer, Ok, expected_text
from tests.support.answers import captured
from tests.support.commands import command_environment, pagescribe, start_serve

pytestmark = pytest.mark.integration


def test_transcribe_writes_the_pages_in_order(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given a 4-page PDF and a provider that names the image it was sent
    source = corpus / "pdflatex-4-pages.pdf"
    # When the user runs pagescribe transcribe on it (afresh: another test may have left a transcript of it to reuse)
    env = command_environment(database_url, fake_provider)
    result = pagescribe("transcribe", str(source), "--out", "out", "--no-reuse", env=env, cwd=tmp_path)
    # Then it exits 0, says where it wrote, and the markdown has every page in order with its own text
    assert result.returncode == 0, result.stderr
    assert "wrote out/pdflatex-4-pages.md" in result.stderr
    markdown = (tmp_path / "out" / "pdflatex-4-pages.md").read_text()
    assert re.findall(r"<!-- page (\d) of 4", markdown) == ["1", "2", "3", "4"]
    texts = [expected_text(render_page(source, DocumentKind.PDF, n).data) for n in range(1, 5)]
    assert [markdown.index(t) for t in texts] == sorted(markdown.index(t) for t in texts)
    assert fake_provider.calls == 4


def test_transcribe_fails_clearly_on_a_password_protected_pdf(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    result = pagescribe(
        "transcribe",
        str(corpus / "libreoffice-writer-password.pdf"),
        env=command_environment(database_url, fake_provider),
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "libreoffice-writer-password.pdf: FAILED: the PDF is password-protected" in result.stderr
    assert fake_provider.calls == 0 and not list(tmp_path.glob("*.md"))


@pytest.mark.offline_ocr
def test_transcribe_with_every_page_read_a_second_time_reads_at_the_commands_own_priority(
    database_url: str, fake_provider: FakeChatServer, tmp_path: Path
) -> None:
    # Given a scan, a provider that answers it with its true text once the command's reading process is up (a memory
    # limit of its own tells that process from the render processes), and what priority that process runs at
    scan = Path(__file__).resolve().parents[1] / "data" / "documents" / "phototest.tif"
    truth = scan.with_suffix(".txt").read_text(encoding="utf-8")
    env = {**command_environment(database_url, fake_provider), "SECOND_READ_MEMORY_LIMIT_MB": "1537"}
    below: list[int] = []

    def answer_once_read(body: dict[str, Any], image: bytes) -> Ok:
        below.append(_below_us(_render_worker(1537, timeout=60)))
        return Ok(text=truth)

    fake_provider.route(answer_once_read)
    # When the user asks for every page to be read a second time (on a laptop, beside whatever else it runs)
    result = pagescribe(
        "transcribe", str(scan), "--second-read", "always", "--json", "--no-reuse", env=env, cwd=tmp_path
    )
    # Then the read ran at the command's own priority, not below it (where other work could starve it past the
    # page's deadline), and the page's answer is grounded to it
    assert result.returncode == 0, result.stderr
    assert below == [0]
    [page] = json.loads((tmp_path / "phototest.json").read_text())["pages"]
    assert page["grounding"]["source"] == "second_read", page["grounding"]


def _render_worker(memory_limit_mb: int, *, timeout: float) -> int:
    """The pid of a render process started with ``memory_limit_mb`` (its command line: ``-m pagescribe.render_worker
    <reply fd> <memory limit> [niceness]``) once it has set itself up: it takes its priority, then limits its address
    space (at most ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):  # the process ended meanwhile
                words = cmdline.read_bytes().decode(errors="replace").split("\0")
                module = words.index("pagescribe.render_worker") if "pagescribe.render_worker" in words[:-2] else -1
                pid = int(cmdline.parent.name)
                ours = module >= 0 and words[module + 2] == str(memory_limit_mb)
                if ours and resource.prlimit(pid, resource.RLIMIT_AS)[0] == memory_limit_mb << 20:
                    return pid
        time.sleep(0.05)
    raise AssertionError(f"no render process set up with a memory limit of {memory_limit_mb} MB in {timeout:g} s")


def _below_us(pid: int) -> int:
    """How far below this process's priority ``pid`` runs (its niceness less ours)."""
    return os.getpriority(os.PRIO_PROCESS, pid) - os.getpriority(os.PRIO_PROCESS, 0)


def test_transcribe_names_a_missing_file(database_url: str, fake_provider: FakeChatServer, tmp_path: Path) -> None:
    result = pagescribe("transcribe", "nope.pdf", env=command_environment(database_url, fake_provider), cwd=tmp_path)
    assert result.returncode == 2 and "no such file: nope.pdf" in result.stderr


def test_serve_never_writes_down_a_query_string_where_a_client_may_have_put_its_key(
    database_url: str, fake_provider: FakeChatServer, tmp_path: Path
) -> None:
    # Given pagescribe serve writing its access log to a file
    with (tmp_path / "serve.log").open("w") as log:
        server, endpoints = start_serve(database_url, fake_provider, tmp_path, log=log)
        try:
            # When a client sends its key in the query string too (the key counts only in the header)
            listed = httpx.get(
                f"{endpoints['api']}/documents",
                params={"x-api-key": "local-key-in-a-query-string", "limit": "1"},
                headers={"x-api-key": "local-key"},
            )
        finally:
            server.send_signal(signal.SIGINT)
            assert server.wait(timeout=60) == 0
    # Then the request was answered and logged, without its query string
    assert listed.status_code == 200
    written = (tmp_path / "serve.log").read_text()
    assert 'api: "GET /documents?... HTTP/1.1" 200' in written and "local-key-in-a-query-string" not in written


def test_serve_is_used_like_the_deployed_stack(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given pagescribe serve running, with an API key
    server, endpoints = start_serve(database_url, fake_provider, tmp_path)
    try:
        api, headers = endpoints["api"], {"x-api-key": "local-key"}
        # When a user creates a document over HTTP and PUTs the file to the presigned URL
        assert (
            httpx.post(f"{api}/documents", json={"filename": "x.pdf", "content_type": "application/pdf"}).status_code
            == 401
        )
        created = httpx.post(
            f"{api}/documents", json={"filename": "four pages.pdf", "content_type": "application/pdf"}, headers=headers
        ).json()
        put = httpx.put(
            created["upload_url"],
            content=(corpus / "pdflatex-4-pages.pdf").read_bytes(),
            headers=created["upload_headers"],
        )
        assert put.status_code == 200
        # Then polling the status sees it complete, and the transcript is served
        deadline = time.monotonic() + 120
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = httpx.get(f"{api}/documents/{created['document_id']}", headers=headers).json()
            if status["status"] in {"COMPLETED", "PARTIAL", "FAILED"}:
                break
            time.sleep(0.5)
        assert status["status"] == "COMPLETED" and status["pages"]["COMPLETED"] == 4
        transcript = httpx.get(f"{api}/documents/{created['document_id']}/transcript", headers=headers)
        assert transcript.status_code == 200 and transcript.text.count("<!-- page ") == 4
        assert transcript.headers["content-type"] == "text/markdown; charset=utf-8"  # the handler's headers reach it
        # And the S3 endpoint it printed works with boto3
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoints["aws_endpoint"],
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
        )
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=endpoints["bucket"], Prefix="transcripts/")["Contents"]]
        assert f"transcripts/{created['document_id']}.md" in keys
    finally:
        # When the user presses Ctrl-C, it stops cleanly
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0


def _raw_request(port: int, head: str) -> bytes:
    """Send a request's head and no body; what the server answers before the connection ends (or in 60 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        connection.sendall(head.encode())
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        return answer


def test_serve_checks_the_key_and_the_length_before_reading_a_body_and_keeps_s3_on_loopback(
    database_url: str, fake_provider: FakeChatServer, tmp_path: Path
) -> None:
    # Given pagescribe serve exposed on every address, with an API key, started with SIGINT ignored (as a shell
    # script's `pagescribe serve &` is)
    server, endpoints = start_serve(database_url, fake_provider, tmp_path, "--host", "0.0.0.0", sigint_ignored=True)
    try:
        port = int(endpoints["api"].rsplit(":", 1)[1])
        post = "POST /documents HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

        # When a client announces a megabyte with a wrong key, a malformed length, or a gigabyte, and sends no body
        wrong_key = _raw_request(port, post + "x-api-key: nope\r\nContent-Length: 1000000\r\n\r\n")
        malformed = _raw_request(port, post + "x-api-key: local-key\r\nContent-Length: 12abc\r\n\r\n")
        huge = _raw_request(port, post + "x-api-key: local-key\r\nContent-Length: 1000000000\r\n\r\n")

        # Then each is answered at once, without waiting for the body, and the connection is closed
        assert wrong_key.startswith(b"HTTP/1.1 403") and b"invalid API key" in wrong_key, wrong_key
        assert malformed.startswith(b"HTTP/1.1 400") and b"Content-Length" in malformed, malformed
        assert huge.startswith(b"HTTP/1.1 413"), huge
        assert all(b"Connection: close" in answer for answer in (wrong_key, malformed, huge))
        # And the S3/SQS endpoint, which takes no credentials, listens on the loopback address only
        assert endpoints["aws_endpoint"].startswith("http://127.0.0.1:"), endpoints
    finally:
        # And SIGINT stops it all the same
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0


def test_markdown_on_stdout_stays_clean_on_a_long_document(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given a 100-page PDF (the handlers' metrics reach Powertools' 100-value flush on the way)
    source = pdfium.PdfDocument(corpus / "pdflatex-4-pages.pdf")
    long = pdfium.PdfDocument.new()
    for _ in range(25):
        long.import_pages(source)
    long.save(tmp_path / "long.pdf")
    long.close()
    source.close()
    # When it is transcribed with the markdown on stdout
    result = pagescribe(
        "transcribe", "long.pdf", "--out", "-", env=command_environment(database_url, fake_provider), cwd=tmp_path
    )
    # Then stdout is the markdown and nothing else
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("<!-- pagescribe document ")
    assert '"_aws"' not in result.stdout and len(re.findall(r"<!-- page \d+ of 100 ", result.stdout)) == 100


def test_transcribe_escalates_a_looping_page_and_prints_one_line_per_flagged_page(
    database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given a model that loops on page 2 of a 4-page PDF (a captured real loop) and transcribes the others faithfully
    source = corpus / "pdflatex-4-pages.pdf"
    pages = {hashlib.sha256(render_page(source, DocumentKind.PDF, n).data).hexdigest(): n for n in range(1, 5)}
    loop = captured("repetition")[0]

    def rule(body: dict[str, Any], image: bytes) -> Ok:
        page = pages[hashlib.sha256(image).hexdigest()]
        looping = page == 2 and body["model"] == "test/vision-model"
        return Ok(text=loop if looping else extract_text_layer(source, page))

    fake_provider.route(rule)
    env = command_environment(database_url, fake_provider)
    # When the user transcribes it afresh (an earlier test's transcript of the same file, on the same models, may be in
    # this database: it would be reused) without an escalation model, then with one
    without = pagescribe("transcribe", str(source), "--out", "a", "--no-reuse", env=env, cwd=tmp_path)
    escalated = pagescribe(
        "transcribe",
        str(source),
        "--out",
        "b",
        "--escalation-model",
        "test/strong-model",
        "--no-reuse",
        env=env,
        cwd=tmp_path,
    )
    # Then without, page 2 fails on its flag, the document is partial, and the last line names the page and its flags
    assert without.returncode == 1
    last = without.stderr.strip().splitlines()[-1]
    assert last.startswith("pdflatex-4-pages.pdf page 2: FAILED: repetition=") and "(threshold 8)" in last
    # And with it, page 2 was asked once more on the escalation model, completed, and its line still says why
    assert escalated.returncode == 0, escalated.stderr
    last = escalated.stderr.strip().splitlines()[-1]
    assert last.startswith("pdflatex-4-pages.pdf page 2: COMPLETED (escalated): repetition=")
    assert [r.body["model"] for r in fake_provider.received if r.body].count("test/strong-model") == 1
    markdown = (tmp_path / "b" / "pdflatex-4-pages.md").read_text()
    assert "test/strong-model; escalated) flags: repetition=" in markdown


@pytest.mark.offline_ocr
def test_transcribe_to_stdout_prints_only_its_own_lines_on_stderr(
    database_url: str, fake_provider: FakeChatServer, tmp_path: Path
) -> None:
    # Given the README's first command: the sample, read by the offline engine, the markdown on stdout, and
    # nothing in the environment that turns metrics off
    sample = Path(__file__).resolve().parents[2] / "samples" / "minimal-document.pdf"
    env = {**command_environment(database_url, fake_provider), "PROVIDER": "offline"}
    env.pop("POWERTOOLS_METRICS_DISABLED", None)
    # When it runs
    result = pagescribe("transcribe", str(sample), "--out", "-", env=env, cwd=tmp_path)
    # Then stderr holds the command's own lines only (what reads the pages, then the document's progress and
    # result): no metrics, no warnings
    assert result.returncode == 0, result.stderr
    first, *rest = result.stderr.splitlines()
    assert first == "pagescribe: offline:rapidocr (offline OCR); database: DATABASE_URL", result.stderr
    assert rest and all(line.startswith("minimal-document.pdf ") for line in rest), result.stderr
    assert rest[-1].endswith("COMPLETED"), result.stderr
    # And stdout is the markdown
    assert result.stdout.startswith("<!-- pagescribe document ") and '"_aws"' not in result.stdout


@pytest.mark.offline_ocr
def test_an_upside_down_scan_is_read_upright_by_the_offline_engine_and_flagged_rotated(
    database_url: str, fake_provider: FakeChatServer, tmp_path: Path
) -> None:
    # Given a real slide scanned upside down (its image turned by 180 degrees), and no vision model
    slide = render_page(
        Path(__file__).resolve().parents[1] / "data" / "documents" / "sommerakademie-2016-slides.pdf",
        DocumentKind.PDF,
        10,
        image_format="png",
    )
    with Image.open(io.BytesIO(slide.data)) as upright:
        upright.rotate(180).save(tmp_path / "slide.png")
    env = {**command_environment(database_url, fake_provider), "PROVIDER": "offline"}
    # When the user transcribes it with the offline engine
    result = pagescribe("transcribe", "slide.png", "--out", "out", "--json", env=env, cwd=tmp_path)
    # Then the page reads upright, and everywhere it shows it was turned: the JSON flags, the marker, the CLI's line
    assert result.returncode == 0, result.stderr
    [page] = json.loads((tmp_path / "out" / "slide.json").read_text())["pages"]
    assert {"flag": "rotated", "value": 180.0, "threshold": 0.0} in page["flags"]
    assert page["text"].startswith("# ImageNet / ILSVRC 2014")
    # And the engine's mean recognition confidence is recorded with the kept answer and with its call
    assert page["confidence"] > 0.9 and [a["confidence"] for a in page["attempts"]] == [page["confidence"]]
    assert "flags: rotated=180" in (tmp_path / "out" / "slide.md").read_text()
    assert result.stderr.strip().splitlines()[-1].startswith("slide.png page 1: COMPLETED: rotated=180")
    assert fake_provider.calls == 0


def test_estimate_then_a_capped_run_then_the_tenants_budget(
    database_url: str, db: Database, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    env = command_environment(database_url, fake_provider)
    source = corpus / "pdflatex-4-pages.pdf"
    fake_provider.set_default(Ok(cost=0.0001))
    # Given no call of the model yet: the estimate is unknown and nothing is started
    unknown = pagescribe("transcribe", str(source), "--estimate", env=env, cwd=tmp_path)
    assert unknown.returncode == 0, unknown.stderr
    assert "pdflatex-4-pages.pdf: 4 pages x " in unknown.stdout and "estimate: unknown" in unknown.stdout
    assert fake_provider.calls == 0

    # When the document is transcribed with a cap that holds a first call of unknown price, then a second call held
    # at its worst case (0.0001 per 1,000 prompt tokens, 0.0001 per 4 completion tokens at MAX_OUTPUT_TOKENS=4), but
    # not a third
    env["MAX_OUTPUT_TOKENS"] = "4"
    capped = pagescribe("transcribe", str(source), "--max-cost", "0.00035", "--out", "out", env=env, cwd=tmp_path)

    # Then two pages are paid for, the others are skipped, and the command says so and fails
    assert capped.returncode == 1 and fake_provider.calls == 2
    assert "PARTIAL: 2 of 4 pages skipped, not started: budget: the document's max_cost_usd" in capped.stderr
    # And the estimate now rests on those calls
    known = pagescribe("transcribe", str(source), "--pages", "1-3", "--estimate", env=env, cwd=tmp_path)
    assert "3 pages x " in known.stdout and "estimate: $0.000300" in known.stdout, known.stdout
    # And in the batch lane at the batch price (BATCH_PRICE_FACTOR, half by default); a deadline needs its offset
    batch = pagescribe(
        "transcribe", str(source), "--pages", "1-3", "--lane", "batch", "--estimate", env=env, cwd=tmp_path
    )
    assert "estimate: $0.000150" in batch.stdout and "at the batch price" in batch.stdout, batch.stdout
    naive = pagescribe("transcribe", str(source), "--deadline", "2099-01-01T00:00", "--estimate", env=env, cwd=tmp_path)
    assert naive.returncode == 2 and "give the time with its offset" in naive.stderr, naive.stderr

    # When an operator sets a tenant's daily budget, it is shown with today's spend
    budget = pagescribe("tenants", "budget", "--tenant", "default", "--usd", "5", env=env, cwd=tmp_path)
    assert budget.returncode == 0, budget.stderr
    shown = json.loads(budget.stdout)
    assert shown["daily_budget_usd"] == 5 and shown["calls_today"] == 2
    assert shown["spent_today_usd"] == pytest.approx(0.0002)
    refused = pagescribe("tenants", "budget", "--tenant", "default", "--usd", "-1", env=env, cwd=tmp_path)
    assert refused.returncode == 2 and "'-1': an amount in USD is between 0 and 1000000" in refused.stderr
