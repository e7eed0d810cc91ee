"""The offline engine as the settings' defaults configure it (the settings are the only source of defaults)."""

from __future__ import annotations

from typing import Any

from pagescribe.providers.offline import RapidOcrProvider
from pagescribe.settings import Settings


def offline(**overrides: Any) -> RapidOcrProvider:
    defaults = Settings.model_fields
    options = {
        "language": defaults["ocr_language"].default,
        "page_numbers": defaults["page_numbers"].default,
        "orient": defaults["detect_orientation"].default,
    }
    return RapidOcrProvider(**{**options, **overrides})
