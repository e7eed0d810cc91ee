"""What Bedrock charges per model: its answers carry tokens, not dollars, so pagescribe prices them.

Bedrock's on-demand prices in USD per million tokens (input, output) for us-east-1 (standard tier, no batch or
provisioned throughput discount), as https://aws.amazon.com/bedrock/pricing/ listed them in 2025; written down on
2026-12-06 without network access to that page, so check them against it before relying on them. Prices differ by
region and change: BEDROCK_PRICES (JSON, ``{"<model id>": {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}``) is
merged over this table, and a model that neither names is refused at cold start rather than recorded as free.

A cross-region inference profile (``us.``, ``eu.``, ``apac.``, ``global.``... before a model id) is priced as the model
it routes to unless BEDROCK_PRICES names the profile itself; an inference profile's ARN must be named there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SETTING = "BEDROCK_PRICES"
PROFILE_PREFIXES = ("us.", "us-gov.", "eu.", "apac.", "jp.", "au.", "ca.", "global.")


@dataclass(frozen=True)
class ModelPrice:
    """USD per million input (prompt, image included) and output (completion) tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1_000_000


DEFAULT_PRICES: dict[str, ModelPrice] = {
    "anthropic.claude-3-haiku-20240307-v1:0": ModelPrice(0.25, 1.25),
    "anthropic.claude-3-5-sonnet-20241022-v2:0": ModelPrice(3.0, 15.0),
    "anthropic.claude-3-7-sonnet-20250219-v1:0": ModelPrice(3.0, 15.0),
    "anthropic.claude-sonnet-4-20250514-v1:0": ModelPrice(3.0, 15.0),
    "anthropic.claude-opus-4-20250514-v1:0": ModelPrice(15.0, 75.0),
    "amazon.nova-lite-v1:0": ModelPrice(0.06, 0.24),
    "amazon.nova-pro-v1:0": ModelPrice(0.8, 3.2),
    "amazon.nova-premier-v1:0": ModelPrice(2.5, 12.5),
    "meta.llama3-2-11b-instruct-v1:0": ModelPrice(0.16, 0.16),
    "meta.llama3-2-90b-instruct-v1:0": ModelPrice(0.72, 0.72),
    "mistral.pixtral-large-2502-v1:0": ModelPrice(2.0, 6.0),
}


def parse_prices(text: str) -> dict[str, ModelPrice]:
    """BEDROCK_PRICES as a table; a value that is not one raises ValueError naming the setting and the entry."""
    if not text.strip():
        return {}
    try:
        raw: object = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{SETTING} is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(
            f'{SETTING} must be a JSON object {{"<model id>": {{"input_per_mtok": .., "output_per_mtok": ..}}}}'
        )
    return {str(model): _price(str(model), entry) for model, entry in raw.items()}


def _price(model: str, entry: Any) -> ModelPrice:
    keys = ("input_per_mtok", "output_per_mtok")
    values = [entry.get(key) if isinstance(entry, dict) else None for key in keys]
    prices = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0]
    if len(prices) != len(keys):
        raise ValueError(
            f"{SETTING}[{model!r}] must be {{'input_per_mtok': <USD>, 'output_per_mtok': <USD>}}, each >= 0"
        )
    return ModelPrice(prices[0], prices[1])


def price_of(model: str, overrides: dict[str, ModelPrice]) -> ModelPrice | None:
    """The model's price: BEDROCK_PRICES, else the defaults, for the id itself, then for the model an inference
    profile's id routes to; None when neither names it."""
    table = DEFAULT_PRICES | overrides
    if model in table:
        return table[model]
    for prefix in PROFILE_PREFIXES:
        if model.startswith(prefix) and model[len(prefix) :] in table:
            return table[model[len(prefix) :]]
    return None
