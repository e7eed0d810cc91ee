"""Invariants of the SAM template (template.yaml) that `sam validate --lint` cannot see.

The template is parsed as YAML with CloudFormation's short-form tags (!Ref, !Sub, !GetAtt, ...) mapped to
their long form ({"Ref": ...}, {"Fn::Sub": ...}, {"Fn::GetAtt": [...]}); nothing here talks to AWS.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "template.yaml"

# pagescribe.settings.Settings.result_reserve_seconds: time kept back from every model call to write its result.
RESULT_RESERVE_SECONDS = 10
FUNCTIONS = ("UploadFunction", "TranscribeFunction")
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


def test_transcribe_may_write_only_under_transcripts(template: dict[str, Any]) -> None:
    # Given the transcribe function's inline statements
    policies = _properties(template, "TranscribeFunction")["Policies"]
    statements = [s for p in policies if isinstance(p, dict) for s in _policy_statements(p.get("Statement"))]

    # When the statements allowing s3:PutObject are picked out
    put_resources = [r for s in statements if "s3:PutObject" in _as_list(s["Action"]) for r in _as_list(s["Resource"])]

    # Then each is limited to the transcripts/ prefix, and no S3 policy template grants writes
    assert put_resources, "the transcribe function cannot write transcripts"
    assert all(isinstance(r, dict) and r["Fn::Sub"].endswith("-documents/transcripts/*") for r in put_resources)
    assert not [p for p in policies if isinstance(p, dict) and {"S3CrudPolicy", "S3WritePolicy"} & set(p)]


def test_no_environment_variable_holds_a_secret_value(template: dict[str, Any]) -> None:
    # Given every environment variable the functions receive
    variables = {(f, name): value for f in FUNCTIONS for name, value in _environment(template, f).items()}

    # When the secret-looking ones are checked for literal values
    literal_secrets = [
        key for key, value in variables.items() if SECRET_LOOKING_NAME.search(key[1]) and not isinstance(value, dict)
    ]

    # Then secrets are passed only as references (a parameter or secret NAME/ARN), never as values
    assert literal_secrets == []
    assert not [key for key in variables if key[1] in {"PROVIDER_API_KEY", "DATABASE_URL"}]
    assert all(_ref_parameter(variables[(f, "PROVIDER_API_KEY_PARAMETER")]) for f in FUNCTIONS)
    assert all(_ref_parameter(variables[(f, "DATABASE_SECRET_ARN")]) for f in FUNCTIONS)


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


# --- packaging and outputs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "code_uri"), [("UploadFunction", "functions/upload/"), ("TranscribeFunction", "functions/transcribe/")]
)
def test_functions_run_their_handler_on_the_shared_layer(
    template: dict[str, Any], function: str, code_uri: str
) -> None:
    # Given a function and the shared layer
    properties = _properties(template, function)
    layer = _resource(template, "SharedLayer")
    runtime = properties.get("Runtime", template["Globals"]["Function"].get("Runtime"))

    # When their packaging is read
    layers = properties.get("Layers", []) + template["Globals"]["Function"].get("Layers", [])

    # Then the handler comes from its own directory and the pagescribe package from the layer
    assert (properties["CodeUri"], properties["Handler"], runtime) == (code_uri, "app.handler", "python3.12")
    assert layers == [{"Ref": "SharedLayer"}]
    assert layer["Properties"]["ContentUri"] == "shared/"
    assert layer["Metadata"]["BuildMethod"] == "python3.12"


@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_function_has_a_log_group_with_retention(template: dict[str, Any], function: str) -> None:
    # Given the log groups of the template
    groups = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Logs::LogGroup"]

    # When the one named after the function is looked up
    mine = [g for g in groups if g["LogGroupName"] == {"Fn::Sub": f"/aws/lambda/${{{function}}}"}]

    # Then it exists and expires its events
    assert len(mine) == 1
    assert int(mine[0]["RetentionInDays"]) > 0


def test_outputs_name_the_pipeline_endpoints(template: dict[str, Any]) -> None:
    # Given the template's outputs
    outputs = template.get("Outputs", {})

    # When their names are collected
    names = set(outputs)

    # Then operators can find the bucket, the queues and the functions
    assert {"BucketName", "QueueUrl", "DeadLetterQueueUrl", "UploadFunctionName", "TranscribeFunctionName"} <= names
