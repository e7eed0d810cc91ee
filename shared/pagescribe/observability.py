"""CloudWatch metrics (embedded metric format through Powertools), flushed once per invocation."""

from __future__ import annotations

from collections.abc import Iterable

from aws_lambda_powertools import Metrics, single_metric
from aws_lambda_powertools.metrics import MetricUnit

NAMESPACE = "Pagescribe"

metrics = Metrics(namespace=NAMESPACE, service="pagescribe")


def count(name: str, value: float = 1) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


def count_for_model(name: str, model: str, value: float = 1) -> None:
    """``name`` counted twice: in the function's own metrics, and at once under a Model dimension (spend and the 429
    rate per model on the dashboard)."""
    count(name, value)
    with single_metric(
        name=name, unit=MetricUnit.Count, value=value, namespace=NAMESPACE, default_dimensions={"Model": model}
    ):
        pass


def gauge(name: str, value: float) -> None:
    """A level (the dashboard and alarms read its Maximum), not a count."""
    metrics.add_metric(name=name, unit=MetricUnit.Percent, value=value)


def milliseconds(name: str, value: float) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Milliseconds, value=value)


def flag_metric(flag: str) -> str:
    """The metric counting answers that raised ``flag``: ``text_layer_mismatch`` → ``FlagTextLayerMismatch``."""
    return "Flag" + "".join(part.capitalize() for part in flag.split("_"))


def count_flags(flags: Iterable[str]) -> None:
    for flag in flags:
        count(flag_metric(flag))
