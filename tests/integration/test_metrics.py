"""CloudWatch metrics: emitted where the handlers run in Lambda, naming the model that ran; nowhere else."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings

from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration


def _transcribe_a_scan(pipeline: Pipeline, corpus: Path) -> None:
    shutdown_runtime()
    get_settings.cache_clear()
    [doc] = pipeline.upload("uploads/smile.png", corpus / "smile.png")["documents"]
    pipeline.run_until_idle()
    assert doc["pages"] == 1


def _emf(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith('{"_aws"')]


@pytest.mark.parametrize(
    ("provider", "ran"),
    [
        pytest.param("openai-compatible", "test/vision-model", id="vision-model"),
        pytest.param(
            "offline", f"rapidocr-{metadata.version('rapidocr')}", id="offline-engine", marks=pytest.mark.offline_ocr
        ),
    ],
)
def test_in_lambda_the_per_model_metrics_name_the_model_that_ran(
    pipeline: Pipeline,
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    provider: str,
    ran: str,
) -> None:
    # Given the transcribe function in Lambda (which sets AWS_LAMBDA_FUNCTION_NAME), MODEL naming a vision model,
    # and pages read by that model or by the offline engine
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "pagescribe-transcribe")
    monkeypatch.setenv("PROVIDER", provider)
    # When a scan is transcribed
    _transcribe_a_scan(pipeline, corpus)
    # Then its metrics are printed as CloudWatch's embedded metric format, for CloudWatch to collect
    emf = _emf(capfd.readouterr().out)
    per_model = [e for e in emf if "Model" in e]
    # And each metric with a Model dimension names the model that read the page
    assert {e["Model"] for e in per_model} == {ran}
    assert sum(sum(e["ModelCalls"]) for e in per_model if "ModelCalls" in e) == 1
    assert any("PagesCompleted" in e for e in emf)


def test_outside_lambda_no_metric_is_printed(
    pipeline: Pipeline, corpus: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given the handlers run outside Lambda (a terminal, the local stack), with metrics not even turned off
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    # When a scan is transcribed
    _transcribe_a_scan(pipeline, corpus)
    # Then no metric reaches stdout or stderr
    captured = capfd.readouterr()
    assert '"_aws"' not in captured.out + captured.err
