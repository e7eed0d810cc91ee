"""Invariants of the SAM template (template.yaml) that `sam validate --lint` cannot see.

The template is parsed as YAML with CloudFormation's short-form tags (!Ref, !Sub, !GetAtt, ...) mapped to
their long form ({"Ref": ...}, {"Fn::Sub": ...}, {"Fn::GetAtt": [...]}); nothing here talks to AWS.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any, cast, get_args

import pytest
import yaml
from pagescribe_local.stack import BUCKET_CORS_RULES

TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "template.yaml"

# pagescribe.settings.Settings.result_reserve_seconds: time kept back from every model call to write its result.
RESULT_RESERVE_SECONDS = 10
FUNCTIONS = ("UploadFunction", "TranscribeFunction", "ApiFunction", "SweeperFunction", "MigrateFunction")
CODE_URIS = {
    "UploadFunction": "functions/upload/",
    "TranscribeFunction": "functions/transcribe/",
    "ApiFunction": "functions/api/",
    "SweeperFunction": "functions/sweeper/",
    "MigrateFunction": "functions/migrate/",
}
# Functions that must not start before the schema exists (MigrateFunction creates it, so it cannot wait).
SCHEMA_DEPENDENT_FUNCTIONS = ("UploadFunction", "TranscribeFunction", "ApiFunction", "SweeperFunction")
API_ROUTES = {
    ("post", "/documents"),
    ("get", "/documents"),
    ("get", "/documents/{id}"),
    ("get", "/documents/{id}/transcript"),
    ("post", "/documents/{id}/retry"),
    ("get", "/documents/{id}/pages/{page}/image"),
    ("post", "/documents/{id}/pages/{page}/rerun"),
    ("put", "/documents/{id}/pages/{page}/correction"),
    ("get", "/health"),
    ("get", "/review"),
    ("get", "/review/{asset}"),
}
UNAUTHENTICATED_ROUTES = {("get", "/health"), ("get", "/review"), ("get", "/review/{asset}")}
API_GATEWAY_MAX_INTEGRATION_SECONDS = 29
# SAM policy templates whose expansion lists exact actions (checked against samtranslator's definitions).
WILDCARD_FREE_POLICY_TEMPLATES = {"S3ReadPolicy"}
SECRET_LOOKING_NAME = re.compile(r"API_KEY|SECRET|PASSWORD|TOKEN|DATABASE_URL", re.IGNORECASE)


class CloudFormationLoader(yaml.SafeLoader):  # type: ignore[misc,unused-ignore]  # no PyYAML stubs
    """A SafeLoader that understands CloudFormation's short-form intrinsic function tags."""


def _construct_intrinsic(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(cast(yaml.MappingNode, node), deep=True)
    if tag_suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)  # !GetAtt Queue.Arn is {"Fn::GetAtt": ["Queue", "Arn"]}
    name = tag_suffix if tag_suffix in {"Ref", "Condition"} else f"Fn::{tag_suffix}"
    return {name: value}


CloudFormationLoader.add_multi_constructor("!", _construct_intrinsic)


@cache
def _load_template() -> dict[str, Any]:
    return cast(dict[str, Any], yaml.load(TEMPLATE_PATH.read_text(encoding="utf-8"), CloudFormationLoader))


@pytest.fixture
def template() -> dict[str, Any]:
    return _load_template()


def _resource(template: dict[str, Any], name: str) -> dict[str, Any]:
    assert name in template["Resources"], f"resource {name} is missing from template.yaml"
    return cast(dict[str, Any], template["Resources"][name])


def _properties(template: dict[str, Any], name: str) -> dict[str, Any]:
    return cast(dict[str, Any], _resource(template, name)["Properties"])


def _default(template: dict[str, Any], parameter: str) -> int:
    assert parameter in template["Parameters"], f"parameter {parameter} is missing"
    return int(template["Parameters"][parameter]["Default"])


def _environment(template: dict[str, Any], function: str) -> dict[str, Any]:
    """The function's environment as SAM merges it: Globals first, the function's own variables on top."""
    globals_env = template.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    own_env = _properties(template, function).get("Environment", {}).get("Variables", {})
    return {**globals_env, **own_env}


def _ref_parameter(value: Any) -> str:
    """The parameter a {"Ref": ...} value names; fails for a literal or another intrinsic."""
    assert isinstance(value, dict) and set(value) == {"Ref"}, f"expected a !Ref, got {value!r}"
    assert isinstance(value["Ref"], str)
    return value["Ref"]


def _event(template: dict[str, Any], function: str, event_type: str) -> dict[str, Any]:
    events = _properties(template, function).get("Events", {})
    matching = [e["Properties"] for e in events.values() if e["Type"] == event_type]
    assert len(matching) == 1, f"{function} should have exactly one {event_type} event, has {len(matching)}"
    return cast(dict[str, Any], matching[0])


def _policy_statements(node: Any) -> Iterator[dict[str, Any]]:
    """Every IAM policy statement anywhere in the template (function policies, bucket policy, roles)."""
    if isinstance(node, dict):
        if "Effect" in node and ("Action" in node or "NotAction" in node):
            yield node
        for child in node.values():
            yield from _policy_statements(child)
    elif isinstance(node, list):
        for child in node:
            yield from _policy_statements(child)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _mentions(node: Any, resource: str) -> bool:
    """Whether a value refers to a resource by !Ref, !GetAtt or ${Name...} inside a !Sub."""
    if isinstance(node, dict):
        if node.get("Ref") == resource:
            return True
        get_att = node.get("Fn::GetAtt")
        if isinstance(get_att, list) and get_att and get_att[0] == resource:
            return True
        sub = node.get("Fn::Sub")
        sub_text = sub if isinstance(sub, str) else sub[0] if isinstance(sub, list) and sub else None
        if isinstance(sub_text, str) and re.search(r"\$\{" + re.escape(resource) + r"[.}]", sub_text):
            return True
        return any(_mentions(child, resource) for child in node.values())
    if isinstance(node, list):
        return any(_mentions(child, resource) for child in node)
    return False


def _referenced_names(node: Any) -> set[str]:
    """Every logical id, parameter or pseudo parameter a value names by !Ref, !GetAtt or ${Name[.Attr]} in !Sub."""
    names: set[str] = set()
    if isinstance(node, dict):
        if isinstance(node.get("Ref"), str):
            names.add(node["Ref"])
        get_att = node.get("Fn::GetAtt")
        if isinstance(get_att, list) and get_att and isinstance(get_att[0], str):
            names.add(get_att[0])
        sub = node.get("Fn::Sub")
        sub_text = sub if isinstance(sub, str) else sub[0] if isinstance(sub, list) and sub else None
        if isinstance(sub_text, str):
            names.update(m.split(".", 1)[0] for m in re.findall(r"\$\{([^}!][^}]*)\}", sub_text))
        for child in node.values():
            names |= _referenced_names(child)
    elif isinstance(node, list):
        for child in node:
            names |= _referenced_names(child)
    return names


