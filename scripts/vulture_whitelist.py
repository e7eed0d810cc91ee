"""Names vulture cannot see used: read by a framework, a protocol or serialisation, never called by our code.

Checked by `vulture` (its settings are [tool.vulture] in pyproject.toml); never imported or run.
"""

# pydantic models of the API: fields serialised into the responses (pagescribe/api_schemas.py)
cost_per_page_usd  # also service.Estimate, serialised with dataclasses.asdict
upload_method
upload_headers
page_errors
flagged_pages
corrected_pages
pages_requeued

# dataclasses serialised with dataclasses.asdict: the sweeper's report (sweeping.py), a rule's result
# (olmocr_bench.py)
leases_requeued
leases_failed
jobs_sent
jobs_unsent
documents_finished
callbacks_delivered
uploads_expired
batch_pages_moved
batch_pages_submitted
batch_answers_not_kept
batch_pages_answered
test_id

# Powertools' LambdaContext reads these attributes behind its properties (pagescribe_local/stack.py)
_function_name
_function_version
_invoked_function_arn
_memory_limit_in_mb
_aws_request_id
_log_group_name
_log_stream_name

# Selenium reads the browser binary it is given (tests/browser/conftest.py)
binary_location

# http.server's BaseHTTPRequestHandler calls this for each request it answers (pagescribe_local/cli.py: serve)
log_request

# Shipped, read only by tests and benchmarks: each says why it ships.
RETIRED_FLAGS  # checks.py: the flags kept in the enum for answers recorded before they were retired; the metrics test
# holds the dashboard to showing none of them
engine_loads  # providers/offline.py: how often the engine was built (lazily, once): what the tests observe of it
pids  # rendering.py: the render workers' processes, whose memory the benchmarks measure and the tests kill
table_shapes  # pagescribe_local/scoring.py: the tables a reading holds, scored by bench.ocr beside its CER
DONE  # domain.EscalationState: the state the fenced writes' SQL gives a page that ended after it escalated

# pagescribe.client: methods and model fields for the programs that use it (tests/integration/test_client.py)
rerun
correct
heading_path
json_transcript
