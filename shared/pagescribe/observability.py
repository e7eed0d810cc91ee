"""CloudWatch metrics (embedded metric format through Powertools), flushed once per invocation."""

from __future__ import annotations

from collections.abc import Iterable

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

NAMESPACE = "Pagescribe"

metrics = Metrics(namespace=NAMESPACE, service="pagescribe")


def count(name: str, value: float = 1) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


def milliseconds(name: str, value: float) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Milliseconds, value=value)


def flag_metric(flag: str) -> str:
    """The metric counting answers that raised ``flag``: ``text_layer_mismatch`` → ``FlagTextLayerMismatch``."""
    return "Flag" + "".join(part.capitalize() for part in flag.split("_"))


def count_flags(flags: Iterable[str]) -> None:
    for flag in flags:
        count(flag_metric(flag))
