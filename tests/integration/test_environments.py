"""The local stand-in for Lambda's execution environments (``pagescribe serve`` runs the API handler in them)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from pagescribe_local.environments import EnvironmentPool

pytestmark = pytest.mark.integration

STUB = "tests.support.stub_handler"


@pytest.fixture
def pool() -> Iterator[EnvironmentPool]:
    environments = EnvironmentPool(STUB, size=2, function_name="stub", timeout_seconds=5)
    yield environments
    environments.close()


def test_invocations_are_answered_by_warm_environments_one_at_a_time(pool: EnvironmentPool) -> None:
    # Given a pool of two environments
    # When twelve invocations arrive at once from six threads
    answers: list[dict[str, object]] = []
    start = threading.Barrier(6)

    def invoke(n: int) -> None:
        start.wait()
        for i in range(2):
            answers.append(pool.invoke({"echo": f"{n}-{i}"}))

    threads = [threading.Thread(target=invoke, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then each got its own answer, from at most two processes (started once, then reused warm)
    assert sorted(str(a["echo"]) for a in answers) == sorted(f"{n}-{i}" for n in range(6) for i in range(2))
    assert all(a["statusCode"] == 200 for a in answers)
    assert 1 <= len({a["body"] for a in answers}) <= 2


def test_a_handler_that_raises_is_a_502_and_its_environment_lives_on(pool: EnvironmentPool) -> None:
    first = pool.invoke({})
    failed = pool.invoke({"action": "raise"})
    assert failed["statusCode"] == 502 and failed["body"] == '{"message": "Internal server error"}'
    assert pool.invoke({})["body"] == first["body"]  # the same warm environment


def test_an_environment_that_dies_is_a_502_and_is_replaced(pool: EnvironmentPool) -> None:
    first = pool.invoke({})
    died = pool.invoke({"action": "exit"})
    assert died["statusCode"] == 502
    after = pool.invoke({})
    assert after["statusCode"] == 200 and after["body"] != first["body"]


def test_an_invocation_past_the_integration_timeout_is_a_504_and_its_environment_is_stopped(
    pool: EnvironmentPool,
) -> None:
    first = pool.invoke({})
    hung = pool.invoke({"action": "hang"})
    assert hung["statusCode"] == 504 and hung["body"] == '{"message": "Endpoint request timed out"}'
    assert hung["headers"]["x-amzn-ErrorType"] == "IntegrationTimeoutException"
    after = pool.invoke({})
    assert after["statusCode"] == 200 and after["body"] != first["body"]  # a new environment, not the hung one
