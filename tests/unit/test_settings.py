"""The configuration model: validated once, with messages that name the bad values."""

from __future__ import annotations

import os
import re

import pytest
from pagescribe.settings import ConfigurationError, Settings, get_settings
from pydantic import SecretStr


def test_defaults_describe_a_working_configuration() -> None:
    settings = Settings()
    assert settings.provider_base_url == "https://openrouter.ai/api/v1"
    assert settings.provider_timeout_seconds == 180
    settings.check_model_call_time()


def test_a_provider_timeout_not_below_the_function_timeout_fails_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a provider timeout that would leave no time to write the result
    monkeypatch.setenv("PROVIDER_TIMEOUT_SECONDS", "300")
    monkeypatch.setenv("FUNCTION_TIMEOUT_SECONDS", "300")
    get_settings.cache_clear()
    # When the transcribe function checks its configuration at cold start
    with pytest.raises(ConfigurationError) as raised:
        get_settings().check_model_call_time()
    get_settings.cache_clear()
    # Then the message names both values
    message = str(raised.value)
    assert "PROVIDER_TIMEOUT_SECONDS=300" in message and "FUNCTION_TIMEOUT_SECONDS=300" in message


def test_any_positive_provider_timeout_is_accepted_without_a_hidden_cap() -> None:
    settings = Settings(provider_timeout_seconds=840, function_timeout_seconds=900)
    settings.check_model_call_time()
    assert settings.provider_timeout_seconds == 840


def test_a_function_that_never_calls_the_model_may_have_a_short_timeout() -> None:
    # The upload function (120 s) reads the same settings with the default 180 s provider timeout
    assert Settings(function_timeout_seconds=120).provider_timeout_seconds == 180


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_non_positive_provider_timeout_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVIDER_TIMEOUT_SECONDS", value)
    get_settings.cache_clear()
    with pytest.raises(ConfigurationError, match=f"PROVIDER_TIMEOUT_SECONDS: .*\\(got '{value}'\\)"):
        get_settings()
    get_settings.cache_clear()


def test_only_postgresql_is_accepted() -> None:
    with pytest.raises(ValueError, match="sqlite"):
        Settings(database_url="sqlite:///pagescribe.db")
    settings = Settings(database_url="postgresql://u:p@db:5432/pagescribe")
    assert settings.sqlalchemy_url == "postgresql+psycopg://u:p@db:5432/pagescribe"


def test_a_missing_required_value_is_named() -> None:
    with pytest.raises(ConfigurationError, match="QUEUE_URL"):
        Settings().require("queue_url")


def test_the_api_key_never_shows_in_a_repr() -> None:
    settings = Settings(provider_api_key=SecretStr("sk-or-secret-value"))
    assert "sk-or-secret-value" not in repr(settings) and "sk-or-secret-value" not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("memory_mb", "workers"),
    [(1024, 1), (1769, 1), (2048, 2), (10240, 2)],  # 2 = this machine's CPUs (nproc), the cap
)
def test_by_default_the_render_processes_are_what_the_function_memory_holds(memory_mb: int, workers: int) -> None:
    # Given a Lambda function's memory (AWS_LAMBDA_FUNCTION_MEMORY_SIZE) and the default 768 MB per render process
    settings = Settings(aws_lambda_function_memory_size=memory_mb)
    # Then as many render processes as fit beside the handler, at least one and at most the CPUs
    assert settings.render_worker_count() == min(workers, os.cpu_count() or 1)
    settings.check_render_memory()


def test_render_processes_that_do_not_fit_the_function_memory_fail_naming_the_values() -> None:
    # Given two render processes of 768 MB asked for in a 1024 MB function
    settings = Settings(aws_lambda_function_memory_size=1024, render_workers=2)
    # When the transcribe function checks its configuration at cold start
    with pytest.raises(ConfigurationError) as raised:
        settings.check_render_memory()
    # Then the message names every value that goes into the sum
    message = str(raised.value)
    assert "RENDER_WORKERS=2" in message and "RENDER_MEMORY_LIMIT_MB=768" in message
    assert "1024 MB (AWS_LAMBDA_FUNCTION_MEMORY_SIZE)" in message


def test_outside_lambda_the_render_processes_follow_the_cpus() -> None:
    assert Settings().render_worker_count() == min(os.cpu_count() or 1, 4)
    Settings().check_render_memory()


def test_an_escalation_model_needs_a_vision_model_provider() -> None:
    # Given an escalation model with no provider key (the offline OCR engine transcribes)
    settings = Settings(escalation_model="anthropic/claude-sonnet-4.5")
    # When a function that calls the model checks its configuration at cold start
    with pytest.raises(ConfigurationError) as raised:
        settings.check_escalation()
    # Then the message names the setting and why
    assert "ESCALATION_MODEL='anthropic/claude-sonnet-4.5'" in str(raised.value) and "offline" in str(raised.value)
    Settings(escalation_model="anthropic/claude-sonnet-4.5", provider_api_key=SecretStr("k")).check_escalation()


def test_an_empty_escalation_model_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # CloudFormation passes the empty default of the EscalationModel parameter as ""
    monkeypatch.setenv("ESCALATION_MODEL", "")
    get_settings.cache_clear()
    assert get_settings().escalation_model is None
    get_settings.cache_clear()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TEXT_LAYER", "sometimes"),
        ("FLAG_REPETITION_THRESHOLD", "1"),
        ("FLAG_REFUSAL_THRESHOLD", "1.5"),
        ("FLAG_UNGROUNDED_THRESHOLD", "-0.1"),
        ("FLAG_MISSED_TEXT_THRESHOLD", "1.5"),
        ("SECOND_READ", "sometimes"),
        ("CHUNK_MAX_TOKENS", "10"),
        ("CHUNK_OVERLAP", "256"),
    ],
)
def test_a_bad_check_setting_is_refused_by_name_and_value(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    get_settings.cache_clear()
    with pytest.raises(ConfigurationError, match=f"{variable}: .*\\(got '{re.escape(value)}'\\)"):
        get_settings()
    get_settings.cache_clear()


def test_an_ocr_language_whose_model_does_not_ship_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a recognition language RapidOCR would have to download a model for
    monkeypatch.setenv("OCR_LANGUAGE", "latin")
    get_settings.cache_clear()
    # When the configuration is validated at cold start
    with pytest.raises(ConfigurationError) as raised:
        get_settings()
    get_settings.cache_clear()
    # Then the message names the value and the languages that ship
    assert "OCR_LANGUAGE='latin'" in str(raised.value) and "ship: ch" in str(raised.value)


def test_a_database_url_with_a_wrong_scheme_is_refused_without_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a DATABASE_URL of another database, with a password in it
    monkeypatch.setenv("DATABASE_URL", "mysql://app:hunter2-s3cret@db.internal:3306/pages")

    # When the settings are validated at cold start
    with pytest.raises(ConfigurationError) as raised:
        get_settings()

    # Then the error names the variable and the scheme, and neither it nor anything it chains to holds the password
    message = str(raised.value)
    assert "DATABASE_URL" in message and "'mysql'" in message, message
    assert "hunter2" not in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