def _dependencies(template: dict[str, Any]) -> dict[str, set[str]]:
    """For each resource, the resources CloudFormation must create before it (after SAM's transform).

    SAM writes a function into its S3 bucket's notification configuration and into its API's definition, so
    for S3 and Api events the bucket / API waits for the function, not the other way round. Globals.Function
    applies to every function. Both branches of an !If count (a cycle in either is a deployment failure)."""
    resources = template["Resources"]
    globals_function = template.get("Globals", {}).get("Function", {})
    graph: dict[str, set[str]] = {name: set() for name in resources}
    for name, resource in resources.items():
        properties = dict(resource.get("Properties", {}))
        if resource["Type"] == "AWS::Serverless::Function":
            properties["Globals"] = globals_function
            for event in properties.pop("Events", {}).values():
                if event["Type"] in {"S3", "Api"}:
                    for target in _referenced_names(event["Properties"]) & set(resources):
                        graph[target].add(name)
                else:
                    graph[name] |= _referenced_names(event["Properties"]) & set(resources)
        depends_on = set(_as_list(resource.get("DependsOn", [])))
        graph[name] |= (_referenced_names(properties) | depends_on) & set(resources)
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One dependency cycle as a path that starts and ends on the same node, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == "open":
                return [*path[path.index(successor) :], successor]
            if successor not in state and (cycle := visit(successor)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _function_statements(template: dict[str, Any], function: str) -> list[dict[str, Any]]:
    """A function's inline statements plus those of the template's managed policies it attaches by !Ref."""
    statements: list[dict[str, Any]] = []
    for policy in _properties(template, function).get("Policies", []):
        if isinstance(policy, dict) and "Statement" in policy:
            statements += _policy_statements(policy["Statement"])
        elif isinstance(policy, dict) and set(policy) == {"Ref"} and policy["Ref"] in template["Resources"]:
            statements += _policy_statements(_properties(template, policy["Ref"])["PolicyDocument"])
    return statements


def _resources_of_type(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == resource_type}


def _alarms(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["Properties"] for r in _resources_of_type(template, "AWS::CloudWatch::Alarm").values()]


def _dashboard_text(template: dict[str, Any]) -> str:
    body = _properties(template, "Dashboard")["DashboardBody"]
    assert isinstance(body, dict) and set(body) == {"Fn::Sub"}, body
    text = body["Fn::Sub"]
    assert isinstance(text, str), "the dashboard body should be one !Sub string"
    return text


def _dashboard_metrics(body: dict[str, Any]) -> list[tuple[str, list[str], dict[str, Any]]]:
    """(widget title, [namespace, metric, dimension, value, ...], rendering options) for every metric row.

    A row starting with "..." repeats the previous row's leading fields, as CloudWatch dashboards define it."""
    rows: list[tuple[str, list[str], dict[str, Any]]] = []
    for widget in body["widgets"]:
        properties = widget.get("properties", {})
        previous: list[str] = []
        for row in properties.get("metrics", []):
            options = row[-1] if row and isinstance(row[-1], dict) else {}
            fields = [str(f) for f in row if not isinstance(f, dict)]
            if not fields:  # a metric math expression, no metric of its own (see _dashboard_expressions)
                continue
            if fields[:1] == ["..."]:
                rest = fields[1:]
                fields = previous[: len(previous) - len(rest)] + rest
            previous = fields
            rows.append((str(properties.get("title", "")), fields, options))
    return rows


def _dashboard_expressions(body: dict[str, Any]) -> dict[str, str]:
    """Widget title -> its metric math expressions, joined."""
    found: dict[str, str] = {}
    for widget in body["widgets"]:
        properties = widget.get("properties", {})
        for row in properties.get("metrics", []):
            if len(row) == 1 and isinstance(row[0], dict) and "expression" in row[0]:
                title = str(properties.get("title", ""))
                found[title] = (found.get(title, "") + " " + row[0]["expression"]).strip()
    return found


def test_the_dashboard_shows_spend_per_model_the_429_rate_and_the_daily_budget(template: dict[str, Any]) -> None:
    # Given the dashboard's rows and expressions
    body = json.loads(re.sub(r"\$\{([^}]+)\}", lambda m: m.group(1), _dashboard_text(template)))
    expressions = _dashboard_expressions(body)
    metrics = {fields[1] for _, fields, _ in _dashboard_metrics(body) if fields[0] == "Pagescribe"}

    # Then spend is searched per Model dimension, and the 429 rate is RateLimited over ModelCalls
    assert any("{Pagescribe,Model,service}" in e and 'MetricName="CostUSD"' in e for e in expressions.values())
    assert any("limited" in e and "/ calls" in e for e in expressions.values())
    assert {"RateLimited", "ModelCalls", "PagesDeferred", "PagesSkipped", "DailyBudgetUsedPercent"} <= metrics
    # And an alarm watches the share of the daily budget spent
    alarm = template["Resources"]["DailyBudgetAlarm"]["Properties"]
    assert (alarm["MetricName"], alarm["Statistic"]) == ("DailyBudgetUsedPercent", "Maximum")
    assert alarm["Threshold"] == {"Ref": "DailyBudgetAlarmPercent"}
    # And the governor and the budget are parameters every function receives
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    for variable, parameter in (
        ("RATE_LIMIT_RPM", "RateLimitRpm"),
        ("RATE_LIMIT_TPM", "RateLimitTpm"),
        ("RATE_LIMIT_BURST", "RateLimitBurst"),
        ("DAILY_BUDGET_USD", "DailyBudgetUsd"),
    ):
        assert variables[variable] == {"Ref": parameter} and parameter in template["Parameters"]


def test_the_dashboard_shows_loops_cut_per_model_and_streaming_is_a_parameter(template: dict[str, Any]) -> None:
    from pagescribe.settings import Settings

    # Given the dashboard's expressions
    body = json.loads(re.sub(r"\$\{([^}]+)\}", lambda m: m.group(1), _dashboard_text(template)))
    expressions = _dashboard_expressions(body)
    # Then the calls cut at a loop are searched per Model dimension, as the transcribe function counts them
    assert any("{Pagescribe,Model,service}" in e and 'MetricName="LoopsCut"' in e for e in expressions.values())
    # And PROVIDER_STREAM is a parameter every function receives, offering the setting's values, its default the same
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["PROVIDER_STREAM"] == {"Ref": "ProviderStream"}
    parameter = template["Parameters"]["ProviderStream"]
    assert {str(value) for value in parameter["AllowedValues"]} == {"auto", "on", "off"}
    assert parameter["Default"] == Settings().provider_stream


def test_the_dashboard_shows_the_batch_lane_and_its_settings_are_parameters(template: dict[str, Any]) -> None:
    # Given the dashboard's metrics
    body = json.loads(re.sub(r"\$\{([^}]+)\}", lambda m: m.group(1), _dashboard_text(template)))
    metrics = {fields[1] for _, fields, _ in _dashboard_metrics(body) if fields[0] == "Pagescribe"}
    # Then the pages waiting in the batch lane, the batches submitted and collected and the pages moved are shown
    assert {"BatchPagesWaiting", "BatchesSubmitted", "BatchesCollected", "BatchPagesMovedToSync"} <= metrics
    # And the lane's settings are parameters every function receives
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    for variable, parameter in (
        ("DEFAULT_LANE", "DefaultLane"),
        ("BATCH_DIALECT", "BatchDialect"),
        ("BATCH_BASE_URL", "BatchBaseUrl"),
        ("BATCH_PRICE_FACTOR", "BatchPriceFactor"),
        ("BATCH_MAX_PAGES", "BatchMaxPages"),
        ("BATCH_SYNC_RESERVE_SECONDS", "BatchSyncReserveSeconds"),
    ):
        assert variables[variable] == {"Ref": parameter} and parameter in template["Parameters"]


def test_tiles_are_settings_every_function_receives_and_the_dashboard_shows(template: dict[str, Any]) -> None:
    from pagescribe.settings import Settings

    # Given the template's environment and dashboard
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    body = json.loads(re.sub(r"\$\{([^}]+)\}", lambda m: m.group(1), _dashboard_text(template)))
    shown = {fields[1] for _, fields, _ in _dashboard_metrics(body) if fields[0] == "Pagescribe"}
    # Then every tile setting is a parameter, its default the setting's own
    fields = [name for name in Settings.model_fields if name == "tiles" or name.startswith("tile_")]
    assert len(fields) == 6
    for name in fields:
        default, given = Settings.model_fields[name].default, template["Parameters"][variables[name.upper()]["Ref"]]
        assert given["Default"] == default if isinstance(default, str) else float(given["Default"]) == default
    # And the dashboard shows the pages read in tiles and their calls, as the code counts them
    assert {"PagesTiled", "TileCalls"} <= shown


# --- queue and retries ------------------------------------------------------------------------------------


def test_queue_visibility_timeout_default_is_at_least_six_transcribe_timeouts(template: dict[str, Any]) -> None:
    # Given the job queue and the transcribe function
    queue = _properties(template, "Queue")
    transcribe = _properties(template, "TranscribeFunction")

    # When their timeouts are resolved to the parameters' defaults
    visibility_parameter = _ref_parameter(queue["VisibilityTimeout"])
    visibility = _default(template, visibility_parameter)
    transcribe_timeout = _default(template, _ref_parameter(transcribe["Timeout"]))

    # Then a message stays invisible for at least six function timeouts (AWS's advice for SQS sources)
    assert visibility >= 6 * transcribe_timeout, (
        f"{visibility_parameter} default {visibility} < 6 x transcribe timeout {transcribe_timeout}"
    )


def test_queue_redrives_to_a_dead_letter_queue_after_a_few_receives(template: dict[str, Any]) -> None:
    # Given the job queue's redrive policy
    redrive = _properties(template, "Queue").get("RedrivePolicy")
    assert redrive is not None, "the job queue has no RedrivePolicy"

    # When its target and receive count are read
    target = redrive["deadLetterTargetArn"]
    max_receive_count = int(redrive["maxReceiveCount"])

    # Then poison messages land in the dead-letter queue, which keeps them for the SQS maximum of 14 days
    assert target == {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}
    assert _resource(template, "DeadLetterQueue")["Type"] == "AWS::SQS::Queue"
    assert 1 <= max_receive_count <= 10
    assert int(_properties(template, "DeadLetterQueue")["MessageRetentionPeriod"]) == 14 * 24 * 3600


@pytest.mark.parametrize("queue", ["Queue", "DeadLetterQueue"])
def test_queues_are_encrypted_at_rest(template: dict[str, Any], queue: str) -> None:
    # Given a queue
    properties = _properties(template, queue)

    # When its encryption setting is read
    sse = properties.get("SqsManagedSseEnabled")

    # Then SQS-managed server-side encryption is on
    assert sse is True


def test_transcribe_sqs_event_reports_partial_batch_failures_and_caps_concurrency(
    template: dict[str, Any],
) -> None:
    # Given the transcribe function's SQS event source
    event = _event(template, "TranscribeFunction", "SQS")

    # When its batch settings are read
    response_types = event.get("FunctionResponseTypes", [])
    concurrency = event.get("ScalingConfig", {}).get("MaximumConcurrency")

    # Then failed records are retried alone, and the concurrency cap is a parameter SQS accepts (>= 2)
    assert event["Queue"] == {"Fn::GetAtt": ["Queue", "Arn"]}
    assert "ReportBatchItemFailures" in response_types
    assert concurrency is not None, "ScalingConfig.MaximumConcurrency is not set"
    concurrency_parameter = template["Parameters"][_ref_parameter(concurrency)]
    assert int(concurrency_parameter["MinValue"]) >= 2
    assert int(concurrency_parameter["Default"]) >= 2


# --- timeouts ---------------------------------------------------------------------------------------------


def test_provider_timeout_default_fits_in_the_transcribe_timeout(template: dict[str, Any]) -> None:
    # Given the provider and transcribe function timeout defaults
    provider_timeout = _default(template, "ProviderTimeoutSeconds")
    transcribe_timeout = _default(template, _ref_parameter(_properties(template, "TranscribeFunction")["Timeout"]))

    # When the time the application keeps back to record a result is added to the provider timeout
    needed = provider_timeout + RESULT_RESERVE_SECONDS

    # Then a model call that times out still leaves the function time to record it
    assert provider_timeout < transcribe_timeout
    assert needed < transcribe_timeout, (
        f"{provider_timeout}s + {RESULT_RESERVE_SECONDS}s reserve >= {transcribe_timeout}s"
    )


def test_transcribe_gets_the_provider_timeout_parameter(template: dict[str, Any]) -> None:
    # Given the transcribe function's environment
    env = _environment(template, "TranscribeFunction")

    # When PROVIDER_TIMEOUT_SECONDS is read
    parameter = _ref_parameter(env.get("PROVIDER_TIMEOUT_SECONDS"))

    # Then it is the parameter the timeout invariant above is checked against
    assert parameter == "ProviderTimeoutSeconds"


@pytest.mark.parametrize("function", FUNCTIONS)
def test_function_timeout_env_refs_the_same_parameter_as_the_timeout(template: dict[str, Any], function: str) -> None:
    # Given a function's Timeout and its merged environment
    timeout = _properties(template, function).get("Timeout")
    env = _environment(template, function)

    # When both are resolved to the parameter they name
    timeout_parameter = _ref_parameter(timeout)
    env_parameter = _ref_parameter(env.get("FUNCTION_TIMEOUT_SECONDS"))

    # Then the application sees exactly the timeout Lambda enforces
    assert env_parameter == timeout_parameter


# --- bucket -----------------------------------------------------------------------------------------------


def test_bucket_blocks_all_public_access(template: dict[str, Any]) -> None:
    # Given the documents bucket
    block = _properties(template, "DocumentsBucket").get("PublicAccessBlockConfiguration", {})

    # When its public access block is read
    settings = {
        key: block.get(key)
        for key in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
    }

    # Then all four switches are on
    assert settings == dict.fromkeys(settings, True)


def test_bucket_is_encrypted_and_owner_enforced(template: dict[str, Any]) -> None:
    # Given the documents bucket
    bucket = _properties(template, "DocumentsBucket")

    # When its default encryption and ownership rules are read
    rules = bucket.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", [])
    algorithms = {rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] for rule in rules}
    ownership = [rule["ObjectOwnership"] for rule in bucket.get("OwnershipControls", {}).get("Rules", [])]

    # Then objects are encrypted with SSE-S3 or KMS and ACLs are disabled
    assert algorithms, "the bucket has no default encryption"
    assert algorithms <= {"AES256", "aws:kms", "aws:kms:dsse"}
    assert ownership == ["BucketOwnerEnforced"]


