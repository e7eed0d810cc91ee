"""Sweeper function, scheduled every minute: recovers expired leases, lost messages and orphaned documents."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from pagescribe.runtime import get_runtime
from pagescribe.settings import get_settings
from pagescribe.sweeping import SweepReport

get_settings()  # validate the configuration at cold start
logger = Logger()


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    runtime = get_runtime()
    report: SweepReport = runtime.sweeper.sweep(runtime.deadline(context.get_remaining_time_in_millis() / 1000))
    return asdict(report)
