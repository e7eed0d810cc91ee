"""The offline engine as the settings' defaults configure it (the settings are the only source of defaults)."""

from __future__ import annotations

import os
from typing import Any

from pagescribe.providers.offline import RapidOcrProvider
from pagescribe.settings import Settings


def offline(**overrides: Any) -> RapidOcrProvider:
    """The engine with the settings' defaults, and the threads OCR_THREADS asks for (tests/conftest.py sets 1)."""
    defaults = Settings.model_fields
    options = {
        "language": defaults["ocr_language"].default,
        "page_numbers": defaults["page_numbers"].default,
        "orient": defaults["detect_orientation"].default,
        "threads": int(os.environ.get("OCR_THREADS", defaults["ocr_threads"].default)),
    }
    return RapidOcrProvider(**{**options, **overrides})