def test_bucket_cors_lets_browsers_use_presigned_urls_as_the_local_stack_does(template: dict[str, Any]) -> None:
    # Given the documents bucket's CORS rules, and the rule the local stack gives its bucket
    rules = _properties(template, "DocumentsBucket")["CorsConfiguration"]["CorsRules"]
    [local] = BUCKET_CORS_RULES

    # Then one rule lets a page of any origin PUT and GET with a Content-Type (the presigned URL is the credential),
    # and the local stack's is the same rule in the S3 API's spelling
    assert rules == [
        {"AllowedMethods": ["GET", "PUT"], "AllowedOrigins": ["*"], "AllowedHeaders": ["Content-Type"], "MaxAge": 3000}
    ]
    assert {("MaxAge" if key == "MaxAgeSeconds" else key): value for key, value in local.items()} == rules[0]


def test_bucket_policy_denies_requests_without_tls(template: dict[str, Any]) -> None:
    # Given the policies attached to the documents bucket
    policies = [
        r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::S3::BucketPolicy" and r["Properties"]["Bucket"] == {"Ref": "DocumentsBucket"}
    ]
    statements = [s for p in policies for s in _as_list(p["PolicyDocument"]["Statement"])]

    # When the statements that deny insecure transport are picked out
    tls_denials = [
        s
        for s in statements
        if s["Effect"] == "Deny"
        and str(s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport")).lower() == "false"
    ]

    # Then one of them covers every S3 action on both the bucket and its objects, for every principal
    assert tls_denials, "no bucket policy statement denies aws:SecureTransport=false"
    denial = tls_denials[0]
    assert denial["Principal"] in ("*", {"AWS": "*"})
    assert "s3:*" in _as_list(denial["Action"])
    resources = _as_list(denial["Resource"])
    assert {"Fn::GetAtt": ["DocumentsBucket", "Arn"]} in resources
    assert {"Fn::Sub": "${DocumentsBucket.Arn}/*"} in resources


def test_abandoned_multipart_uploads_under_uploads_are_aborted(template: dict[str, Any]) -> None:
    # Given the bucket's lifecycle rules
    rules = _properties(template, "DocumentsBucket").get("LifecycleConfiguration", {}).get("Rules", [])

    # When the rules aborting incomplete multipart uploads are picked out
    abort_rules = [r for r in rules if "AbortIncompleteMultipartUpload" in r and r.get("Status") == "Enabled"]

    # Then one of them covers uploads/ after a day
    assert any(
        r.get("Prefix", r.get("Filter", {}).get("Prefix")) == "uploads/"
        and r["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] == 1
        for r in abort_rules
    ), f"no enabled rule aborts uploads/ multipart uploads after 1 day: {abort_rules!r}"


def test_bucket_is_named_with_sub_and_functions_use_that_name(template: dict[str, Any]) -> None:
    # Given the bucket's name and the functions' BUCKET_NAME
    bucket_name = _properties(template, "DocumentsBucket").get("BucketName")

    # When each function's environment is merged
    function_bucket_names = {f: _environment(template, f).get("BUCKET_NAME") for f in FUNCTIONS}

    # Then the name is one !Sub expression, repeated verbatim where the functions need it
    assert isinstance(bucket_name, dict) and set(bucket_name) == {"Fn::Sub"}, bucket_name
    assert "${AWS::StackName}" in bucket_name["Fn::Sub"]
    assert function_bucket_names == dict.fromkeys(FUNCTIONS, bucket_name)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_functions_never_reference_the_bucket_resource(template: dict[str, Any], function: str) -> None:
    # Given a function definition, less its S3 event (the one place SAM needs the bucket's Ref)
    properties = dict(_properties(template, function))
    events = {n: e for n, e in properties.pop("Events", {}).items() if e["Type"] != "S3"}

    # When it is searched for !Ref/!GetAtt/${} references to DocumentsBucket, including through Globals
    referenced = _mentions([properties, events, template.get("Globals", {})], "DocumentsBucket")

    # Then there is none: the bucket's notification depends on the function, so one would be a cycle
    assert not referenced


def test_upload_event_fires_on_object_created_under_uploads(template: dict[str, Any]) -> None:
    # Given the upload function's S3 event
    event = _event(template, "UploadFunction", "S3")

    # When its bucket, event names and key filter are read
    rules = event.get("Filter", {}).get("S3Key", {}).get("Rules", [])
    prefixes = [r["Value"] for r in rules if r["Name"].lower() == "prefix"]

    # Then only objects created under uploads/ in the documents bucket trigger it
    assert event["Bucket"] == {"Ref": "DocumentsBucket"}
    assert "s3:ObjectCreated:*" in _as_list(event["Events"])
    assert prefixes == ["uploads/"]


# --- permissions and secrets ------------------------------------------------------------------------------


def test_no_statement_allows_every_action_of_a_service(template: dict[str, Any]) -> None:
    # Given every IAM statement in the template
    statements = list(_policy_statements(template["Resources"]))
    assert statements, "the walker found no IAM statements at all"

    # When the Allow statements' actions are collected
    allowed = [a for s in statements if s["Effect"] == "Allow" for a in _as_list(s.get("Action", []))]
    not_actions = [s for s in statements if s["Effect"] == "Allow" and "NotAction" in s]

    # Then none is "*" or "<service>:*" (the TLS-only Deny on s3:* is the one wildcard, and it denies)
    wildcards = [a for a in allowed if isinstance(a, str) and (a == "*" or a.endswith(":*"))]
    assert wildcards == []
    assert not_actions == []


def test_no_statement_allows_on_every_resource(template: dict[str, Any]) -> None:
    # Given every Allow statement in the template (function policies, managed policies, the proxy's role)
    allows = [s for s in _policy_statements(template["Resources"]) if s["Effect"] == "Allow"]

    # When their resources are collected
    resources = [r for s in allows for r in _as_list(s.get("Resource", []))]

    # Then each names something specific: no bare "*" and no NotResource
    assert resources, "no Allow statement names a resource"
    assert "*" not in resources
    assert not [s for s in allows if "NotResource" in s]


@pytest.mark.parametrize("function", FUNCTIONS)
def test_functions_write_to_s3_only_under_their_prefix(template: dict[str, Any], function: str) -> None:
    # Given the S3 prefix each function may write to (presigned PUTs from the API carry its permissions; the API
    # writes a corrected page's transcript files, and nothing else under transcripts/)
    expected_suffix = {
        "ApiFunction": ("-documents/uploads/*", "-documents/transcripts/*.md", "-documents/transcripts/*.json"),
        "TranscribeFunction": ("-documents/transcripts/*",),
        "SweeperFunction": ("-documents/transcripts/*",),
    }.get(function)
    policies = _properties(template, function).get("Policies", [])

    # When the statements allowing s3:PutObject are picked out
    statements = _function_statements(template, function)
    put_resources = [r for s in statements if "s3:PutObject" in _as_list(s["Action"]) for r in _as_list(s["Resource"])]

    # Then writes stay under that prefix (none at all for the others) and no S3 policy template grants writes
    if expected_suffix is None:
        assert put_resources == []
    else:
        assert {suffix for r in put_resources for suffix in expected_suffix if r["Fn::Sub"].endswith(suffix)} == set(
            expected_suffix
        ), f"{function} cannot write under each of {expected_suffix}"
        assert all(isinstance(r, dict) and r["Fn::Sub"].endswith(expected_suffix) for r in put_resources)
    write_templates = {"S3CrudPolicy", "S3WritePolicy", "S3FullAccessPolicy"}
    assert not [p for p in policies if isinstance(p, dict) and write_templates & set(p)]


def test_api_reads_only_transcripts(template: dict[str, Any]) -> None:
    # Given the API function's statements and policy templates
    statements = _function_statements(template, "ApiFunction")
    policies = _properties(template, "ApiFunction")["Policies"]

    # When the statements allowing s3:GetObject are picked out
    get_resources = [r for s in statements if "s3:GetObject" in _as_list(s["Action"]) for r in _as_list(s["Resource"])]

    # Then it may read transcripts/ only, not the uploaded sources
    assert get_resources, "the API function cannot read transcripts"
    assert all(r["Fn::Sub"].endswith("-documents/transcripts/*") for r in get_resources)
    assert not [p for p in policies if isinstance(p, dict) and "S3ReadPolicy" in p]


@pytest.mark.parametrize("function", FUNCTIONS)
def test_functions_send_only_to_the_job_queue(template: dict[str, Any], function: str) -> None:
    # Given a function's statements
    statements = _function_statements(template, function)

    # When the queues it may send to are collected
    queues = [r for s in statements if "sqs:SendMessage" in _as_list(s["Action"]) for r in _as_list(s["Resource"])]

    # Then the functions that enqueue (upload), re-enqueue (transcribe, sweeper) or retry (API) page jobs may
    # send to the job queue and nothing else; the migration function may not send at all
    expected = [{"Fn::GetAtt": ["Queue", "Arn"]}] if function in SCHEMA_DEPENDENT_FUNCTIONS else []
    assert queues == expected


@pytest.mark.parametrize("function", FUNCTIONS)
def test_functions_use_only_policy_templates_without_wildcard_actions(template: dict[str, Any], function: str) -> None:
    # Given a function's SAM policy templates (SAM expands them; this test only sees their names)
    policies = _properties(template, function).get("Policies", [])

    # When their names are collected
    used = {name for p in policies if isinstance(p, dict) for name in p if name not in {"Statement", "Ref", "Fn::If"}}
    # (an !If chooses between managed policies: a Ref or none)
    chosen = [branch for p in policies if isinstance(p, dict) and "Fn::If" in p for branch in p["Fn::If"][1:]]
    assert all(set(branch) == {"Ref"} for branch in chosen), chosen

    # Then each is one whose expansion names exact actions (SQSSendMessagePolicy grants sqs:SendMessage*)
    assert used <= WILDCARD_FREE_POLICY_TEMPLATES, used - WILDCARD_FREE_POLICY_TEMPLATES


@pytest.mark.parametrize("function", FUNCTIONS)
def test_functions_read_the_database_secret_in_use(template: dict[str, Any], function: str) -> None:
    # Given a function's statements and the secret its environment names
    statements = _function_statements(template, function)
    secret = _environment(template, function)["DATABASE_SECRET_ARN"]

    # When the statements allowing secretsmanager:GetSecretValue are picked out
    readable = [
        r
        for s in statements
        if "secretsmanager:GetSecretValue" in _as_list(s["Action"])
        for r in _as_list(s["Resource"])
    ]

    # Then it may read exactly that secret
    assert readable == [secret]


@pytest.mark.parametrize("function", SCHEMA_DEPENDENT_FUNCTIONS)
def test_runtime_functions_read_the_provider_key_parameter_by_its_arn(template: dict[str, Any], function: str) -> None:
    # Given a function that may need the provider key or the callback secret
    statements = _function_statements(template, function)

    # When the statements allowing ssm:GetParameter are picked out
    resources = [r for s in statements if "ssm:GetParameter" in _as_list(s["Action"]) for r in _as_list(s["Resource"])]

    # Then the provider key's ARN keeps the name's leading slash (parameter/name, not parameter//name)
    expected = {
        "Fn::Sub": "arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter${ProviderApiKeyParameter}"
    }
    assert expected in resources


DATA_API_ACTIONS = {
    "rds-data:ExecuteStatement",
    "rds-data:BatchExecuteStatement",
    "rds-data:BeginTransaction",
    "rds-data:CommitTransaction",
    "rds-data:RollbackTransaction",
}


def test_the_data_api_profile_pauses_the_created_cluster_and_drops_the_proxy_and_the_vpc(
    template: dict[str, Any],
) -> None:
    from pagescribe.settings import Settings

    # Given the DatabaseAccess parameter, which the settings read as DATABASE_ACCESS
    parameter = template["Parameters"]["DatabaseAccess"]
    assert (parameter["Default"], parameter["AllowedValues"]) == ("direct", ["direct", "data-api"])
    assert list(get_args(Settings.model_fields["database_access"].annotation)) == parameter["AllowedValues"]
    conditions = template["Conditions"]
    assert conditions["DataApi"] == {
        "Fn::And": [{"Condition": "CreateDatabase"}, {"Fn::Equals": [{"Ref": "DatabaseAccess"}, "data-api"]}]
    }
    assert conditions["ProxiedDatabase"] == {
        "Fn::And": [{"Condition": "CreateDatabase"}, {"Fn::Not": [{"Condition": "DataApi"}]}]
    }
    # Then with data-api the created cluster scales to 0 ACU, pauses when idle and answers the Data API
    cluster = _properties(template, "DatabaseCluster")
    scaling = cluster["ServerlessV2ScalingConfiguration"]
    assert scaling["MinCapacity"] == {"Fn::If": ["DataApi", 0, 0.5]}
    assert scaling["SecondsUntilAutoPause"] == {"Fn::If": ["DataApi", 300, {"Ref": "AWS::NoValue"}]}
    assert cluster["EnableHttpEndpoint"] == {"Fn::If": ["DataApi", True, {"Ref": "AWS::NoValue"}]}
    # And there is no proxy (nor its security groups), and the functions are outside the VPC
    for name in ("DatabaseProxy", "DatabaseProxyTargetGroup", "DatabaseProxyRole", "DatabaseProxySecurityGroup"):
        assert _resource(template, name)["Condition"] == "ProxiedDatabase"
    assert {"Fn::Not": [{"Condition": "DataApi"}]} in conditions["UseVpc"]["Fn::And"]
    # And the functions are told to use the Data API on that cluster, which they may
    environment = template["Globals"]["Function"]["Environment"]["Variables"]
    assert environment["DATABASE_ACCESS"] == {"Fn::If": ["DataApi", "data-api", "direct"]}
    assert environment["DATABASE_CLUSTER_ARN"] == {
        "Fn::If": ["DataApi", {"Fn::GetAtt": ["DatabaseCluster", "DBClusterArn"]}, ""]
    }
    # And the sweeper wakes the paused cluster every 3 hours, not every minute
    schedule = _event(template, "SweeperFunction", "Schedule")["Schedule"]
    assert schedule == {"Fn::If": ["DataApi", "rate(3 hours)", "rate(1 minute)"]}
    [granted] = [s for s in _policy_statements(template) if set(_as_list(s["Action"])) == DATA_API_ACTIONS]
    assert granted["Resource"] == {"Fn::GetAtt": ["DatabaseCluster", "DBClusterArn"]}


def test_migration_function_reads_no_parameters_and_no_bucket(template: dict[str, Any]) -> None:
    # Given the migration function's statements and policy templates
    statements = _function_statements(template, "MigrateFunction")
    policies = _properties(template, "MigrateFunction")["Policies"]

    # When the actions it is allowed are collected
    actions = {a for s in statements if s["Effect"] == "Allow" for a in _as_list(s["Action"])}

    # Then it only reads the database secret (and decrypts it), and in the data-api profile runs statements there
    assert actions == {"secretsmanager:GetSecretValue", "kms:Decrypt"} | DATA_API_ACTIONS
    assert policies == [{"Ref": "DatabaseSecretReadPolicy"}]


def test_callback_secret_is_readable_only_when_configured(template: dict[str, Any]) -> None:
    # Given the callback secret parameter and the policy statements that mention it
    parameter = template["Parameters"]["CallbackSecretParameter"]
    mentioning = [
        node
        for node in _as_list(_properties(template, "ParameterReadPolicy")["PolicyDocument"]["Statement"])
        if _mentions(node, "CallbackSecretParameter")
    ]

    # When the statement's guard is read
    guards = [node["Fn::If"][0] for node in mentioning if isinstance(node, dict) and "Fn::If" in node]

    # Then it is optional (empty by default) and granted only under a condition that it is non-empty
    assert parameter["Default"] == ""
    assert re.fullmatch(parameter["AllowedPattern"], "")
    assert re.fullmatch(parameter["AllowedPattern"], "/pagescribe/callback-secret")
    assert len(mentioning) == 1
    assert guards == ["HasCallbackSecret"]
    assert template["Conditions"]["HasCallbackSecret"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "CallbackSecretParameter"}, ""]}]
    }


