"""CloudWatch metrics (embedded metric format through Powertools), flushed once per invocation.

They are CloudWatch's: emitted only where the code runs in Lambda (which sets ``AWS_LAMBDA_FUNCTION_NAME``) and
``POWERTOOLS_METRICS_DISABLED`` does not turn them off. Anywhere else (``pagescribe transcribe`` on a terminal, the
local stack, a script) they are not recorded at all: Powertools prints a metric set that reaches 100 values, and a
single metric, whatever that setting says."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from aws_lambda_powertools import Metrics, single_metric
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

NAMESPACE = "Pagescribe"

metrics = Metrics(namespace=NAMESPACE, service="pagescribe")

R = TypeVar("R")


def emitting() -> bool:
    """Metrics are recorded: in Lambda, unless POWERTOOLS_METRICS_DISABLED (or POWERTOOLS_DEV) turns them off."""
    return bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME")) and not is_metrics_disabled()


def publish_metrics(handler: Callable[[Any, Any], R]) -> Callable[[Any, Any], R]:
    """Flush the invocation's metrics when the handler returns or raises (Powertools' ``log_metrics``, without its
    warning about an empty set: outside Lambda the set is always empty)."""

    @functools.wraps(handler)
    def publishing(event: Any, context: Any) -> R:
        try:
            return handler(event, context)
        finally:
            if metrics.metric_set:
                metrics.flush_metrics()

    return publishing


def count(name: str, value: float = 1) -> None:
    if emitting():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


def count_for_model(name: str, model: str, value: float = 1) -> None:
    """``name`` counted twice: in the function's own metrics, and at once under a Model dimension (spend and the 429
    rate per model on the dashboard). ``model``: the model that ran."""
    if not emitting():
        return
    count(name, value)
    with single_metric(
        name=name, unit=MetricUnit.Count, value=value, namespace=NAMESPACE, default_dimensions={"Model": model}
    ):
        pass


def gauge(name: str, value: float) -> None:
    """A level (the dashboard and alarms read its Maximum), not a count."""
    if emitting():
        metrics.add_metric(name=name, unit=MetricUnit.Percent, value=value)


def milliseconds(name: str, value: float) -> None:
    if emitting():
        metrics.add_metric(name=name, unit=MetricUnit.Milliseconds, value=value)


def flag_metric(flag: str) -> str:
    """The metric counting answers that raised ``flag``: ``text_layer_mismatch`` → ``FlagTextLayerMismatch``."""
    return "Flag" + "".join(part.capitalize() for part in flag.split("_"))


def count_flags(flags: Iterable[str]) -> None:
    for flag in flags:
        count(flag_metric(flag))
