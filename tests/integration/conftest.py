"""Fixtures of the integration tests that more than one module uses."""

from __future__ import annotations

import pytest
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings

from tests.integration.test_api import API_KEY
from tests.support.pipeline import Pipeline


@pytest.fixture
def text_layer_api(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> Pipeline:
    """The pipeline with the API's key, each PDF page read off its own text layer where it has one (no model call)."""
    monkeypatch.setenv("API_KEY", API_KEY)
    monkeypatch.setenv("TEXT_LAYER", "auto")
    shutdown_runtime()
    get_settings.cache_clear()
    return pipeline