def test_no_environment_variable_holds_a_secret_value(template: dict[str, Any]) -> None:
    # Given every environment variable the functions receive
    variables = {(f, name): value for f in FUNCTIONS for name, value in _environment(template, f).items()}

    # When the secret-looking ones are checked for literal values
    literal_secrets = [
        key for key, value in variables.items() if SECRET_LOOKING_NAME.search(key[1]) and not isinstance(value, dict)
    ]

    # Then secrets are passed only as references (a parameter or secret NAME/ARN), never as values
    assert literal_secrets == []
    assert not [
        key for key in variables if key[1] in {"PROVIDER_API_KEY", "DATABASE_URL", "CALLBACK_SECRET", "API_KEY"}
    ]
    for function in FUNCTIONS:
        assert _ref_parameter(variables[(function, "PROVIDER_API_KEY_PARAMETER")]) == "ProviderApiKeyParameter"
        assert _ref_parameter(variables[(function, "CALLBACK_SECRET_PARAMETER")]) == "CallbackSecretParameter"
        assert variables[(function, "DATABASE_SECRET_ARN")] == {
            "Fn::If": ["CreateDatabase", {"Ref": "DatabaseSecret"}, {"Ref": "DatabaseSecretArn"}]
        }


def test_provider_api_key_parameter_is_a_name_not_a_key(template: dict[str, Any]) -> None:
    # Given the parameter that names the provider key
    parameter = template["Parameters"]["ProviderApiKeyParameter"]

    # When its default and pattern are read
    default = parameter["Default"]
    pattern = parameter["AllowedPattern"]

    # Then it is a fully qualified SSM parameter name, and NoEcho is not needed because it is not secret
    assert re.fullmatch(pattern, default)
    assert default.startswith("/")
    assert not re.fullmatch(pattern, "sk-or-v1-0123456789abcdef")


# --- functions --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("function", FUNCTIONS)
def test_functions_run_their_handler_on_the_shared_layer(template: dict[str, Any], function: str) -> None:
    # Given a function and the shared layer
    properties = _properties(template, function)
    layer = _resource(template, "SharedLayer")
    runtime = properties.get("Runtime", template["Globals"]["Function"].get("Runtime"))

    # When their packaging is read
    layers = properties.get("Layers", []) + template["Globals"]["Function"].get("Layers", [])

    # Then the handler comes from its own directory and the pagescribe package from the layer
    assert (properties["CodeUri"], properties["Handler"], runtime) == (CODE_URIS[function], "app.handler", "python3.12")
    assert layers == [{"Ref": "SharedLayer"}]
    assert layer["Properties"]["ContentUri"] == "shared/"
    assert layer["Metadata"]["BuildMethod"] == "python3.12"


