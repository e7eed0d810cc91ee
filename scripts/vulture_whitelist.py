"""Names vulture cannot see used: read by a framework, a protocol or serialisation, never called by our code.

Checked by `vulture` (its settings are [tool.vulture] in pyproject.toml); never imported or run.
"""

# pydantic models of the API: fields serialised into the responses (pagescribe/handlers/api/schemas.py)
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