def test_every_serverless_function_is_covered_by_these_checks(template: dict[str, Any]) -> None:
    # Given the template's functions
    functions = set(_resources_of_type(template, "AWS::Serverless::Function"))

    # When they are compared with the functions the parametrized checks run on
    unchecked = functions - set(FUNCTIONS)

    # Then none escapes the invariants above
    assert unchecked == set()
    assert functions == set(FUNCTIONS)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_function_has_a_log_group_with_retention(template: dict[str, Any], function: str) -> None:
    # Given the log groups of the template
    groups = [r["Properties"] for r in _resources_of_type(template, "AWS::Logs::LogGroup").values()]

    # When the one named after the function is looked up
    mine = [g for g in groups if g.get("LogGroupName") == {"Fn::Sub": f"/aws/lambda/${{{function}}}"}]

    # Then it exists and expires its events
    assert len(mine) == 1
    assert int(mine[0]["RetentionInDays"]) > 0


def test_api_function_timeout_fits_api_gateway(template: dict[str, Any]) -> None:
    # Given the API function's timeout parameter
    parameter_name = _ref_parameter(_properties(template, "ApiFunction")["Timeout"])
    parameter = template["Parameters"][parameter_name]

    # When its default and ceiling are read
    default, ceiling = int(parameter["Default"]), int(parameter["MaxValue"])

    # Then the function can never outlive API Gateway's 29 s integration timeout
    assert default == API_GATEWAY_MAX_INTEGRATION_SECONDS
    assert ceiling <= API_GATEWAY_MAX_INTEGRATION_SECONDS


def test_sweeper_runs_every_minute(template: dict[str, Any]) -> None:
    # Given the sweeper's schedule event and timeout
    event = _event(template, "SweeperFunction", "Schedule")
    timeout = _properties(template, "SweeperFunction")["Timeout"]

    # When the schedule expression and the timeout parameter are read
    schedule = event["Schedule"]

    # Then it runs every minute (but in the data-api profile: see its own test), its timeout is the
    # SweeperFunctionTimeout parameter (default 120 s), and a failed run is not retried (the next run is coming)
    assert schedule["Fn::If"][0] == "DataApi" and schedule["Fn::If"][2] == "rate(1 minute)"
    assert event.get("Enabled", True) is True
    assert _ref_parameter(timeout) == "SweeperFunctionTimeout"
    assert _default(template, "SweeperFunctionTimeout") == 120
    assert _properties(template, "SweeperFunction")["EventInvokeConfig"]["MaximumRetryAttempts"] == 0


# --- schema migration -------------------------------------------------------------------------------------


def test_migration_custom_resource_runs_the_migrate_function(template: dict[str, Any]) -> None:
    # Given the migration custom resource
    migration = _resource(template, "DatabaseMigration")
    properties = migration["Properties"]

    # When its type, service token and the rest of its properties are read
    others = {k: v for k, v in properties.items() if k not in {"ServiceToken", "ServiceTimeout"}}

    # Then CloudFormation invokes MigrateFunction, and a property follows the layer's version so that every
    # deployment that changes code sends an Update (and the migrations run again)
    assert migration["Type"] == "Custom::DatabaseMigration"
    assert properties["ServiceToken"] == {"Fn::GetAtt": ["MigrateFunction", "Arn"]}
    assert {"Ref": "SharedLayer"} in others.values()
    assert _default(template, _ref_parameter(_properties(template, "MigrateFunction")["Timeout"])) == 300
    assert int(properties["ServiceTimeout"]) > int(
        template["Parameters"][_ref_parameter(_properties(template, "MigrateFunction")["Timeout"])]["MaxValue"]
    )


def test_migration_waits_for_a_created_database(template: dict[str, Any]) -> None:
    # Given the migration custom resource's properties
    properties = _properties(template, "DatabaseMigration")

    # When the properties guarded by CreateDatabase are collected
    guarded = [v["Fn::If"] for v in properties.values() if isinstance(v, dict) and "Fn::If" in v]

    # Then it waits for the database instance and the proxy's targets, but only when the stack makes them
    assert ["CreateDatabase", {"Ref": "DatabaseInstance"}, ""] in guarded
    assert ["ProxiedDatabase", {"Fn::GetAtt": ["DatabaseProxyTargetGroup", "TargetGroupArn"]}, ""] in guarded


@pytest.mark.parametrize("function", SCHEMA_DEPENDENT_FUNCTIONS)
def test_functions_start_only_after_the_migration(template: dict[str, Any], function: str) -> None:
    # Given a function that reads or writes the schema
    resource = _resource(template, function)

    # When its explicit dependencies are read
    depends_on = _as_list(resource.get("DependsOn", []))

    # Then it (and so its event source) is created after the migration, on a fresh stack and on every update
    assert "DatabaseMigration" in depends_on


def test_resources_have_no_circular_dependency(template: dict[str, Any]) -> None:
    # Given the resources and what each must wait for
    graph = _dependencies(template)

    # When a cycle is searched for
    cycle = _find_cycle(graph)

    # Then there is none, and the orderings that matter are in the graph
    assert cycle is None, " -> ".join(cycle or [])
    assert "DatabaseMigration" in graph["UploadFunction"]
    assert "MigrateFunction" in graph["DatabaseMigration"]
    assert "UploadFunction" in graph["DocumentsBucket"]


def test_the_cycle_check_catches_the_migrate_function_waiting_for_its_own_migration(template: dict[str, Any]) -> None:
    # Given a copy of the template where the migration function also waits for the migration
    broken = copy.deepcopy(template)
    broken["Resources"]["MigrateFunction"]["DependsOn"] = "DatabaseMigration"

    # When a cycle is searched for
    cycle = _find_cycle(_dependencies(broken))

    # Then it is found
    assert cycle is not None
    assert {"MigrateFunction", "DatabaseMigration"} <= set(cycle)


# --- database ---------------------------------------------------------------------------------------------


def test_database_is_created_when_no_secret_is_given(template: dict[str, Any]) -> None:
    # Given the DatabaseSecretArn parameter and the CreateDatabase condition
    parameter = template["Parameters"]["DatabaseSecretArn"]
    condition = template["Conditions"]["CreateDatabase"]

    # When the parameter's default and pattern are read
    pattern = parameter["AllowedPattern"]

    # Then an empty secret (the default) creates the database, and a full secret ARN is accepted instead
    assert condition == {"Fn::Equals": [{"Ref": "DatabaseSecretArn"}, ""]}
    assert parameter["Default"] == ""
    assert re.fullmatch(pattern, "")
    assert re.fullmatch(pattern, "arn:aws:secretsmanager:us-east-1:123456789012:secret:pagescribe-db-AbCdEf")
    assert not re.fullmatch(pattern, "postgresql://user:password@host/db")


def test_created_database_requires_subnets(template: dict[str, Any]) -> None:
    # Given the template's rules
    rules = template.get("Rules", {})

    # When the rules that apply exactly when the database is created are picked out
    condition = template["Conditions"]["CreateDatabase"]
    assertions = [a["Assert"] for r in rules.values() if r.get("RuleCondition") == condition for a in r["Assertions"]]

    # Then one rejects an empty subnet list (a DB subnet group and the proxy need subnets) and one an empty VPC
    assert {"Fn::Not": [{"Fn::EachMemberEquals": [{"Ref": "VpcSubnetIds"}, ""]}]} in assertions
    assert {"Fn::Not": [{"Fn::Equals": [{"Ref": "VpcId"}, ""]}]} in assertions
    assert _properties(template, "DatabaseSubnetGroup")["SubnetIds"] == {"Ref": "VpcSubnetIds"}


def test_database_resources_exist_only_when_the_stack_creates_the_database(template: dict[str, Any]) -> None:
    # Given every resource of the database and its network
    database_types = (
        "AWS::RDS::",
        "AWS::SecretsManager::",
        "AWS::EC2::SecurityGroup",
        "AWS::EC2::SecurityGroupIngress",
        "AWS::EC2::SecurityGroupEgress",
    )
    database_resources = {
        n: r
        for n, r in template["Resources"].items()
        if r["Type"].startswith(database_types) and n != "EndpointSecurityGroup"  # Bedrock's VPC endpoints' own
    }

    # When their conditions are read
    conditions = {name: resource.get("Condition") for name, resource in database_resources.items()}

    # Then all of them carry CreateDatabase (the proxy and its network: ProxiedDatabase, which implies it), and the
    # ones the issue asks for are among them
    proxied = {n for n in database_resources if "Proxy" in n or n == "FunctionSecurityGroup"}
    assert conditions == {n: "ProxiedDatabase" if n in proxied else "CreateDatabase" for n in database_resources}
    assert {
        "DatabaseCluster",
        "DatabaseInstance",
        "DatabaseProxy",
        "DatabaseProxyTargetGroup",
        "DatabaseSecret",
        "DatabaseSubnetGroup",
        "DatabaseClusterParameterGroup",
    } <= set(database_resources)


def test_created_database_is_aurora_postgresql_serverless_v2_kept_as_a_snapshot(template: dict[str, Any]) -> None:
    # Given the cluster and its instance
    cluster = _resource(template, "DatabaseCluster")
    instance = _properties(template, "DatabaseInstance")

    # When their engine, capacity and deletion policy are read
    properties = cluster["Properties"]
    version = str(template["Parameters"][_ref_parameter(properties["EngineVersion"])]["Default"])
    scaling = properties["ServerlessV2ScalingConfiguration"]

    # Then it is Aurora PostgreSQL 15/16 on a db.serverless instance from 0.5 ACU, snapshotted when deleted
    assert properties["Engine"] == "aurora-postgresql"
    assert re.fullmatch(r"1[56]\.\d+", version), version
    assert scaling["MinCapacity"]["Fn::If"][2] == 0.5  # 0 in the data-api profile
    assert _ref_parameter(scaling["MaxCapacity"]) == "DatabaseMaxCapacity"
    assert cluster["DeletionPolicy"] == "Snapshot"
    assert properties["StorageEncrypted"] is True
    assert instance["DBInstanceClass"] == "db.serverless"
    assert instance["DBClusterIdentifier"] == {"Ref": "DatabaseCluster"}
    assert instance.get("PubliclyAccessible") is False


def test_created_database_timeouts_are_set_by_the_server_not_by_sessions(template: dict[str, Any]) -> None:
    # Given the cluster and its cluster parameter group
    cluster = _properties(template, "DatabaseCluster")
    group = _properties(template, "DatabaseClusterParameterGroup")

    # When the group's parameters and family are read
    parameters = group["Parameters"]
    version = str(template["Parameters"][_ref_parameter(cluster["EngineVersion"])]["Default"])

    # Then statement and idle-in-transaction timeouts are server settings (nothing to SET behind RDS Proxy)
    assert cluster["DBClusterParameterGroupName"] == {"Ref": "DatabaseClusterParameterGroup"}
    assert {"statement_timeout", "idle_in_transaction_session_timeout"} <= set(parameters)
    assert all(_default(template, _ref_parameter(parameters[name])) > 0 for name in parameters)
    assert group["Family"] == f"aurora-postgresql{version.split('.')[0]}"


def test_created_database_secret_is_rds_style_json(template: dict[str, Any]) -> None:
    # Given the generated secret, its attachment to the cluster and the cluster's credentials
    generated = _properties(template, "DatabaseSecret")["GenerateSecretString"]
    attachment = _properties(template, "DatabaseSecretClusterAttachment")
    cluster = _properties(template, "DatabaseCluster")

    # When the secret's template is parsed
    fields = json.loads(generated["SecretStringTemplate"])

    # Then it holds username, dbname and a generated password, and the attachment adds host and port
    assert set(fields) >= {"username", "dbname"}
    assert generated["GenerateStringKey"] == "password"
    assert cluster["DatabaseName"] == fields["dbname"]
    assert attachment == {
        "SecretId": {"Ref": "DatabaseSecret"},
        "TargetId": {"Ref": "DatabaseCluster"},
        "TargetType": "AWS::RDS::DBCluster",
    }
    assert "${DatabaseSecret}:SecretString:password" in cluster["MasterUserPassword"]["Fn::Sub"]


def test_created_database_is_reached_through_a_tls_only_proxy(template: dict[str, Any]) -> None:
    # Given the proxy, its target group and its role
    proxy = _properties(template, "DatabaseProxy")
    targets = _properties(template, "DatabaseProxyTargetGroup")
    role_statements = list(_policy_statements(_properties(template, "DatabaseProxyRole")["Policies"]))

    # When the secret the proxy authenticates with is read
    secrets = [auth["SecretArn"] for auth in proxy["Auth"]]

    # Then it is a PostgreSQL proxy requiring TLS, in front of the cluster, reading the created secret
    assert proxy["EngineFamily"] == "POSTGRESQL"
    assert proxy["RequireTLS"] is True
    assert secrets == [{"Ref": "DatabaseSecret"}]
    assert proxy["RoleArn"] == {"Fn::GetAtt": ["DatabaseProxyRole", "Arn"]}
    assert targets["DBProxyName"] == {"Ref": "DatabaseProxy"}
    assert targets["DBClusterIdentifiers"] == [{"Ref": "DatabaseCluster"}]
    assert any(
        "secretsmanager:GetSecretValue" in _as_list(s["Action"]) and s["Resource"] == {"Ref": "DatabaseSecret"}
        for s in role_statements
    )


@pytest.mark.parametrize("function", FUNCTIONS)
def test_functions_connect_through_the_proxy_when_the_stack_creates_it(template: dict[str, Any], function: str) -> None:
    # Given a function's merged environment
    env = _environment(template, function)

    # When its database host is read
    host = env.get("DATABASE_HOST")

    # Then it is the proxy endpoint when the stack creates the database, and empty (the secret's host) otherwise
    assert host == {"Fn::If": ["ProxiedDatabase", {"Fn::GetAtt": ["DatabaseProxy", "Endpoint"]}, ""]}


def test_only_the_proxy_reaches_the_database_and_only_the_functions_reach_the_proxy(template: dict[str, Any]) -> None:
    # Given the security groups' ingress rules
    groups = _resources_of_type(template, "AWS::EC2::SecurityGroup")
    ingress = {name: g["Properties"].get("SecurityGroupIngress", []) for name, g in groups.items()}
    # (the cluster's rule exists in the proxied profile only: the Data API reaches it without the VPC)
    assert ingress["DatabaseSecurityGroup"]["Fn::If"][0] == "ProxiedDatabase"
    ingress["DatabaseSecurityGroup"] = ingress["DatabaseSecurityGroup"]["Fn::If"][1]
    ingress_resources = _resources_of_type(template, "AWS::EC2::SecurityGroupIngress")

    # When the sources they admit are collected
    sources = {name: [rule.get("SourceSecurityGroupId") for rule in rules] for name, rules in ingress.items()}
    cidr_ingress = [rule for rules in ingress.values() for rule in rules if "CidrIp" in rule or "CidrIpv6" in rule]

    # Then PostgreSQL flows functions -> proxy -> cluster, and nothing is open to an address range
    assert sources["DatabaseSecurityGroup"] == [{"Ref": "DatabaseProxySecurityGroup"}]
    assert sources["DatabaseProxySecurityGroup"] == [{"Ref": "FunctionSecurityGroup"}]
    assert sources["FunctionSecurityGroup"] == []
    # (and HTTPS to Bedrock's VPC endpoints comes from the functions: their own group, or the first one given)
    function_group = {
        "Fn::If": [
            "ProxiedDatabase",
            {"Ref": "FunctionSecurityGroup"},
            {"Fn::Select": [0, {"Ref": "VpcSecurityGroupIds"}]},
        ]
    }
    assert sources["EndpointSecurityGroup"] == [function_group]
    assert cidr_ingress == []
    assert ingress_resources == {}
    assert _properties(template, "DatabaseCluster")["VpcSecurityGroupIds"] == [{"Ref": "DatabaseSecurityGroup"}]


def test_functions_join_the_vpc_only_when_subnets_are_given(template: dict[str, Any]) -> None:
    # Given the functions' VPC configuration (Globals) and the UseVpc condition
    vpc_config = template["Globals"]["Function"].get("VpcConfig")
    use_vpc = template["Conditions"]["UseVpc"]

    # When the !If is taken apart
    condition, in_vpc, outside = vpc_config["Fn::If"]

    # Then subnets decide, a created database adds the functions' own security group, and no function overrides it
    assert condition == "UseVpc"
    assert _referenced_names(use_vpc) == {"VpcSubnetIds"}
    assert in_vpc["SubnetIds"] == {"Ref": "VpcSubnetIds"}
    assert _mentions(in_vpc["SecurityGroupIds"], "FunctionSecurityGroup")
    assert "VpcSecurityGroupIds" in _referenced_names(in_vpc["SecurityGroupIds"])
    assert outside == {"Ref": "AWS::NoValue"}
    assert [f for f in FUNCTIONS if "VpcConfig" in _properties(template, f)] == []


# --- REST API ---------------------------------------------------------------------------------------------


def test_api_requires_a_key_with_a_throttled_usage_plan(template: dict[str, Any]) -> None:
    # Given the REST API
    api = _properties(template, "Api")

    # When its auth, usage plan and stage are read
    auth = api["Auth"]
    usage_plan = auth["UsagePlan"]

    # Then every method needs an API key by default, SAM creates a per-API usage plan and key, and it throttles
    assert auth["ApiKeyRequired"] is True
    assert usage_plan["CreateUsagePlan"] == "PER_API"
    assert {"RateLimit", "BurstLimit"} <= set(usage_plan["Throttle"])
    assert api["StageName"] == "v1"
    assert api["TracingEnabled"] is True


def test_api_routes_require_a_key_except_health(template: dict[str, Any]) -> None:
    # Given the API function's Api events
    events = [e["Properties"] for e in _properties(template, "ApiFunction")["Events"].values() if e["Type"] == "Api"]

    # When each route's key requirement is resolved (the API's default is "required")
    routes = {(e["Method"].lower(), e["Path"]): e.get("Auth", {}).get("ApiKeyRequired", True) for e in events}

    # Then the issue's routes are all there, on this API, and only /health is open
    assert set(routes) == API_ROUTES
    assert len(events) == len(API_ROUTES)
    assert all(e["RestApiId"] == {"Ref": "Api"} for e in events)
    assert {route for route, required in routes.items() if required is False} == UNAUTHENTICATED_ROUTES
    assert all(required is True for route, required in routes.items() if route not in UNAUTHENTICATED_ROUTES)


# --- alarms and dashboard ---------------------------------------------------------------------------------


def test_dead_letter_queue_alarm_fires_on_the_first_message(template: dict[str, Any]) -> None:
    # Given the template's alarms
    alarms = _alarms(template)

    # When the ones on the dead-letter queue's visible messages are picked out
    dlq_alarms = [
        a
        for a in alarms
        if (a["Namespace"], a["MetricName"]) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible")
        and a["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["DeadLetterQueue", "QueueName"]}}]
    ]

    # Then one fires as soon as there is more than zero
    assert len(dlq_alarms) == 1
    assert (int(dlq_alarms[0]["Threshold"]), dlq_alarms[0]["ComparisonOperator"]) == (0, "GreaterThanThreshold")


def test_queue_age_alarm_uses_the_threshold_parameter(template: dict[str, Any]) -> None:
    # Given the template's alarms
    alarms = _alarms(template)

    # When the ones on the job queue's oldest message are picked out
    age_alarms = [
        a
        for a in alarms
        if (a["Namespace"], a["MetricName"]) == ("AWS/SQS", "ApproximateAgeOfOldestMessage")
        and a["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["Queue", "QueueName"]}}]
    ]

    # Then one compares it with a parameter
    assert len(age_alarms) == 1
    assert age_alarms[0]["ComparisonOperator"] == "GreaterThanThreshold"
    assert _default(template, _ref_parameter(age_alarms[0]["Threshold"])) > 0


@pytest.mark.parametrize("metric", ["Errors", "Throttles"])
@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_function_has_error_and_throttle_alarms(template: dict[str, Any], function: str, metric: str) -> None:
    # Given the template's alarms
    alarms = _alarms(template)

    # When the ones on this function's metric are picked out
    mine = [
        a
        for a in alarms
        if (a["Namespace"], a["MetricName"]) == ("AWS/Lambda", metric)
        and a["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": function}}]
    ]

    # Then there is exactly one, firing on the first occurrence
    assert len(mine) == 1
    assert (int(mine[0]["Threshold"]), mine[0]["ComparisonOperator"]) == (0, "GreaterThanThreshold")


def test_alarms_notify_the_optional_topic(template: dict[str, Any]) -> None:
    # Given the alarms and the AlarmTopicArn parameter
    alarms = _alarms(template)
    parameter = template["Parameters"]["AlarmTopicArn"]

    # When their actions are collected
    actions = [a.get("AlarmActions") for a in alarms]

    # Then every alarm notifies the topic when one is given, and nothing otherwise
    expected = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}
    assert len(alarms) >= 2 + 2 * len(FUNCTIONS)
    assert actions == [expected] * len(alarms)
    assert parameter["Default"] == ""
    assert template["Conditions"]["HasAlarmTopic"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]}


def test_dashboard_body_is_json_naming_only_known_resources(template: dict[str, Any]) -> None:
    # Given the dashboard's !Sub body
    text = _dashboard_text(template)

    # When its ${...} placeholders are collected and replaced by their names
    placeholders = set(re.findall(r"\$\{([^}]+)\}", text))
    body = json.loads(re.sub(r"\$\{([^}]+)\}", lambda m: m.group(1), text))

    # Then it parses as JSON and every placeholder is a pseudo parameter or a resource of this template
    assert body["widgets"], "the dashboard has no widgets"
    unknown = {p for p in placeholders if not p.startswith("AWS::") and p.split(".")[0] not in template["Resources"]}
    assert unknown == set()


def test_dashboard_shows_throughput_latency_failures_cost_and_dead_letters(template: dict[str, Any]) -> None:
    # Given the dashboard's metric rows
    body = json.loads(re.sub(r"\$\{([^}]+)\}", lambda m: m.group(1), _dashboard_text(template)))
    rows = _dashboard_metrics(body)

    # When the application's rows are indexed by metric and statistic
    app_rows = [(fields, options) for _, fields, options in rows if fields[0] == "Pagescribe"]
    stats = {(fields[1], options.get("stat"), options.get("period")) for fields, options in app_rows}
    latency_titles = [title for title, fields, _ in rows if fields[:2] == ["Pagescribe", "ModelLatency"]]

    # Then the issue's panels are there, and every Powertools metric carries the service=pagescribe dimension
    assert ("PagesCompleted", "Sum", 60) in stats
    assert {("ModelLatency", "p50"), ("ModelLatency", "p95")} <= {(m, s) for m, s, _ in stats}
    assert {"PagesFailed", "PagesRequeued", "LeaseLost"} <= {m for m, _, _ in stats}
    assert "CostUSD" in {m for m, s, _ in stats if s == "Sum"}
    assert latency_titles and all("Milliseconds" in title for title in latency_titles)
    assert all(fields[2:] == ["service", "pagescribe"] for fields, _ in app_rows)
    dlq = ["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", "DeadLetterQueue.QueueName"]
    assert dlq in [fields for _, fields, _ in rows]


# --- outputs ----------------------------------------------------------------------------------------------


def test_outputs_name_the_pipeline_endpoints(template: dict[str, Any]) -> None:
    # Given the template's outputs
    outputs = template.get("Outputs", {})

    # When their names are collected
    names = set(outputs)

    # Then operators can find the API and its key, the bucket, the queues, the dashboard and the functions
    assert {"ApiUrl", "ApiKeyId", "BucketName", "QueueUrl", "DeadLetterQueueUrl", "DashboardUrl"} <= names
    assert {f"{function}Name" for function in FUNCTIONS} <= names


def test_api_url_and_key_outputs_point_at_the_v1_stage_and_sams_key(template: dict[str, Any]) -> None:
    # Given the API outputs
    outputs = template["Outputs"]

    # When their values are read
    api_url = outputs["ApiUrl"]["Value"]
    api_key = outputs["ApiKeyId"]["Value"]

    # Then the URL is the regional v1 invoke URL and the key is the one SAM names "<Api logical id>ApiKey"
    assert api_url == {"Fn::Sub": "https://${Api}.execute-api.${AWS::Region}.${AWS::URLSuffix}/v1"}
    assert api_key == {"Ref": "ApiApiKey"}
    assert _properties(template, "Api")["StageName"] == "v1"


def test_dashboard_url_output_opens_this_dashboard(template: dict[str, Any]) -> None:
    # Given the dashboard URL output
    url = template["Outputs"]["DashboardUrl"]["Value"]

    # When its !Sub text is read
    text = url["Fn::Sub"]

    # Then it opens the console's dashboard page for this stack's dashboard in this region
    assert text.startswith("https://${AWS::Region}.console.aws.amazon.com/cloudwatch/home?region=${AWS::Region}")
    assert text.endswith("#dashboards:name=${Dashboard}")


# --- checked pages --------------------------------------------------------------------------------------------


def test_the_escalation_model_is_a_parameter_that_is_off_by_default(template: dict[str, Any]) -> None:
    # Given the template's parameters and the transcribe function's environment
    parameter = template["Parameters"]["EscalationModel"]
    environment = _environment(template, "TranscribeFunction")
    # Then ESCALATION_MODEL comes from the parameter, whose default (empty) means no escalation
    assert environment["ESCALATION_MODEL"] == {"Ref": "EscalationModel"}
    assert parameter["Type"] == "String" and parameter["Default"] == ""


def test_pages_rejected_on_their_flags_raise_an_alarm(template: dict[str, Any]) -> None:
    from pagescribe.observability import NAMESPACE

    # Given the template's alarms
    alarms = [a for a in _alarms(template) if a.get("MetricName") == "PagesRejected"]
    # Then one watches the metric the transcribe function counts, with the dimension Powertools gives it
    assert len(alarms) == 1
    [alarm] = alarms
    assert alarm["Namespace"] == NAMESPACE and alarm["Dimensions"] == [{"Name": "service", "Value": "pagescribe"}]
    assert alarm["Statistic"] == "Sum" and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert _default(template, _ref_parameter(alarm["Threshold"])) >= 1


def test_the_dashboard_shows_a_metric_per_flag(template: dict[str, Any]) -> None:
    from pagescribe.checks import RETIRED_FLAGS, Flag
    from pagescribe.observability import flag_metric

    # Given the dashboard's metric rows
    body = json.loads(re.sub(r"\$\{([^}]+)\}", lambda m: m.group(1), _dashboard_text(template)))
    shown = {fields[1] for _, fields, _ in _dashboard_metrics(body) if fields[0] == "Pagescribe"}
    # Then every flag's metric that can still be raised, as the code names it, is on it, with escalations and
    # rejections; a retired flag's is not
    raised = set(Flag) - RETIRED_FLAGS
    assert {flag_metric(flag) for flag in raised} | {"PagesEscalated", "PagesRejected"} <= shown
    assert not {flag_metric(flag) for flag in RETIRED_FLAGS} & shown


def test_an_upload_event_the_function_gives_up_on_goes_to_a_queue_the_sweeper_drains_under_an_alarm(
    template: dict[str, Any],
) -> None:
    # Given the upload function's asynchronous invocation settings
    invoke = _properties(template, "UploadFunction")["EventInvokeConfig"]

    # Then a failed event goes, after its retries, to the failures queue
    assert invoke["DestinationConfig"]["OnFailure"] == {
        "Type": "SQS",
        "Destination": {"Fn::GetAtt": ["UploadFailuresQueue", "Arn"]},
    }
    assert _resource(template, "UploadFailuresQueue")["Type"] == "AWS::SQS::Queue"
    # And the sweeper is told that queue and may read and delete from it
    assert _environment(template, "SweeperFunction")["UPLOAD_FAILURES_QUEUE_URL"] == {"Ref": "UploadFailuresQueue"}
    drains = [
        s
        for p in _properties(template, "SweeperFunction")["Policies"]
        if isinstance(p, dict)
        for s in p.get("Statement", [])
        if s.get("Resource") == {"Fn::GetAtt": ["UploadFailuresQueue", "Arn"]}
    ]
    assert [set(s["Action"]) for s in drains] == [{"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:DeleteMessageBatch"}]
    # And an alarm fires whenever a record lands there
    [alarm] = [
        a
        for a in _alarms(template)
        if a.get("Dimensions") == [{"Name": "QueueName", "Value": {"Fn::GetAtt": ["UploadFailuresQueue", "QueueName"]}}]
    ]
    assert (alarm["MetricName"], alarm["Statistic"], alarm["Threshold"]) == ("NumberOfMessagesSent", "Sum", 0)


def test_api_access_logging_is_on_by_default(template: dict[str, Any]) -> None:
    assert template["Parameters"]["ApiAccessLogging"]["Default"] == "Enabled"
    settings = _properties(template, "Api")["AccessLogSetting"]
    assert settings["Fn::If"][0] == "EnableApiAccessLogging"


@pytest.mark.parametrize("function", SCHEMA_DEPENDENT_FUNCTIONS)
def test_without_rds_proxy_the_functions_that_open_connections_have_reserved_concurrency(
    template: dict[str, Any], function: str
) -> None:
    # Given a function that talks to the database
    reserved = _properties(template, function)["ReservedConcurrentExecutions"]

    # Then its concurrency is left to RDS Proxy when the stack creates the database, and capped by a parameter when
    # it connects straight to an existing one
    condition, with_proxy, direct = reserved["Fn::If"]
    assert (condition, with_proxy) == ("CreateDatabase", {"Ref": "AWS::NoValue"})
    assert direct["Ref"] in template["Parameters"] and direct["Ref"].startswith("DirectDatabase")


def test_bucket_versioning_is_an_option_with_noncurrent_versions_expiring(template: dict[str, Any]) -> None:
    bucket = _properties(template, "DocumentsBucket")
    assert bucket["VersioningConfiguration"] == {"Status": {"Ref": "BucketVersioning"}}
    assert set(template["Parameters"]["BucketVersioning"]["AllowedValues"]) == {"Enabled", "Suspended"}
    [rule] = [r for r in bucket["LifecycleConfiguration"]["Rules"] if "NoncurrentVersionExpiration" in r]
    assert rule["Status"] == {"Fn::If": ["VersionedBucket", "Enabled", "Disabled"]}


def test_the_api_is_told_whether_only_tenant_keys_count_and_which_models_callers_may_name(
    template: dict[str, Any],
) -> None:
    environment = _environment(template, "ApiFunction")
    assert environment["TENANT_KEYS_ONLY"] == {"Ref": "TenantKeysOnly"}
    assert environment["ALLOWED_MODELS"] == {"Ref": "AllowedModels"}
    # once a tenant holds a key, keys that are no tenant's are refused, unless the operator says otherwise
    assert template["Parameters"]["TenantKeysOnly"]["Default"] == "auto"
    assert template["Parameters"]["TenantKeysOnly"]["AllowedValues"] == ["auto", "true", "false"]
    assert template["Outputs"]["UsagePlanId"]["Value"] == {"Ref": "ApiUsagePlan"}


# --- Bedrock: the provider parameter, the invoke policy, VPC endpoints ---------------------------------------

_NO_VALUE = object()
_PSEUDO = {
    "AWS::Partition": "aws",
    "AWS::Region": "eu-west-1",
    "AWS::AccountId": "123456789012",
    "AWS::StackName": "ps",
}


class _Stack:
    """The template as CloudFormation would build it from ``overrides`` over the parameters' defaults: conditions
    evaluated and the intrinsic functions a policy or an endpoint uses resolved."""

    def __init__(self, template: dict[str, Any], **overrides: str) -> None:
        self.template = template
        self.params: dict[str, Any] = {}
        for name, spec in template["Parameters"].items():
            value = overrides.get(name, spec.get("Default", ""))
            self.params[name] = value.split(",") if spec["Type"] == "CommaDelimitedList" else value

    def condition(self, name: str) -> bool:
        return bool(self.resolve(self.template["Conditions"][name]))

    def exists(self, resource: str) -> bool:
        condition = _resource(self.template, resource).get("Condition")
        return condition is None or self.condition(condition)

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self.resolve(n) for n in node) if v is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        [(function, args)] = node.items() if len(node) == 1 else [("", [])]
        args = cast(Any, args)
        if function != "Ref" and function != "Condition" and not function.startswith("Fn::"):
            return {
                key: value for key, value in ((k, self.resolve(v)) for k, v in node.items()) if value is not _NO_VALUE
            }
        if function == "Ref":
            return _NO_VALUE if args == "AWS::NoValue" else _PSEUDO.get(args, self.params.get(args, {"Ref": args}))
        if function == "Condition":
            return self.condition(args)
        if function == "Fn::If":
            return self.resolve(args[1] if self.condition(args[0]) else args[2])
        values = [self.resolve(a) for a in args] if isinstance(args, list) else self.resolve(args)
        if function == "Fn::Sub":
            text, names = (values[0], values[1]) if isinstance(values, list) else (values, {})
            names = {**_PSEUDO, **self.params, **self.resolve(names)}
            return re.sub(r"\$\{([\w:.]+)\}", lambda m: str(names.get(m[1], m[0])), text)
        simple: dict[str, Callable[[], Any]] = {
            "Fn::Select": lambda: values[1][int(values[0])],
            "Fn::Split": lambda: values[1].split(values[0]),
            "Fn::Join": lambda: values[0].join(v for v in values[1] for v in _as_list(v)),
            "Fn::Equals": lambda: values[0] == values[1],
            "Fn::Not": lambda: not values[0],
            "Fn::And": lambda: all(values),
            "Fn::Or": lambda: any(values),
        }
        return simple[function]() if function in simple else node


def _bedrock_resources(stack: _Stack) -> list[str]:
    """The resources the transcribe function may invoke Bedrock on, in the stack built (none without the policy)."""
    policies = stack.resolve(_properties(stack.template, "TranscribeFunction")["Policies"])
    if {"Ref": "BedrockInvokePolicy"} not in policies:
        return []
    assert stack.exists("BedrockInvokePolicy")
    document = stack.resolve(_properties(stack.template, "BedrockInvokePolicy")["PolicyDocument"])
    assert [s["Action"] for s in document["Statement"]] == [
        ["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]
    ]
    return [r for s in document["Statement"] for r in s["Resource"]]


NOVA = "amazon.nova-lite-v1:0"
CLAUDE = "anthropic.claude-3-5-sonnet-20241022-v2:0"


@pytest.mark.parametrize(
    ("parameters", "resources"),
    [
        ({"Provider": "bedrock", "Model": NOVA}, [f"arn:aws:bedrock:eu-west-1::foundation-model/{NOVA}"]),
        (
            {"Provider": "bedrock", "Model": f"eu.{NOVA}", "EscalationModel": f"us.{CLAUDE}"},
            [
                f"arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.{NOVA}",
                f"arn:aws:bedrock:*::foundation-model/{NOVA}",
                f"arn:aws:bedrock:eu-west-1:123456789012:inference-profile/us.{CLAUDE}",
                f"arn:aws:bedrock:*::foundation-model/{CLAUDE}",
            ],
        ),
        (
            {
                "Provider": "bedrock",
                "Model": NOVA,
                "EscalationModel": "o/big",
                "EscalationProvider": "openai-compatible",
            },
            [f"arn:aws:bedrock:eu-west-1::foundation-model/{NOVA}"],
        ),
        (
            {"Model": "google/gemini-2.5-flash", "EscalationModel": CLAUDE, "EscalationProvider": "bedrock"},
            [f"arn:aws:bedrock:eu-west-1::foundation-model/{CLAUDE}"],
        ),
        ({"Model": "google/gemini-2.5-flash", "EscalationModel": "o/big"}, []),
        ({"Provider": "offline"}, []),
    ],
)
def test_the_transcribe_function_may_invoke_exactly_the_configured_bedrock_models(
    template: dict[str, Any], parameters: dict[str, str], resources: list[str]
) -> None:
    # Given a stack built with these parameters
    stack = _Stack(template, **parameters)
    # Then the transcribe function may invoke exactly the models asked on Bedrock, and no other function any
    assert _bedrock_resources(stack) == resources
    assert stack.exists("BedrockInvokePolicy") == bool(resources)
    others = [f for f in FUNCTIONS if f != "TranscribeFunction" and _mentions(_properties(template, f), "Bedrock")]
    assert others == []


VPC = {"VpcId": "vpc-0abc", "VpcSubnetIds": "subnet-a,subnet-b", "VpcSecurityGroupIds": "sg-1"}
ENDPOINTS = ("BedrockRuntimeEndpoint", "SecretsManagerEndpoint", "SqsEndpoint", "SsmEndpoint", "S3GatewayEndpoint")


@pytest.mark.parametrize(
    ("parameters", "created"),
    [
        ({"Provider": "bedrock", "Model": NOVA, **VPC}, set(ENDPOINTS) - {"SsmEndpoint"}),
        ({"Provider": "bedrock", "Model": NOVA, "CallbackSecretParameter": "/cb", **VPC}, set(ENDPOINTS)),
        (
            {"Provider": "bedrock", "Model": NOVA, "EscalationModel": "o/x", "EscalationProvider": "openai-compatible"}
            | VPC,
            set(ENDPOINTS),
        ),
        ({"Provider": "bedrock", "Model": NOVA, "VpcEndpoints": "none", **VPC}, set()),
        ({"Provider": "bedrock", "Model": NOVA}, set()),
        ({"Provider": "openai-compatible", **VPC}, set()),
    ],
)
def test_bedrock_in_a_vpc_gets_the_endpoints_that_replace_a_nat_gateway(
    template: dict[str, Any], parameters: dict[str, str], created: set[str]
) -> None:
    # Given a stack built with these parameters
    stack = _Stack(template, VpcRouteTableIds="rtb-1,rtb-2", **parameters)
    # Then the endpoints exist only for Bedrock in a VPC (SSM only where a parameter is read), each in the VPC
    assert {e for e in ENDPOINTS if stack.exists(e)} == created
    assert stack.exists("EndpointSecurityGroup") == bool(created)
    [ingress] = stack.resolve(_properties(template, "EndpointSecurityGroup"))["SecurityGroupIngress"]
    assert (ingress["FromPort"], ingress["SourceSecurityGroupId"]) == (443, {"Ref": "FunctionSecurityGroup"})
    services = {e: stack.resolve(_properties(template, e)["ServiceName"]) for e in created}
    expected = {"BedrockRuntimeEndpoint": "bedrock-runtime", "SecretsManagerEndpoint": "secretsmanager"}
    expected |= {"SqsEndpoint": "sqs", "SsmEndpoint": "ssm", "S3GatewayEndpoint": "s3"}
    assert services == {e: f"com.amazonaws.eu-west-1.{expected[e]}" for e in created}
    for endpoint in created:
        properties = stack.resolve(_properties(template, endpoint))
        assert properties["VpcId"] == "vpc-0abc"
        if properties["VpcEndpointType"] == "Gateway":
            assert properties["RouteTableIds"] == ["rtb-1", "rtb-2"]
        else:
            assert properties["SubnetIds"] == ["subnet-a", "subnet-b"] and properties["PrivateDnsEnabled"] is True


def test_bedrock_settings_are_parameters_matching_the_settings(template: dict[str, Any]) -> None:
    from typing import get_args

    from pagescribe.settings import Settings

    environment = _environment(template, "TranscribeFunction")
    assert environment["PROVIDER"] == {"Ref": "Provider"}
    assert environment["ESCALATION_PROVIDER"] == {"Ref": "EscalationProvider"}
    assert environment["BEDROCK_PRICES"] == {"Ref": "BedrockPrices"}
    provider = get_args(Settings.model_fields["provider"].annotation)
    escalation = get_args(get_args(Settings.model_fields["escalation_provider"].annotation)[0])
    assert template["Parameters"]["Provider"]["AllowedValues"] == list(provider)
    assert template["Parameters"]["EscalationProvider"]["AllowedValues"] == ["", *escalation]
    rule = template["Rules"]["BedrockEndpointsNeedTheVpcAndItsRouteTables"]
    assert {"VpcId", "VpcRouteTableIds"} <= _referenced_names(rule["Assertions"])
