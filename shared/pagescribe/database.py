"""Every SQL statement pagescribe runs, named and built once, and the engine they run on.

PostgreSQL only, in every mode (RDS/Aurora behind RDS Proxy, CI's server, the embedded server of the local
commands). Nothing here pins a proxied session: psycopg's automatic prepared statements are off, no ``SET``,
no advisory locks, no temporary tables. Every transaction is one short unit of work; none is ever open
while a model call runs.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import QueuePool

from pagescribe.domain import (
    NO_OUTCOME,
    ApiKeyRecord,
    AttemptOutcome,
    AttemptRecord,
    ClaimedJob,
    Claims,
    CorrectionSave,
    CreatedDocument,
    DocumentListing,
    DocumentProgress,
    DocumentRecord,
    DocumentStatus,
    DueCallback,
    FailedCall,
    JobStatus,
    NewDocument,
    PageCorrection,
    PageImageRecord,
    PageIssue,
    PageOutcome,
    PageRecord,
    PageRerunState,
    PageSummary,
    PendingDocument,
    RateBucket,
    RateGrant,
    Spend,
    SpendVerdict,
    TenantDay,
    TranscriptState,
    TranscriptVersion,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


# --- statements -------------------------------------------------------------------------------------------

INSERT_DOCUMENT = """
    INSERT INTO documents (id, bucket, object_key, etag, version_id, size_bytes, kind, page_count, source_page_count,
                           status, error, model, escalation_model, prompt, tenant_id, sha256, chunks, merge_tables,
                           furniture, finished_at)
    VALUES (%(id)s, %(bucket)s, %(object_key)s, %(etag)s, %(version_id)s, %(size_bytes)s, %(kind)s, %(page_count)s,
            %(source_page_count)s, %(status)s, %(error)s, %(model)s, %(escalation_model)s, %(prompt)s, %(tenant_id)s,
            %(sha256)s, %(chunks)s, %(merge_tables)s, %(furniture)s, CASE WHEN %(status)s = 'FAILED' THEN now() END)
    ON CONFLICT (bucket, object_key, etag, version_id) DO NOTHING
    RETURNING id
    """

INSERT_PENDING_DOCUMENT = """
    INSERT INTO documents (id, bucket, object_key, etag, version_id, size_bytes, status, model, escalation_model,
                           prompt, filename, requested_pages, callback_url, tenant_id, reuse, max_cost_usd,
                           second_read, chunks, merge_tables, furniture)
    VALUES (%(id)s, %(bucket)s, %(object_key)s, '', '', 0, 'AWAITING_UPLOAD', %(model)s, %(escalation_model)s,
            %(prompt)s, %(filename)s, %(requested_pages)s, %(callback_url)s, %(tenant_id)s, %(reuse)s,
            %(max_cost_usd)s, %(second_read)s, %(chunks)s, %(merge_tables)s, %(furniture)s)
    ON CONFLICT (id) DO NOTHING
    """

# The upload of a document created through the API: it becomes PROCESSING (or FAILED) once.
ACTIVATE_DOCUMENT = """
    UPDATE documents
    SET etag = %(etag)s, version_id = %(version_id)s, size_bytes = %(size_bytes)s, kind = %(kind)s,
        page_count = %(page_count)s, source_page_count = %(source_page_count)s, sha256 = %(sha256)s,
        status = %(status)s, error = %(error)s, finished_at = CASE WHEN %(status)s = 'FAILED' THEN now() END,
        updated_at = now()
    WHERE id = %(id)s AND status = 'AWAITING_UPLOAD'
    RETURNING id
    """

FIND_DOCUMENT_BY_OBJECT = """
    SELECT id FROM documents
    WHERE bucket = %(bucket)s AND object_key = %(object_key)s AND etag = %(etag)s AND version_id = %(version_id)s
    """

INSERT_JOBS = """
    INSERT INTO jobs (document_id, page_number)
    SELECT %(document_id)s, page FROM unnest(CAST(%(pages)s AS integer[])) AS page
    RETURNING id, page_number
    """

MARK_ENQUEUED = """
    UPDATE jobs SET enqueued_at = now(), updated_at = now()
    WHERE id = ANY(CAST(%(ids)s AS uuid[])) AND status = 'QUEUED'
    """

# Both claims end the same way: the candidate row moves QUEUED → PROCESSING under a fresh lease.
_TAKE_LEASE = """
    UPDATE jobs
    SET status = 'PROCESSING', attempts = attempts + 1, lease_token = %(lease_token)s,
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), reserved_usd = NULL,
        started_at = now(), updated_at = now()
    WHERE id IN (SELECT id FROM candidate)
    RETURNING id, document_id, page_number, attempts, lease_token, escalation, flags,
              extract(epoch FROM rate_slot_at - now()) AS slot_in_seconds, requested_model
"""

# The claim: one statement, one round trip, for every job of an SQS batch at once. The rows are locked with
# SKIP LOCKED, so a concurrent claim of the same job (a duplicate delivery) finds nothing and returns nothing.
# An expired lease proves its holder dead (Lambda is killed at its timeout and the lease outlasts the
# invocation), so it may be taken over. The jobs claimed together share the statement's fresh lease token:
# a token fences one claim of one job, and no statement claims a job twice.
CLAIM_JOBS_BY_ID = (
    """
    WITH candidate AS (
        SELECT id FROM jobs
        WHERE id = ANY(CAST(%(job_ids)s AS uuid[]))
          AND attempts < %(max_attempts)s
          AND (status = 'QUEUED' OR (status = 'PROCESSING' AND lease_expires_at < now()))
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )"""
    + _TAKE_LEASE
)

# A job the claim skipped is a duplicate only if it is still not claimable once the transaction holding its row has
# ended: the upload (or a retry, a re-run) holds the row for a moment while it stamps it as sent, just after its
# message went out, and the sweeper while it takes it to resend; a delivery arriving then must not be dropped. So a
# skipped job is claimed once more, alone, waiting for its row at most CLAIM_LOCK_WAIT_MS; once the row is free its
# condition is checked again on the state just committed, so a job a concurrent delivery claimed is not taken twice.
CLAIM_LOCK_WAIT_MS = 2000
SET_CLAIM_LOCK_WAIT = "SELECT set_config('lock_timeout', %(lock_wait)s, true)"
CLAIM_JOB_WAITING = (
    """
    WITH candidate AS (
        SELECT id FROM jobs
        WHERE id = %(job_id)s
          AND attempts < %(max_attempts)s
          AND (status = 'QUEUED' OR (status = 'PROCESSING' AND lease_expires_at < now()))
        FOR UPDATE
    )"""
    + _TAKE_LEASE
)

# Ordered polling for the oldest due queued jobs: the partial index ix_jobs_queued serves it; no joins.
CLAIM_NEXT_QUEUED_JOBS = (
    """
    WITH candidate AS (
        SELECT id FROM jobs
        WHERE status = 'QUEUED' AND available_at <= now() AND attempts < %(max_attempts)s
        ORDER BY created_at, page_number
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )"""
    + _TAKE_LEASE
)

# A model call that answered is recorded whether or not its result may be written: it was paid for. Its outcome is the
# one asked for when the fenced write it travels with succeeds, LEASE_LOST when the write found the lease gone. A page
# answered without a call (its own text layer) records nothing. The call's cost counts in its tenant's day at once.
_RECORD_ATTEMPT = """
    recorded AS (
        INSERT INTO attempts (job_id, document_id, claim, outcome, model, provider, finish_reason, prompt_tokens,
                              completion_tokens, cost, latency_ms, provider_request_id, flags, confidence, second_read)
        SELECT %(job_id)s, %(document_id)s, %(claim)s,
               CASE WHEN EXISTS (SELECT 1 FROM written) THEN %(outcome)s ELSE 'LEASE_LOST' END,
               %(model)s, %(provider)s, %(finish_reason)s, %(prompt_tokens)s, %(completion_tokens)s, %(cost)s,
               %(latency_ms)s, %(provider_request_id)s, %(attempt_flags)s, %(confidence)s, %(second_read)s
        WHERE %(called)s
    ),
    counted AS (
        INSERT INTO tenant_days AS t (tenant_id, day, spent_usd, calls)
        SELECT tenant_id, CAST(now() AT TIME ZONE 'UTC' AS date), coalesce(%(cost)s, 0), 1
        FROM documents WHERE id = %(document_id)s AND %(called)s
        ON CONFLICT (tenant_id, day) DO UPDATE SET spent_usd = t.spent_usd + excluded.spent_usd, calls = t.calls + 1
    )"""

_ANSWER_COLUMNS = (
    "result_text",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cost",
    "model",
    "provider",
    "provider_request_id",
    "latency_ms",
    "confidence",
    "grounding",
)

# The end of a page, written by the holder of the current lease only. A write that carries an answer replaces the
# page's answer and flags; one that does not (a failure before or without an answer) keeps the answer the page has
# (the one it escalated from) and adds its flags to that answer's.
_WRITE_RESULT = (
    "\n        "
    + ",\n        ".join(
        f"{column} = CASE WHEN %(answered)s THEN %({column})s ELSE {column} END" for column in _ANSWER_COLUMNS
    )
    + """,
        flags = CASE WHEN %(answered)s THEN %(flags)s ELSE flags || %(flags)s END,
        escalation = CASE WHEN escalation IS NOT NULL THEN 'DONE' END, rate_slot_at = NULL, reserved_usd = NULL,
        lease_expires_at = NULL, completed_at = now(), updated_at = now()
    WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s"""
)

# Fenced completion: only the holder of the current lease may write; the document's counter moves in the
# same statement, so exactly one completion sees the last page land.
COMPLETE_JOB = (
    """
    WITH written AS (
        UPDATE jobs
        SET status = 'COMPLETED', error = NULL,"""
    + _WRITE_RESULT
    + """
        RETURNING document_id
    ),"""
    + _RECORD_ATTEMPT
    + """
    UPDATE documents
    SET pages_completed = pages_completed + 1, updated_at = now()
    WHERE id IN (SELECT document_id FROM written)
    RETURNING id, page_count, pages_completed, pages_failed
    """
)

# A failed page keeps the text of its last answer (a truncated or hard-flagged one, or the answer before an
# escalation that did not answer).
FAIL_JOB = (
    """
    WITH written AS (
        UPDATE jobs
        SET status = 'FAILED', error = %(error)s,"""
    + _WRITE_RESULT
    + """
        RETURNING document_id
    ),"""
    + _RECORD_ATTEMPT
    + """
    UPDATE documents
    SET pages_failed = pages_failed + 1, updated_at = now()
    WHERE id IN (SELECT document_id FROM written)
    RETURNING id, page_count, pages_completed, pages_failed
    """
)

# The one escalation of a page: its hard-flagged answer is kept on the page (the text to fail with if the escalation
# does not do better) and the page, still under the same lease, goes to the escalation model. A page escalates once:
# a later claim finds it PENDING and asks the escalation model directly; DONE never escalates again.
ESCALATE_JOB = (
    """
    WITH written AS (
        UPDATE jobs
        SET escalation = 'PENDING', flags = %(flags)s, updated_at = now(),
            """
    + ",\n            ".join(f"{column} = %({column})s" for column in _ANSWER_COLUMNS)
    + """
        WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s AND escalation IS NULL
        RETURNING document_id
    ),"""
    + _RECORD_ATTEMPT
    + """
    SELECT document_id FROM written
    """
)

REQUEUE_JOB = """
    UPDATE jobs
    SET status = 'QUEUED', error = %(error)s, lease_token = NULL, lease_expires_at = NULL, reserved_usd = NULL,
        rate_slot_at = NULL, available_at = now() + make_interval(secs => %(delay_seconds)s), enqueued_at = NULL,
        updated_at = now()
    WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
    RETURNING id
    """

# A page held back before its call (the rate governor, or a cost cap waiting on calls in flight): back to QUEUED
# without using up an attempt (it never reached the model), keeping the governor's slot it reserved, if any.
DEFER_JOB = """
    UPDATE jobs
    SET status = 'QUEUED', attempts = attempts - 1, error = %(error)s, lease_token = NULL, lease_expires_at = NULL,
        reserved_usd = NULL, rate_slot_at = CASE WHEN %(keep_slot)s THEN rate_slot_at ELSE %(slot_at)s END,
        available_at = now() + make_interval(secs => %(delay_seconds)s), enqueued_at = NULL, updated_at = now()
    WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
    RETURNING id
    """

# A page whose call would exceed its document's cost cap or its tenant's daily budget ends without being started.
# It keeps any answer it has (one it escalated from) and counts with the pages that ended without one.
SKIP_JOB = """
    WITH written AS (
        UPDATE jobs
        SET status = 'SKIPPED', error = %(error)s, rate_slot_at = NULL, reserved_usd = NULL,
            escalation = CASE WHEN escalation IS NOT NULL THEN 'DONE' END,
            lease_expires_at = NULL, completed_at = now(), updated_at = now()
        WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
        RETURNING document_id
    )
    UPDATE documents
    SET pages_failed = pages_failed + 1, updated_at = now()
    WHERE id IN (SELECT document_id FROM written)
    RETURNING id, page_count, pages_completed, pages_failed
    """

# A model call that failed (an HTTP error, a timeout, a 429) is recorded too: it was made, and a 429 is the rate the
# dashboard shows. A provider reports no usage for a failed call; when it does, the cost counts.
RECORD_FAILED_CALL = """
    WITH recorded AS (
        INSERT INTO attempts (job_id, document_id, claim, outcome, model, provider, latency_ms, status_code, error)
        VALUES (%(job_id)s, %(document_id)s, %(claim)s, %(outcome)s, %(model)s, %(provider)s, %(latency_ms)s,
                %(status_code)s, %(error)s)
    )
    INSERT INTO tenant_days AS t (tenant_id, day, calls)
    SELECT tenant_id, CAST(now() AT TIME ZONE 'UTC' AS date), 1 FROM documents WHERE id = %(document_id)s
    ON CONFLICT (tenant_id, day) DO UPDATE SET calls = t.calls + 1
    """

# --- spend control ----------------------------------------------------------------------------------------

# The gate before a model call: LOCK_SPENDERS, then ADMIT_SPEND, in one short transaction. The document's and the
# tenant's rows are locked first, so calls of one tenant pass the gate one at a time, and ADMIT_SPEND, a statement of
# its own, reads what the gates before it committed (in one statement, the reads of the other tables would keep the
# snapshot taken before the lock was granted, and miss the price a concurrent gate had just held).
#
# A call is held at its worst case (reserve), priced on the tenant's own latest calls of the model, never on other
# tenants': each call's cost is at least its prompt tokens times the price of a prompt token, and at least its
# completion tokens times the price of a completion token, so the least cost per prompt token and the least cost per
# completion token seen are upper bounds of those prices. The worst case is the largest prompt seen (plus the
# document's own prompt text, never more tokens than bytes) at the one, and the output limit (MAX_OUTPUT_TOKENS) at
# the other; where the calls reported no tokens, the dearest call seen. While a call runs its reserve is held on its
# page (reserved_usd) and it is settled by the real cost when the call is recorded with the page's end.
#
# A page ends SKIPPED when what its tenant spent today plus the reserve would pass the daily budget, or what its
# document spent plus the reserve would pass the document's cap (max_cost_usd): spend only grows, so no wait helps.
# A page that would fit once the calls in flight settle waits (DEFER). Before the tenant's first call of the model
# that reported a cost the reserve is unknown: a capped document, or a tenant with a budget, makes one call at a time.
LOCK_SPENDERS = """
    SELECT 1 FROM documents d JOIN tenants t ON t.id = d.tenant_id WHERE d.id = %(document_id)s FOR UPDATE OF d, t
    """

ADMIT_SPEND = """
    WITH doc AS (
        SELECT d.id, d.tenant_id, d.max_cost_usd, octet_length(coalesce(d.prompt, '')) AS prompt_bytes,
               coalesce(t.daily_budget_usd, CAST(%(daily_budget)s AS numeric)) AS budget,
               coalesce((SELECT spent_usd FROM tenant_days
                         WHERE tenant_id = d.tenant_id AND day = CAST(now() AT TIME ZONE 'UTC' AS date)), 0) AS today
        FROM documents d JOIN tenants t ON t.id = d.tenant_id
        WHERE d.id = %(document_id)s
    ),
    history AS (
        SELECT a.cost, a.prompt_tokens, a.completion_tokens
        FROM attempts a JOIN documents d ON d.id = a.document_id
        WHERE a.model = %(model)s AND a.cost IS NOT NULL AND d.tenant_id = (SELECT tenant_id FROM doc)
        ORDER BY a.id DESC LIMIT 100
    ),
    price AS (
        SELECT avg(cost) AS usd,
               coalesce(min(cost / nullif(prompt_tokens, 0)) FILTER (WHERE cost > 0)
                          * (max(prompt_tokens) + (SELECT prompt_bytes FROM doc))
                        + min(cost / nullif(completion_tokens, 0)) FILTER (WHERE cost > 0) * %(max_output_tokens)s,
                        max(cost)) AS reserve
        FROM history
    ),
    spent AS (SELECT coalesce(sum(cost), 0) AS usd FROM attempts WHERE document_id = %(document_id)s),
    in_flight AS (
        SELECT j.document_id, j.reserved_usd FROM jobs j JOIN documents d ON d.id = j.document_id
        WHERE j.reserved_usd IS NOT NULL AND j.status = 'PROCESSING' AND j.lease_expires_at > now()
          AND j.id <> %(job_id)s AND d.tenant_id = (SELECT tenant_id FROM doc)
    ),
    held AS (
        SELECT coalesce(sum(reserved_usd) FILTER (WHERE document_id = %(document_id)s), 0) AS doc_usd,
               count(*) FILTER (WHERE document_id = %(document_id)s) AS doc_calls,
               coalesce(sum(reserved_usd), 0) AS tenant_usd, count(*) AS tenant_calls
        FROM in_flight
    ),
    verdict AS (
        SELECT CASE
                 WHEN doc.budget IS NOT NULL
                      AND (doc.today >= doc.budget OR doc.today + coalesce(price.reserve, 0) > doc.budget)
                   THEN 'DAILY_BUDGET'
                 WHEN doc.max_cost_usd IS NOT NULL
                      AND (spent.usd >= doc.max_cost_usd OR spent.usd + coalesce(price.reserve, 0) > doc.max_cost_usd)
                   THEN 'CAP'
                 WHEN doc.budget IS NULL AND doc.max_cost_usd IS NULL THEN 'GO'
                 WHEN price.reserve IS NULL
                      AND ((doc.budget IS NOT NULL AND held.tenant_calls > 0)
                           OR (doc.max_cost_usd IS NOT NULL AND held.doc_calls > 0))
                   THEN 'DEFER'
                 WHEN doc.today + held.tenant_usd + coalesce(price.reserve, 0) > doc.budget THEN 'DEFER'
                 WHEN spent.usd + held.doc_usd + coalesce(price.reserve, 0) > doc.max_cost_usd THEN 'DEFER'
                 ELSE 'GO'
               END AS verdict,
               doc.budget IS NOT NULL OR doc.max_cost_usd IS NOT NULL AS capped,
               price.usd AS price, price.reserve, spent.usd AS spent, doc.max_cost_usd, doc.budget, doc.today
        FROM doc, price, spent, held
    ),
    held_now AS (
        UPDATE jobs SET reserved_usd = coalesce((SELECT reserve FROM verdict), 0)
        WHERE id = %(job_id)s AND status = 'PROCESSING' AND lease_token = %(lease_token)s
          AND (SELECT verdict = 'GO' AND capped FROM verdict)
        RETURNING id
    )
    SELECT verdict, price, reserve, spent, max_cost_usd, budget, today FROM verdict
    """

# The rate governor's take, one statement: the bucket is refilled for the time since it was last touched, then a
# call may start now (wait 0), or reserves the next free slot ahead (requests goes below zero by the slots reserved)
# and waits for it off the Lambda clock, in the queue. During a 429's pause nothing is reserved: the wait is the
# pause. A page back for the slot it reserved (prepaid) takes nothing more; only a pause holds it back.
TAKE_RATE_SLOT = """
    WITH bucket AS (
        SELECT provider, model,
               least(%(burst)s, requests + extract(epoch FROM now() - refilled_at) * %(requests_per_second)s)
                   AS requests,
               least(%(token_burst)s, tokens + extract(epoch FROM now() - refilled_at) * %(tokens_per_second)s)
                   AS tokens,
               coalesce(mean_tokens, 0) AS mean_tokens,
               greatest(0, coalesce(extract(epoch FROM paused_until - now()), 0)) AS paused
        FROM rate_buckets WHERE provider = %(provider)s AND model = %(model)s
        FOR UPDATE
    ),
    decision AS (
        SELECT provider, model, requests, tokens, paused, mean_tokens,
               CASE
                 WHEN paused > 0 THEN paused
                 WHEN %(prepaid)s THEN 0
                 ELSE greatest(0, (1 - requests) / %(requests_per_second)s,
                               (least(mean_tokens, %(token_burst)s) - tokens) / nullif(%(tokens_per_second)s, 0))
               END AS wait
        FROM bucket
    ),
    reserve AS (
        SELECT *, paused = 0 AND NOT %(prepaid)s AND wait <= %(max_wait)s AS takes FROM decision
    )
    UPDATE rate_buckets b
    SET requests = r.requests - CASE WHEN r.takes THEN 1 ELSE 0 END,
        tokens = r.tokens - CASE WHEN r.takes AND %(tokens_per_second)s > 0 THEN r.mean_tokens ELSE 0 END,
        refilled_at = now()
    FROM reserve r
    WHERE b.provider = r.provider AND b.model = r.model
    RETURNING r.wait, r.takes AS reserved, r.paused > 0 AS paused, r.mean_tokens,
              now() + make_interval(secs => r.wait) AS slot_at
    """

CREATE_RATE_BUCKET = """
    INSERT INTO rate_buckets (provider, model, requests, tokens)
    VALUES (%(provider)s, %(model)s, %(burst)s, %(token_burst)s)
    ON CONFLICT (provider, model) DO NOTHING
    """

# A 429: every environment holds its calls to this model until the provider's Retry-After has passed.
PAUSE_RATE_BUCKET = """
    UPDATE rate_buckets
    SET paused_until = greatest(coalesce(paused_until, now()), now() + make_interval(secs => %(seconds)s))
    WHERE provider = %(provider)s AND model = %(model)s
    """

# A call's real tokens against the estimate it took: the bucket owes or is owed the difference, and learns the mean.
SETTLE_RATE_USAGE = """
    UPDATE rate_buckets
    SET tokens = tokens - (%(actual)s - %(estimate)s),
        mean_tokens = CASE WHEN mean_tokens IS NULL THEN %(actual)s ELSE 0.9 * mean_tokens + 0.1 * %(actual)s END
    WHERE provider = %(provider)s AND model = %(model)s
    """

# The estimate of a document before it starts: the mean cost per page of the model's latest calls.
# A tenant's own price history only: an estimate must not tell one tenant how much, or how dearly, others call.
MODEL_PRICE = """
    SELECT avg(cost) AS usd, count(*) AS calls FROM (
        SELECT a.cost FROM attempts a JOIN documents d ON d.id = a.document_id
        WHERE a.model = %(model)s AND a.cost IS NOT NULL AND d.tenant_id = %(tenant_id)s
        ORDER BY a.id DESC LIMIT 100
    ) latest
    """

SET_TENANT_BUDGET = "UPDATE tenants SET daily_budget_usd = %(usd)s WHERE id = %(tenant_id)s RETURNING id"

TENANT_DAY = """
    SELECT t.daily_budget_usd, d.spent_usd, d.calls FROM tenants t
    LEFT JOIN tenant_days d ON d.tenant_id = t.id AND d.day = CAST(now() AT TIME ZONE 'UTC' AS date)
    WHERE t.id = %(tenant_id)s
    """

GET_DOCUMENTS = """
    SELECT id, bucket, object_key, etag, version_id, size_bytes, kind, page_count, source_page_count, status, error,
           model, escalation_model, prompt, pages_completed, pages_failed, transcript_key, created_at, finished_at,
           filename, requested_pages, callback_url, callback_status, callback_error, retries, tenant_id, reuse,
           reused_from, max_cost_usd, second_read, chunks, merge_tables, furniture,
           (SELECT daily_budget_usd FROM tenants WHERE tenants.id = documents.tenant_id) AS tenant_daily_budget_usd
    FROM documents WHERE id = ANY(CAST(%(document_ids)s AS uuid[]))
    """

# A tenant's documents, newest first, a page at a time: keyset pagination on (created_at, id), which
# ix_documents_tenant (tenant_id, created_at) serves.
LIST_DOCUMENTS = """
    SELECT d.id, d.filename, d.status, d.page_count, d.pages_completed, d.pages_failed, d.model, d.created_at,
           d.finished_at,
           (SELECT count(*) FROM jobs WHERE jobs.document_id = d.id AND jobs.flags <> '[]'::jsonb) AS flagged,
           (SELECT coalesce(sum(cost), 0) FROM attempts WHERE attempts.document_id = d.id) AS cost
    FROM documents d
    WHERE d.tenant_id = %(tenant_id)s
      AND (CAST(%(before_at)s AS timestamptz) IS NULL
           OR (d.created_at, d.id) < (CAST(%(before_at)s AS timestamptz), CAST(%(before_id)s AS uuid)))
    ORDER BY d.created_at DESC, d.id DESC
    LIMIT %(limit)s
    """

# A page counts as corrected while a correction made on its latest round of answers exists (LOAD_PAGES shows it).
PAGE_SUMMARY = """
    SELECT status, count(*) AS pages, count(*) FILTER (WHERE flags <> '[]'::jsonb) AS flagged,
           count(*) FILTER (WHERE EXISTS (
               SELECT 1 FROM page_corrections c
               WHERE c.document_id = j.document_id AND c.page_number = j.page_number
                 AND c.answer_round = j.answer_round
           )) AS corrected
    FROM jobs j WHERE document_id = %(document_id)s
    GROUP BY status
    """

# What a document has cost: every call that answered, kept or not.
DOCUMENT_SPEND = """
    SELECT count(*) AS calls, coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
           coalesce(sum(completion_tokens), 0) AS completion_tokens, coalesce(sum(cost), 0) AS cost
    FROM attempts WHERE document_id = %(document_id)s
    """

# Pages with something to say: an error (a failure, or the reason of a retry) or flags.
PAGE_ISSUES = """
    SELECT page_number, status, attempts, error, flags, escalation IS NOT NULL AS escalated FROM jobs
    WHERE document_id = %(document_id)s AND (error IS NOT NULL OR flags <> '[]'::jsonb)
    ORDER BY page_number
    LIMIT %(limit)s
    """

# A finished page back in the queue as new: no answer, no flags, no lease, never sent; its attempts rows are kept. Its
# next answer is a new round: the corrections made on the earlier answers no longer hold (they stay, as history).
_QUEUED_AFRESH = (
    " status = 'QUEUED', attempts = 0, error = NULL, answer_round = answer_round + 1,"
    + ",".join(f" {column} = NULL" for column in _ANSWER_COLUMNS)
    + """, flags = '[]'::jsonb, lease_token = NULL, lease_expires_at = NULL, enqueued_at = NULL, available_at = now(),
            completed_at = NULL, updated_at = now()"""
)

# Only FAILED pages go back, with a fresh set of attempts; the document is unfinished again.
# Bounded per document: the document's row is locked first (a concurrent retry waits, then finds the count moved on
# and no FAILED page left), and the count goes up only when pages were requeued.
RETRY_FAILED_PAGES = (
    """
    WITH allowed AS (
        SELECT id FROM documents WHERE id = %(document_id)s AND retries < %(max_retries)s FOR UPDATE
    ),
    retried AS (
        UPDATE jobs
        SET"""
    + _QUEUED_AFRESH
    + """
        WHERE document_id = %(document_id)s AND status = 'FAILED' AND EXISTS (SELECT 1 FROM allowed)
        RETURNING id, page_number
    ),
    reopened AS (
        UPDATE documents
        SET pages_failed = pages_failed - (SELECT count(*) FROM retried), status = 'PROCESSING', error = NULL,
            finished_at = NULL, callback_status = NULL, retries = retries + 1, updated_at = now()
        WHERE id = %(document_id)s AND EXISTS (SELECT 1 FROM retried)
        RETURNING id
    )
    SELECT id, page_number FROM retried ORDER BY page_number
    """
)

# One finished page (COMPLETED, FAILED or SKIPPED) queued again, on the model asked for (NULL: the document's): its
# answer and flags are cleared, its attempts (and their costs) kept, and its document reopened, so that the
# transcript files are written again when the page is done. Bounded as retries are: the document's row is locked
# first and its retries counted (a re-run is one), and the page's own re-runs; a page past either limit is not queued.
RERUN_PAGE = (
    """
    WITH allowed AS (
        SELECT id FROM documents WHERE id = %(document_id)s AND retries < %(max_retries)s FOR UPDATE
    ),
    page AS (
        SELECT id, status FROM jobs
        WHERE document_id = %(document_id)s AND page_number = %(page_number)s
          AND status IN ('COMPLETED', 'FAILED', 'SKIPPED') AND reruns < %(max_page_reruns)s
          AND EXISTS (SELECT 1 FROM allowed)
        FOR UPDATE
    ),
    rerun AS (
        UPDATE jobs
        SET"""
    + _QUEUED_AFRESH
    + """, escalation = NULL, requested_model = %(model)s, reruns = reruns + 1
        FROM page WHERE jobs.id = page.id
        RETURNING jobs.id, page.status AS was
    ),
    reopened AS (
        UPDATE documents
        SET pages_completed = pages_completed - (SELECT count(*) FROM rerun WHERE was = 'COMPLETED'),
            pages_failed = pages_failed - (SELECT count(*) FROM rerun WHERE was <> 'COMPLETED'),
            status = 'PROCESSING', error = NULL, finished_at = NULL, callback_status = NULL, retries = retries + 1,
            updated_at = now()
        WHERE id = %(document_id)s AND EXISTS (SELECT 1 FROM rerun)
        RETURNING id
    )
    SELECT id FROM rerun
    """
)

# What decides whether a page may be re-run: its status, its re-runs so far, and why it failed.
PAGE_RERUN_STATE = """
    SELECT status, reruns, error FROM jobs WHERE document_id = %(document_id)s AND page_number = %(page_number)s
    """

# The image a page was sent to the model as, once it is in the bucket. Not fenced by the lease: every holder of the
# page stores the same render under the same key, and the page's result is written apart from it.
KEEP_PAGE_IMAGE = "UPDATE jobs SET image_key = %(image_key)s WHERE id = %(job_id)s"

# The figures cropped from the page's image and stored beside the transcript: their keys and boxes.
KEEP_FIGURES = "UPDATE jobs SET figures = %(figures)s WHERE id = %(job_id)s"

PAGE_IMAGE = """
    SELECT image_key, status FROM jobs WHERE document_id = %(document_id)s AND page_number = %(page_number)s
    """

PAGE_FIGURES = """
    SELECT figures FROM jobs WHERE document_id = %(document_id)s AND page_number = %(page_number)s
    """

# Each page with its current correction: the latest one made on the page's latest round of answers (the primary key
# of page_corrections serves the lookup).
LOAD_PAGES = """
    SELECT j.page_number, j.status, j.attempts, j.result_text, j.finish_reason, j.error, j.prompt_tokens,
           j.completion_tokens, j.cost, j.model, j.provider, j.provider_request_id, j.flags, j.escalation,
           j.confidence, j.grounding, j.figures, c.revision AS corrected_revision, c.markdown AS corrected_markdown,
           c.created_at AS corrected_at
    FROM jobs j
    LEFT JOIN LATERAL (
        SELECT revision, markdown, created_at FROM page_corrections
        WHERE document_id = j.document_id AND page_number = j.page_number AND answer_round = j.answer_round
        ORDER BY revision DESC
        LIMIT 1
    ) c ON true
    WHERE j.document_id = %(document_id)s
    ORDER BY j.page_number
    """

LOAD_ATTEMPTS = """
    SELECT j.page_number, a.claim, a.outcome, a.model, a.provider, a.finish_reason, a.prompt_tokens,
           a.completion_tokens, a.cost, a.latency_ms, a.provider_request_id, a.flags, a.confidence, a.status_code,
           a.error, a.second_read
    FROM attempts a JOIN jobs j ON j.id = a.job_id
    WHERE a.document_id = %(document_id)s
    ORDER BY j.page_number, a.id
    """

# A correction is saved under the document's row lock (LOCK_DOCUMENT_FOR_CORRECTION, then INSERT_CORRECTION in the
# same short transaction): saves of one document take turns, so each reads the revision the one before it wrote and
# no two get the same; a re-run (which updates the row) waits for a save or is waited for, so a save sees the
# document finished with the page's round of answers, or sees it reopened and saves nothing.
LOCK_DOCUMENT_FOR_CORRECTION = """
    SELECT status, finished_at IS NOT NULL AS finished FROM documents WHERE id = %(document_id)s FOR NO KEY UPDATE
    """

# The page's revisions so far, under the document's lock: a page past MAX_PAGE_REVISIONS takes no more (each save
# writes the whole transcript again).
PAGE_REVISIONS = """
    SELECT coalesce(max(revision), 0) AS revisions FROM page_corrections
    WHERE document_id = %(document_id)s AND page_number = %(page_number)s
    """

INSERT_CORRECTION = """
    INSERT INTO page_corrections (document_id, page_number, revision, answer_round, markdown)
    SELECT j.document_id, j.page_number,
           coalesce((SELECT max(revision) FROM page_corrections c
                     WHERE c.document_id = j.document_id AND c.page_number = j.page_number), 0) + 1,
           j.answer_round, %(markdown)s
    FROM jobs j WHERE j.document_id = %(document_id)s AND j.page_number = %(page_number)s
    RETURNING revision, markdown, created_at
    """

# What a finished document's transcript files are written from changes only with these two (TranscriptVersion).
TRANSCRIPT_VERSION = """
    SELECT finished_at, (SELECT count(*) FROM page_corrections c WHERE c.document_id = d.id) AS corrections
    FROM documents d WHERE d.id = %(document_id)s
    """

# The same, with the document's row share-locked for a transaction that reads its pages and calls: no correction,
# re-run or finish can land between the reads.
LOCK_TRANSCRIPT_VERSION = TRANSCRIPT_VERSION.rstrip() + " FOR SHARE\n"

# Only a document whose pages are all terminal, and only once.
FINISH_DOCUMENT = """
    UPDATE documents
    SET status = %(status)s, error = %(error)s, transcript_key = %(transcript_key)s,
        finished_at = now(), updated_at = now(),
        callback_status = CASE WHEN callback_url IS NOT NULL THEN 'PENDING' END,
        callback_attempts = 0, callback_next_at = now(), callback_error = NULL
    WHERE id = %(document_id)s AND finished_at IS NULL AND pages_completed + pages_failed >= page_count
    RETURNING status
    """

# A due callback, taken for a while (callback_next_at moves on) so that no one else delivers it meanwhile.
# At most %(per_tenant)s of each tenant's callbacks in one round, the longest due first: a tenant whose receivers stall
# fills no more than its share of the round, and every other tenant's due callbacks go in the same round.
TAKE_DUE_CALLBACKS = """
    WITH ranked AS (
        SELECT id, row_number() OVER (PARTITION BY tenant_id ORDER BY callback_next_at, id) AS place
        FROM documents
        WHERE callback_status = 'PENDING' AND callback_next_at <= now() AND callback_attempts < %(max_attempts)s
    ),
    due AS (
        SELECT id FROM documents
        WHERE id IN (SELECT id FROM ranked WHERE place <= %(per_tenant)s)
          AND callback_status = 'PENDING' AND callback_next_at <= now() AND callback_attempts < %(max_attempts)s
        ORDER BY callback_next_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE documents
    SET callback_attempts = callback_attempts + 1, callback_next_at = now() + interval '5 minutes'
    WHERE id IN (SELECT id FROM due)
    RETURNING id, callback_url, callback_attempts
    """

# A callback taken for a round that had no time left to start it: its attempt given back, due again at once.
RELEASE_CALLBACK = """
    UPDATE documents SET callback_attempts = callback_attempts - 1, callback_next_at = now()
    WHERE id = %(document_id)s AND callback_status = 'PENDING' AND callback_attempts > 0
    """

# A callback taken as often as it may be and never recorded since (its deliverer died mid-delivery): given up.
ABANDON_CALLBACKS = """
    UPDATE documents
    SET callback_status = 'FAILED',
        callback_error = concat_ws('; last error: ', 'no delivery recorded after '
                                   || callback_attempts || ' attempts', callback_error)
    WHERE callback_status = 'PENDING' AND callback_attempts >= %(max_attempts)s AND callback_next_at <= now()
    """

RECORD_CALLBACK = """
    UPDATE documents
    SET callback_status = %(status)s, callback_error = %(error)s,
        callback_next_at = now() + make_interval(secs => %(retry_in_seconds)s)
    WHERE id = %(document_id)s AND callback_status = 'PENDING'
    """


# --- sweeper ----------------------------------------------------------------------------------------------

# An expired lease proves its holder dead (the lease outlasts the invocation): the page goes back to QUEUED,
# unsent, so the same sweep sends it again.
REQUEUE_EXPIRED_LEASES = """
    WITH expired AS (
        SELECT id FROM jobs
        WHERE status = 'PROCESSING' AND lease_expires_at < now() AND attempts < %(max_attempts)s
        ORDER BY lease_expires_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs
    SET status = 'QUEUED', lease_token = NULL, lease_expires_at = NULL, enqueued_at = NULL, reserved_usd = NULL,
        available_at = now(), updated_at = now(),
        error = 'the lease of attempt ' || attempts || ' expired: the worker stopped before finishing'
    WHERE id IN (SELECT id FROM expired)
    RETURNING id
    """

FAIL_EXPIRED_LEASES = """
    WITH expired AS (
        SELECT id FROM jobs
        WHERE status = 'PROCESSING' AND lease_expires_at < now() AND attempts >= %(max_attempts)s
        ORDER BY lease_expires_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ),
    failed AS (
        UPDATE jobs
        SET status = 'FAILED', lease_expires_at = NULL, completed_at = now(), updated_at = now(), reserved_usd = NULL,
            error = 'attempts exhausted (' || attempts || ' of ' || CAST(%(max_attempts)s AS text)
                    || '): the lease expired; the worker stopped before finishing'
        WHERE id IN (SELECT id FROM expired)
        RETURNING document_id
    ),
    counts AS (SELECT document_id, count(*) AS n FROM failed GROUP BY document_id)
    UPDATE documents
    SET pages_failed = pages_failed + counts.n, updated_at = now()
    FROM counts
    WHERE documents.id = counts.document_id
    RETURNING documents.id, documents.page_count, documents.pages_completed, documents.pages_failed,
              counts.n AS jobs_failed
    """

# Stamping enqueued_at before the send is this sweeper's hold on sending: a concurrent sweeper skips the
# locked rows and then sees them stamped. A failed send clears the stamp again.
TAKE_UNSENT_JOBS = """
    WITH due AS (
        SELECT id FROM jobs
        WHERE status = 'QUEUED' AND available_at <= now()
          AND (enqueued_at IS NULL OR enqueued_at < now() - make_interval(secs => %(resend_after_seconds)s))
        ORDER BY created_at, page_number
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs SET enqueued_at = now(), updated_at = now()
    WHERE id IN (SELECT id FROM due)
    RETURNING id, document_id, page_number
    """

RELEASE_UNSENT_JOBS = """
    UPDATE jobs SET enqueued_at = NULL, updated_at = now()
    WHERE id = ANY(CAST(%(ids)s AS uuid[])) AND status = 'QUEUED'
    """

# Documents whose pages are all terminal but whose finishing invocation died: touched, so that a concurrent
# sweeper leaves them alone for the grace period.
TAKE_UNFINISHED_DOCUMENTS = """
    WITH stuck AS (
        SELECT id FROM documents
        WHERE finished_at IS NULL AND status = 'PROCESSING' AND pages_completed + pages_failed >= page_count
          AND updated_at < now() - make_interval(secs => %(grace_seconds)s)
        ORDER BY updated_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE documents SET updated_at = now()
    WHERE id IN (SELECT id FROM stuck)
    RETURNING id
    """

# A document created through the API whose file never came: FAILED once its upload URL has long expired (the partial
# index ix_documents_awaiting_upload serves it), its callback armed as for any finished document.
EXPIRE_AWAITING_UPLOADS = """
    WITH due AS (
        SELECT id FROM documents
        WHERE status = 'AWAITING_UPLOAD' AND created_at < now() - make_interval(secs => %(after_seconds)s)
        ORDER BY created_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE documents
    SET status = 'FAILED', error = %(error)s, finished_at = now(), updated_at = now(),
        callback_status = CASE WHEN callback_url IS NOT NULL THEN 'PENDING' END,
        callback_attempts = 0, callback_next_at = now(), callback_error = NULL
    WHERE id IN (SELECT id FROM due)
    RETURNING id
    """


# The latest finished document of the tenant with the same bytes and the same request (model, escalation model,
# prompt, pages) whose pages all completed: its answers stand in for model calls. ix_documents_reusable serves it.
FIND_REUSABLE_DOCUMENT = """
    SELECT d.id FROM documents d
    WHERE d.tenant_id = %(tenant_id)s AND d.sha256 = %(sha256)s AND d.status = 'COMPLETED'
      AND d.model = %(model)s AND d.escalation_model IS NOT DISTINCT FROM %(escalation_model)s
      AND d.prompt IS NOT DISTINCT FROM %(prompt)s AND d.page_count = cardinality(CAST(%(pages)s AS integer[]))
      AND (SELECT count(*) FROM jobs j
           WHERE j.document_id = d.id AND j.status = 'COMPLETED'
             AND j.page_number = ANY(CAST(%(pages)s AS integer[]))) = d.page_count
    ORDER BY d.finished_at DESC
    LIMIT 1
    """

# A reused document's pages: the donor's answers and flags, COMPLETED, with no attempt and nothing spent.
COPY_JOBS = """
    INSERT INTO jobs (document_id, page_number, status, result_text, finish_reason, prompt_tokens, completion_tokens,
                      cost, model, provider, flags, confidence, grounding, escalation, completed_at)
    SELECT %(document_id)s, j.page_number, 'COMPLETED', j.result_text, j.finish_reason, 0, 0, 0, j.model, j.provider,
           j.flags, j.confidence, j.grounding, j.escalation, now()
    FROM jobs j WHERE j.document_id = %(donor_id)s AND j.page_number = ANY(CAST(%(pages)s AS integer[]))
    RETURNING id, page_number
    """

MARK_REUSED = """
    UPDATE documents SET pages_completed = %(pages)s, reused_from = %(donor_id)s, updated_at = now()
    WHERE id = %(document_id)s
    """

IDEMPOTENT_ANSWER = """
    SELECT request, answer FROM idempotency_keys WHERE tenant_id = %(tenant_id)s AND key = %(key)s
    """

# The first answer stands: a concurrent request with the same key finds it and returns it instead of its own.
REMEMBER_ANSWER = """
    INSERT INTO idempotency_keys (tenant_id, key, request, document_id, answer)
    VALUES (%(tenant_id)s, %(key)s, %(request)s, %(document_id)s, %(answer)s)
    ON CONFLICT (tenant_id, key) DO NOTHING
    RETURNING key
    """


# --- tenants and their keys -------------------------------------------------------------------------------

ENSURE_TENANT = "INSERT INTO tenants (id) VALUES (%(tenant_id)s) ON CONFLICT (id) DO NOTHING"

TENANT_EXISTS = "SELECT 1 FROM tenants WHERE id = %(tenant_id)s"

INSERT_API_KEY = """
    INSERT INTO api_keys (id, tenant_id, key_hash, label) VALUES (%(id)s, %(tenant_id)s, %(key_hash)s, %(label)s)
    """

LIST_API_KEYS = """
    SELECT id, tenant_id, label, created_at, revoked_at FROM api_keys
    WHERE CAST(%(tenant_id)s AS text) IS NULL OR tenant_id = CAST(%(tenant_id)s AS text)
    ORDER BY tenant_id, created_at
    """

# By the key's id or its label (the first characters of the key, as listed), within the tenant when one is named.
REVOKE_API_KEY = """
    UPDATE api_keys SET revoked_at = now()
    WHERE (id::text = %(key)s OR label = %(key)s) AND revoked_at IS NULL
      AND (CAST(%(tenant_id)s AS text) IS NULL OR tenant_id = CAST(%(tenant_id)s AS text))
    RETURNING id, tenant_id, label
    """

# The unique index on key_hash serves it.
FIND_API_KEY = "SELECT tenant_id, revoked_at FROM api_keys WHERE key_hash = %(key_hash)s"

# Does any tenant hold a key that is not revoked? (TENANT_KEYS_ONLY=auto: then only such keys are accepted.)
ANY_TENANT_KEY = "SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL) AS found"

SET_TENANT_CALLBACK_KEY = "UPDATE tenants SET callback_secret = %(secret)s WHERE id = %(tenant_id)s RETURNING id"

GET_TENANT_CALLBACK_KEY = "SELECT callback_secret FROM tenants WHERE id = %(tenant_id)s"


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


# --- engine -----------------------------------------------------------------------------------------------


def create_database_engine(url: str, *, pool_size: int = 1) -> Engine:
    """A tiny pool suited to Lambda behind RDS Proxy: autocommit connections, no prepared statements.

    SQLAlchemy keeps the pool (and Alembic the migrations); ``Database`` runs its statements on the pooled
    psycopg connections directly. Connections are not pinged before use: a connection found dead is replaced
    and its statement run once more (see ``Database._rows``), which costs a round trip only when one died."""
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=False,
        pool_recycle=300,
        pool_timeout=30,
        isolation_level="AUTOCOMMIT",
        connect_args={"prepare_threshold": None, "connect_timeout": 10, "application_name": "pagescribe"},
    )


def _progress(row: Any | None) -> DocumentProgress | None:
    if row is None:
        return None
    return DocumentProgress(str(row.id), row.page_count, row.pages_completed, row.pages_failed)


def _claimed(rows: Sequence[Any]) -> list[ClaimedJob]:
    return [
        ClaimedJob(
            str(r.id),
            str(r.document_id),
            r.page_number,
            r.attempts,
            str(r.lease_token),
            r.escalation,
            tuple(r.flags),
            float(r.slot_in_seconds) if r.slot_in_seconds is not None else None,
            r.requested_model,
        )
        for r in rows
    ]


def fenced_write(job: ClaimedJob, outcome: PageOutcome, recorded_as: AttemptOutcome) -> dict[str, Any]:
    """The parameters of a fenced result write (COMPLETE_JOB, FAIL_JOB, ESCALATE_JOB): the lease that must still
    hold, what the model answered, and how its call is recorded."""
    return {
        "job_id": job.job_id,
        "document_id": job.document_id,
        "lease_token": job.lease_token,
        "claim": job.attempts,
        "answered": outcome.text is not None,
        "called": outcome.called,
        "outcome": recorded_as.value,
        "result_text": outcome.text,
        "finish_reason": outcome.finish_reason,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "cost": outcome.cost,
        "model": outcome.model,
        "provider": outcome.provider,
        "provider_request_id": outcome.provider_request_id,
        "latency_ms": outcome.latency_ms,
        "confidence": outcome.confidence,
        "grounding": Jsonb(outcome.grounding) if outcome.grounding is not None else None,
        "second_read": Jsonb(outcome.second_read) if outcome.second_read is not None else None,
        "flags": Jsonb(list(outcome.page_flags if outcome.page_flags is not None else outcome.flags)),
        "attempt_flags": Jsonb(list(outcome.flags)),
    }


def _document(row: Any) -> DocumentRecord:
    return DocumentRecord(
        document_id=str(row.id),
        bucket=row.bucket,
        object_key=row.object_key,
        etag=row.etag,
        version_id=row.version_id,
        size_bytes=row.size_bytes,
        kind=row.kind,
        page_count=row.page_count,
        status=DocumentStatus(row.status),
        error=row.error,
        model=row.model,
        escalation_model=row.escalation_model,
        source_page_count=row.source_page_count,
        prompt=row.prompt,
        pages_completed=row.pages_completed,
        pages_failed=row.pages_failed,
        transcript_key=row.transcript_key,
        created_at=row.created_at,
        finished_at=row.finished_at,
        filename=row.filename,
        requested_pages=tuple(row.requested_pages) if row.requested_pages is not None else None,
        callback_url=row.callback_url,
        callback_status=row.callback_status,
        callback_error=row.callback_error,
        retries=row.retries,
        tenant_id=row.tenant_id,
        reuse=row.reuse,
        reused_from=str(row.reused_from) if row.reused_from else None,
        max_cost_usd=_float(row.max_cost_usd),
        tenant_daily_budget_usd=_float(row.tenant_daily_budget_usd),
        second_read=row.second_read,
        chunks=row.chunks,
        merge_tables=row.merge_tables,
        furniture=row.furniture,
    )


def _pages(rows: Sequence[Any]) -> list[PageRecord]:
    return [
        PageRecord(
            page_number=r.page_number,
            status=JobStatus(r.status),
            attempts=r.attempts,
            text=r.result_text,
            finish_reason=r.finish_reason,
            error=r.error,
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            cost=float(r.cost) if r.cost is not None else None,
            model=r.model,
            provider=r.provider,
            provider_request_id=r.provider_request_id,
            flags=r.flags,
            escalation=r.escalation,
            confidence=r.confidence,
            correction=(
                PageCorrection(r.corrected_revision, r.corrected_markdown, r.corrected_at)
                if r.corrected_revision is not None
                else None
            ),
            grounding=r.grounding,
            figures=r.figures or (),
        )
        for r in rows
    ]


def _attempts(rows: Sequence[Any]) -> list[AttemptRecord]:
    return [
        AttemptRecord(
            page_number=r.page_number,
            claim=r.claim,
            outcome=r.outcome,
            model=r.model,
            provider=r.provider,
            finish_reason=r.finish_reason,
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            cost=float(r.cost) if r.cost is not None else None,
            latency_ms=r.latency_ms,
            provider_request_id=r.provider_request_id,
            flags=r.flags,
            confidence=r.confidence,
            status_code=r.status_code,
            error=r.error,
            second_read=r.second_read,
        )
        for r in rows
    ]


_Work = Callable[[psycopg.Connection[Any]], T]


class Database:
    """The data-access layer: each method is one statement (one round trip, autocommitted) or, for a new
    document, one short transaction.

    Statements run on the pool's psycopg connection itself: SQLAlchemy's statement layer would cost more
    client CPU than the database spends on a claim. A connection the server closed (a restart, a failover,
    RDS Proxy's idle timeout while the environment was frozen) is found on use, not by a ping before every
    call: it is dropped from the pool and the work runs once more on a fresh connection. Running it again is
    safe for every statement here: the connection died before the answer came back, so either nothing was
    done, or it was done and the repeat finds the rows already moved (a claim finds the job leased, a fenced
    write finds the lease gone, an insert finds the row) and changes nothing."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _with_connection(self, work: _Work[T]) -> T:
        # A pool of n may hold n dead connections (a restarted server killed them all): each is found and
        # dropped in turn, then a fresh one is made. Failing to connect raises at once.
        pool = self.engine.pool
        attempts = (pool.size() if isinstance(pool, QueuePool) else 1) + 1
        for attempt in range(1, attempts + 1):
            pooled = self.engine.raw_connection()
            try:
                connection = pooled.driver_connection
                assert isinstance(connection, psycopg.Connection)
                try:
                    return work(connection)
                except psycopg.OperationalError as exc:
                    if not connection.broken or attempt == attempts:
                        raise
                    pooled.invalidate(exc)
                    log.warning("database connection lost (%s); running the statement on a new connection", exc)
            finally:
                pooled.close()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _rows(self, statement: str, params: dict[str, Any]) -> list[Any]:
        """Run one statement in autocommit: its rows (none for a statement that returns none)."""

        def run(connection: psycopg.Connection[Any]) -> list[Any]:
            with connection.cursor(row_factory=namedtuple_row) as cursor:
                cursor.execute(statement, params)
                return cursor.fetchall() if cursor.description is not None else []

        return self._with_connection(run)

    def _row(self, statement: str, params: dict[str, Any]) -> Any | None:
        rows = self._rows(statement, params)
        return rows[0] if rows else None

    def create_document(
        self,
        new: NewDocument,
        *,
        kind: str | None,
        pages: Sequence[int],
        source_page_count: int | None = None,
        error: str | None = None,
        pending_id: str | None = None,
        donor_id: str | None = None,
    ) -> CreatedDocument:
        """Record a document and one QUEUED job per page in one transaction; with ``error``, a FAILED
        document and no jobs. The same object (bucket, key, etag, version) is recorded once. With
        ``pending_id``, the document the API created for this upload is the one recorded. ``source_page_count``
        is the file's own page count (``pages`` may be a selection of them). With ``donor_id`` (a finished document
        of the same bytes and request) the jobs are that document's answers, COMPLETED, and nothing is queued."""
        document_id = pending_id or str(uuid.uuid4())
        params: dict[str, Any] = {
            "id": document_id,
            "etag": new.etag,
            "version_id": new.version_id,
            "size_bytes": new.size_bytes,
            "kind": kind,
            "page_count": 0 if error else len(pages),
            "source_page_count": source_page_count,
            "status": DocumentStatus.FAILED.value if error else DocumentStatus.PROCESSING.value,
            "error": error,
            "sha256": new.sha256,
        }
        if pending_id is not None:
            statement, insert_params = ACTIVATE_DOCUMENT, params
        else:
            statement = INSERT_DOCUMENT
            insert_params = {**params, "bucket": new.bucket, "object_key": new.object_key}
            insert_params |= {
                "model": new.model,
                "escalation_model": new.escalation_model,
                "prompt": new.prompt,
                "tenant_id": new.tenant_id,
                "chunks": new.chunks,
                "merge_tables": new.merge_tables,
                "furniture": new.furniture,
            }

        def record(connection: psycopg.Connection[Any]) -> CreatedDocument:
            with connection.transaction(), connection.cursor(row_factory=namedtuple_row) as cursor:
                row = cursor.execute(statement, insert_params).fetchone()
                if row is None and pending_id is not None:
                    return CreatedDocument(document_id, (), duplicate=True)
                if row is None:
                    existing: Any = cursor.execute(
                        FIND_DOCUMENT_BY_OBJECT,
                        {
                            "bucket": new.bucket,
                            "object_key": new.object_key,
                            "etag": new.etag,
                            "version_id": new.version_id,
                        },
                    ).fetchone()
                    assert existing is not None, "ON CONFLICT skipped the insert, so the row exists"
                    return CreatedDocument(str(existing.id), (), duplicate=True)
                job_ids: tuple[str, ...] = ()
                if not error:
                    pages_params = {"document_id": document_id, "pages": list(pages), "donor_id": donor_id}
                    jobs: list[Any] = cursor.execute(COPY_JOBS if donor_id else INSERT_JOBS, pages_params).fetchall()
                    job_ids = tuple(str(j.id) for j in sorted(jobs, key=lambda j: j.page_number))
                    if donor_id:
                        cursor.execute(
                            MARK_REUSED, {"document_id": document_id, "donor_id": donor_id, "pages": len(jobs)}
                        )
            return CreatedDocument(document_id, job_ids, duplicate=False, reused=donor_id is not None and not error)

        return self._with_connection(record)

    def create_pending_document(self, pending: PendingDocument) -> None:
        self._rows(
            INSERT_PENDING_DOCUMENT,
            {
                "id": pending.document_id,
                "bucket": pending.bucket,
                "object_key": pending.object_key,
                "model": pending.model,
                "escalation_model": pending.escalation_model,
                "prompt": pending.prompt,
                "filename": pending.filename,
                "requested_pages": list(pending.requested_pages) if pending.requested_pages else None,
                "callback_url": pending.callback_url,
                "tenant_id": pending.tenant_id,
                "reuse": pending.reuse,
                "max_cost_usd": pending.max_cost_usd,
                "second_read": pending.second_read,
                "chunks": pending.chunks,
                "merge_tables": pending.merge_tables,
                "furniture": pending.furniture,
            },
        )

    def page_summary(self, document_id: str) -> list[PageSummary]:
        rows = self._rows(PAGE_SUMMARY, {"document_id": document_id})
        return [PageSummary(JobStatus(r.status), r.pages, r.flagged, r.corrected) for r in rows]

    def spend(self, document_id: str) -> Spend:
        row = self._row(DOCUMENT_SPEND, {"document_id": document_id})
        assert row is not None, "an aggregate always returns a row"
        return Spend(row.calls, row.prompt_tokens, row.completion_tokens, float(row.cost))

    def page_issues(self, document_id: str, *, limit: int = 1000) -> list[PageIssue]:
        rows = self._rows(PAGE_ISSUES, {"document_id": document_id, "limit": limit})
        return [PageIssue(r.page_number, JobStatus(r.status), r.attempts, r.error, r.flags, r.escalated) for r in rows]

    def retry_failed_pages(self, document_id: str, *, max_retries: int) -> list[tuple[str, int]]:
        """Requeue the FAILED pages of a document retried fewer than ``max_retries`` times: (job id, page) of each, to
        be sent after this commit; none when it has none or has used its retries."""
        rows = self._rows(RETRY_FAILED_PAGES, {"document_id": document_id, "max_retries": max_retries})
        return [(str(r.id), r.page_number) for r in rows]

    def take_due_callbacks(self, *, limit: int, max_attempts: int, per_tenant: int) -> list[DueCallback]:
        """Take the callbacks due and tried fewer than ``max_attempts`` times, at most ``per_tenant`` of each
        tenant's."""
        params = {"limit": limit, "max_attempts": max_attempts, "per_tenant": per_tenant}
        rows = self._rows(TAKE_DUE_CALLBACKS, params)
        return [DueCallback(str(r.id), r.callback_url, r.callback_attempts) for r in rows]

    def release_callback(self, document_id: str) -> None:
        """Give back a callback taken for a round that could not start it: due again, its attempt not counted."""
        self._rows(RELEASE_CALLBACK, {"document_id": document_id})

    def abandon_callbacks(self, *, max_attempts: int) -> None:
        """End as FAILED the callbacks taken ``max_attempts`` times whose last delivery ran out unrecorded."""
        self._rows(ABANDON_CALLBACKS, {"max_attempts": max_attempts})

    def record_callback(self, document_id: str, *, status: str, error: str | None, retry_in_seconds: float = 0) -> None:
        self._rows(
            RECORD_CALLBACK,
            {"document_id": document_id, "status": status, "error": error, "retry_in_seconds": retry_in_seconds},
        )

    def find_document(self, new: NewDocument) -> str | None:
        """The id of the document already recorded for this exact object, if any."""
        row = self._row(
            FIND_DOCUMENT_BY_OBJECT,
            {"bucket": new.bucket, "object_key": new.object_key, "etag": new.etag, "version_id": new.version_id},
        )
        return str(row.id) if row is not None else None

    def mark_enqueued(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._rows(MARK_ENQUEUED, {"ids": list(job_ids)})

    def claim_job(self, job_id: str, *, lease_seconds: float, max_attempts: int) -> ClaimedJob | None:
        """Move this job QUEUED → PROCESSING (or take over an expired lease) and commit; None when it is
        already claimed, finished, out of attempts or unknown (or its row stayed held: see ``claim_jobs``)."""
        claims = self.claim_jobs([job_id], lease_seconds=lease_seconds, max_attempts=max_attempts)
        return claims.claimed.get(job_id)

    def claim_jobs(self, job_ids: Sequence[str], *, lease_seconds: float, max_attempts: int) -> Claims:
        """Claim the claimable ones of these jobs (an SQS batch's) in one statement. A job already claimed, finished,
        out of attempts or unknown is not claimed; a job named twice is claimed once. A job whose row another
        transaction held is claimed once more, waiting for its row (CLAIM_JOB_WAITING); one still held after that
        wait is ``busy``: neither claimed nor a duplicate."""
        unique = list(dict.fromkeys(job_ids))
        if not unique:
            return Claims({}, frozenset())
        lease_token = str(uuid.uuid4())
        params = {"lease_token": lease_token, "lease_seconds": lease_seconds, "max_attempts": max_attempts}
        rows = self._rows(CLAIM_JOBS_BY_ID, {**params, "job_ids": unique, "limit": len(unique)})
        claimed = {job.job_id: job for job in _claimed(rows)}
        busy: set[str] = set()
        for job_id in unique:
            if job_id not in claimed:
                waited = self._claim_waiting({**params, "job_id": job_id})
                if waited is None:
                    busy.add(job_id)
                claimed.update((job.job_id, job) for job in _claimed(waited or []))
        return Claims(claimed, frozenset(busy))

    def _claim_waiting(self, params: dict[str, Any]) -> list[Any] | None:
        """CLAIM_JOB_WAITING in a transaction of its own: the claimed row, none, or None when the row stayed held."""

        def claim(connection: psycopg.Connection[Any]) -> list[Any] | None:
            try:
                with connection.transaction(), connection.cursor(row_factory=namedtuple_row) as cursor:
                    cursor.execute(SET_CLAIM_LOCK_WAIT, {"lock_wait": f"{CLAIM_LOCK_WAIT_MS}ms"})
                    cursor.execute(CLAIM_JOB_WAITING, params)
                    return cursor.fetchall()
            except psycopg.errors.LockNotAvailable:
                return None

        return self._with_connection(claim)

    def claim_next_queued_jobs(self, *, limit: int, lease_seconds: float, max_attempts: int) -> list[ClaimedJob]:
        """Claim up to ``limit`` of the oldest due QUEUED jobs (they share one lease token)."""
        rows = self._rows(
            CLAIM_NEXT_QUEUED_JOBS,
            {
                "limit": limit,
                "lease_token": str(uuid.uuid4()),
                "lease_seconds": lease_seconds,
                "max_attempts": max_attempts,
            },
        )
        return sorted(_claimed(rows), key=lambda job: job.page_number)

    def complete_job(self, job: ClaimedJob, outcome: PageOutcome) -> DocumentProgress | None:
        """Store a page's transcription if this worker still holds the lease; None when the lease was lost. The call
        that produced it is recorded either way."""
        return _progress(self._row(COMPLETE_JOB, fenced_write(job, outcome, AttemptOutcome.KEPT)))

    def fail_job(self, job: ClaimedJob, error: str, outcome: PageOutcome = NO_OUTCOME) -> DocumentProgress | None:
        """Mark a page FAILED with its reason (keeping any text) if this worker holds the lease; the call that
        produced ``outcome`` is recorded either way."""
        params = {**fenced_write(job, outcome, AttemptOutcome.REJECTED), "error": error}
        return _progress(self._row(FAIL_JOB, params))

    def escalate_job(self, job: ClaimedJob, outcome: PageOutcome) -> bool:
        """Record a page's one escalation, keeping the hard-flagged answer it escalates from; False when the lease was
        lost (or the page had escalated already). The call that produced ``outcome`` is recorded either way."""
        return self._row(ESCALATE_JOB, fenced_write(job, outcome, AttemptOutcome.ESCALATED)) is not None

    def requeue_job(self, job: ClaimedJob, error: str, *, delay_seconds: float) -> bool:
        """Put a page back to QUEUED, due after ``delay_seconds``; False when the lease was lost."""
        row = self._row(
            REQUEUE_JOB,
            {"job_id": job.job_id, "lease_token": job.lease_token, "error": error, "delay_seconds": delay_seconds},
        )
        return row is not None

    def defer_job(
        self, job: ClaimedJob, reason: str, *, delay_seconds: float, slot_at: datetime | None, keep_slot: bool
    ) -> bool:
        """Put a page held back before its call back to QUEUED, due after ``delay_seconds``, giving back its attempt,
        with the governor slot it reserved (``slot_at``; or the one it had, ``keep_slot``); False when the lease was
        lost."""
        row = self._row(
            DEFER_JOB,
            {
                "job_id": job.job_id,
                "lease_token": job.lease_token,
                "error": reason,
                "delay_seconds": delay_seconds,
                "slot_at": slot_at,
                "keep_slot": keep_slot,
            },
        )
        return row is not None

    def skip_job(self, job: ClaimedJob, reason: str) -> DocumentProgress | None:
        """End a page SKIPPED (not started: a cost cap or a daily budget) if this worker holds the lease."""
        return _progress(self._row(SKIP_JOB, {"job_id": job.job_id, "lease_token": job.lease_token, "error": reason}))

    def list_documents(
        self, tenant_id: str, *, limit: int, before: tuple[datetime, str] | None = None
    ) -> list[DocumentListing]:
        """The tenant's documents, newest first, up to ``limit``, after ``before`` (created_at, id) if given."""
        before_at, before_id = before if before is not None else (None, None)
        rows = self._rows(
            LIST_DOCUMENTS, {"tenant_id": tenant_id, "limit": limit, "before_at": before_at, "before_id": before_id}
        )
        return [
            DocumentListing(
                document_id=str(row.id),
                filename=row.filename,
                status=DocumentStatus(row.status),
                page_count=row.page_count,
                pages_completed=row.pages_completed,
                pages_failed=row.pages_failed,
                flagged=row.flagged,
                cost=float(row.cost),
                model=row.model,
                created_at=row.created_at,
                finished_at=row.finished_at,
            )
            for row in rows
        ]

    def rerun_page(
        self, document_id: str, page_number: int, *, model: str | None, max_retries: int, max_page_reruns: int
    ) -> str | None:
        """Queue a finished page again (on ``model``, or the document's), reopening its document and counting one of
        its retries and one of the page's re-runs; its job id, to be sent after this commit, or None when the page
        is not finished (or does not exist), or the document or the page has used its limit."""
        params = {
            "document_id": document_id,
            "page_number": page_number,
            "model": model,
            "max_retries": max_retries,
            "max_page_reruns": max_page_reruns,
        }
        row = self._row(RERUN_PAGE, params)
        return str(row.id) if row is not None else None

    def page_rerun_state(self, document_id: str, page_number: int) -> PageRerunState | None:
        """The page's status, re-runs so far and error; None for no such page."""
        row = self._row(PAGE_RERUN_STATE, {"document_id": document_id, "page_number": page_number})
        return PageRerunState(JobStatus(row.status), row.reruns, row.error) if row is not None else None

    def keep_page_image(self, job: ClaimedJob, image_key: str) -> None:
        self._rows(KEEP_PAGE_IMAGE, {"job_id": job.job_id, "image_key": image_key})

    def keep_figures(self, job: ClaimedJob, figures: list[dict[str, Any]]) -> None:
        self._rows(KEEP_FIGURES, {"job_id": job.job_id, "figures": Jsonb(figures)})

    def page_figures(self, document_id: str, page_number: int) -> list[dict[str, Any]] | None:
        """The figures kept from the page (key, bbox), in order; None for no such page."""
        row = self._row(PAGE_FIGURES, {"document_id": document_id, "page_number": page_number})
        return list(row.figures or ()) if row is not None else None

    def page_image(self, document_id: str, page_number: int) -> PageImageRecord | None:
        """The page's status and the key of its kept image (None when none was kept); None for no such page."""
        row = self._row(PAGE_IMAGE, {"document_id": document_id, "page_number": page_number})
        return PageImageRecord(row.image_key, JobStatus(row.status)) if row is not None else None

    def record_failed_call(self, job: ClaimedJob, failed: FailedCall) -> None:
        """Record a model call that failed (no answer came back), whatever became of the page."""
        self._rows(
            RECORD_FAILED_CALL,
            {
                "job_id": job.job_id,
                "document_id": job.document_id,
                "claim": job.attempts,
                "outcome": "RATE_LIMITED" if failed.status_code == 429 else "ERROR",
                "model": failed.model,
                "provider": failed.provider,
                "latency_ms": failed.latency_ms,
                "status_code": failed.status_code,
                "error": failed.error[:1000],
            },
        )

    def admit_spend(
        self, job: ClaimedJob, model: str, *, daily_budget_usd: float | None, max_output_tokens: int
    ) -> SpendVerdict:
        """The cost gate before a model call (see ADMIT_SPEND): GO, DEFER, CAP or DAILY_BUDGET, with the figures.
        One short transaction of two statements; no lock outlives it."""
        params = {
            "document_id": job.document_id,
            "job_id": job.job_id,
            "lease_token": job.lease_token,
            "model": model,
            "daily_budget": daily_budget_usd,
            "max_output_tokens": max_output_tokens,
        }

        def gate(connection: psycopg.Connection[Any]) -> Any:
            with connection.transaction(), connection.cursor(row_factory=namedtuple_row) as cursor:
                cursor.execute(LOCK_SPENDERS, params)
                cursor.execute(ADMIT_SPEND, params)
                return cursor.fetchone()

        row = self._with_connection(gate)
        if row is None:  # the document is gone (deleted by hand): nothing to hold the call against
            return SpendVerdict("GO", None, None, 0.0, None, None, 0.0)
        return SpendVerdict(
            row.verdict,
            _float(row.price),
            _float(row.reserve),
            float(row.spent),
            _float(row.max_cost_usd),
            _float(row.budget),
            float(row.today),
        )

    def take_rate_slot(self, bucket: RateBucket, model: str, *, prepaid: bool, max_wait: float) -> RateGrant:
        """The governor's take for one call of ``model`` (see TAKE_RATE_SLOT); the bucket is made on first use."""
        params = {**bucket.params(model), "prepaid": prepaid, "max_wait": max_wait}
        row = self._row(TAKE_RATE_SLOT, params)
        if row is None:
            self._rows(CREATE_RATE_BUCKET, params)
            row = self._row(TAKE_RATE_SLOT, params)
            assert row is not None, "the bucket was just made"
        return RateGrant(float(row.wait), row.reserved, row.paused, float(row.mean_tokens), row.slot_at)

    def pause_rate_bucket(self, bucket: RateBucket, model: str, seconds: float) -> None:
        """Hold every environment's calls to ``model`` for ``seconds`` (a 429's Retry-After)."""
        self._rows(PAUSE_RATE_BUCKET, {**bucket.params(model), "seconds": seconds})

    def settle_rate_tokens(self, bucket: RateBucket, model: str, *, estimate: float, actual: int) -> None:
        self._rows(SETTLE_RATE_USAGE, {**bucket.params(model), "estimate": estimate, "actual": actual})

    def model_price(self, model: str, tenant_id: str) -> tuple[float | None, int]:
        """The mean cost per call of the model's latest (up to 100) calls for the tenant's documents that reported
        one, and how many."""
        row = self._row(MODEL_PRICE, {"model": model, "tenant_id": tenant_id})
        return (_float(row.usd), int(row.calls)) if row is not None else (None, 0)

    def set_daily_budget(self, tenant_id: str, usd: float | None) -> bool:
        return self._row(SET_TENANT_BUDGET, {"tenant_id": tenant_id, "usd": usd}) is not None

    def tenant_day(self, tenant_id: str) -> TenantDay | None:
        """A tenant's daily budget and what it spent today (UTC); None for an unknown tenant."""
        row = self._row(TENANT_DAY, {"tenant_id": tenant_id})
        if row is None:
            return None
        return TenantDay(_float(row.daily_budget_usd), float(row.spent_usd or 0), int(row.calls or 0))

    def requeue_expired_leases(self, *, max_attempts: int, limit: int) -> int:
        return len(self._rows(REQUEUE_EXPIRED_LEASES, {"max_attempts": max_attempts, "limit": limit}))

    def fail_expired_leases(self, *, max_attempts: int, limit: int) -> tuple[int, list[DocumentProgress]]:
        """FAIL the expired leases that used their last attempt: (jobs failed, progress of their documents)."""
        rows = self._rows(FAIL_EXPIRED_LEASES, {"max_attempts": max_attempts, "limit": limit})
        progress = [DocumentProgress(str(r.id), r.page_count, r.pages_completed, r.pages_failed) for r in rows]
        return sum(r.jobs_failed for r in rows), progress

    def take_unsent_jobs(self, *, resend_after_seconds: float, limit: int) -> list[tuple[str, str, int]]:
        """(job id, document id, page) of due QUEUED jobs never sent, or sent long ago; stamped as sent."""
        rows = self._rows(TAKE_UNSENT_JOBS, {"resend_after_seconds": resend_after_seconds, "limit": limit})
        return [(str(r.id), str(r.document_id), r.page_number) for r in rows]

    def release_unsent_jobs(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._rows(RELEASE_UNSENT_JOBS, {"ids": list(job_ids)})

    def find_reusable_document(self, new: NewDocument, pages: Sequence[int]) -> str | None:
        """The tenant's latest finished document of the same bytes, model, escalation model, prompt and pages."""
        row = self._row(
            FIND_REUSABLE_DOCUMENT,
            {
                "tenant_id": new.tenant_id,
                "sha256": new.sha256,
                "model": new.model,
                "escalation_model": new.escalation_model,
                "prompt": new.prompt,
                "pages": list(pages),
            },
        )
        return None if row is None else str(row.id)

    def idempotent_answer(self, tenant_id: str, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """The request digest and the answer first given for this Idempotency-Key of the tenant, if any."""
        row = self._row(IDEMPOTENT_ANSWER, {"tenant_id": tenant_id, "key": key})
        return None if row is None else (bytes(row.request), dict(row.answer))

    def remember_answer(
        self, tenant_id: str, key: str, request: bytes, document_id: str, answer: dict[str, Any]
    ) -> bool:
        """Keep the first answer for the key; False when another request with it was first."""
        params = {
            "tenant_id": tenant_id,
            "key": key,
            "request": request,
            "document_id": document_id,
            "answer": Jsonb(answer),
        }
        return self._row(REMEMBER_ANSWER, params) is not None

    def ensure_tenant(self, tenant_id: str) -> None:
        self._rows(ENSURE_TENANT, {"tenant_id": tenant_id})

    def tenant_exists(self, tenant_id: str) -> bool:
        return self._row(TENANT_EXISTS, {"tenant_id": tenant_id}) is not None

    def add_api_key(self, tenant_id: str, key_hash: bytes, label: str) -> str:
        """Record a key (its hash only) for the tenant, creating the tenant; the key's id."""
        key_id = str(uuid.uuid4())

        def record(connection: psycopg.Connection[Any]) -> None:
            with connection.transaction():
                connection.execute(ENSURE_TENANT, {"tenant_id": tenant_id})
                connection.execute(
                    INSERT_API_KEY, {"id": key_id, "tenant_id": tenant_id, "key_hash": key_hash, "label": label}
                )

        self._with_connection(record)
        return key_id

    def list_api_keys(self, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        return [
            ApiKeyRecord(str(r.id), r.tenant_id, r.label, r.created_at, r.revoked_at)
            for r in self._rows(LIST_API_KEYS, {"tenant_id": tenant_id})
        ]

    def revoke_api_key(self, key: str, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        """Revoke the live keys whose id or label is ``key``; the keys revoked."""
        rows = self._rows(REVOKE_API_KEY, {"key": key, "tenant_id": tenant_id})
        return [ApiKeyRecord(str(r.id), r.tenant_id, r.label, None, None) for r in rows]

    def find_api_key(self, key_hash: bytes) -> tuple[str, bool] | None:
        """The tenant of the key with this hash and whether it was revoked; None for an unknown key."""
        row = self._row(FIND_API_KEY, {"key_hash": key_hash})
        return None if row is None else (row.tenant_id, row.revoked_at is not None)

    def any_tenant_key(self) -> bool:
        """Whether any tenant holds a key that is not revoked."""
        row = self._row(ANY_TENANT_KEY, {})
        return bool(row is not None and row.found)

    def set_callback_secret(self, tenant_id: str, secret: str) -> bool:
        return self._row(SET_TENANT_CALLBACK_KEY, {"tenant_id": tenant_id, "secret": secret}) is not None

    def callback_secret(self, tenant_id: str) -> str | None:
        row = self._row(GET_TENANT_CALLBACK_KEY, {"tenant_id": tenant_id})
        return None if row is None else row.callback_secret

    def expire_awaiting_uploads(self, *, after_seconds: float, error: str, limit: int) -> list[str]:
        """End as FAILED with ``error`` the documents still awaiting their upload ``after_seconds`` after creation."""
        rows = self._rows(EXPIRE_AWAITING_UPLOADS, {"after_seconds": after_seconds, "error": error, "limit": limit})
        return [str(r.id) for r in rows]

    def take_unfinished_documents(self, *, grace_seconds: float, limit: int) -> list[str]:
        rows = self._rows(TAKE_UNFINISHED_DOCUMENTS, {"grace_seconds": grace_seconds, "limit": limit})
        return [str(r.id) for r in rows]

    def get_document(self, document_id: str) -> DocumentRecord | None:
        row = self._row(GET_DOCUMENTS, {"document_ids": [document_id]})
        return _document(row) if row is not None else None

    def get_documents(self, document_ids: Sequence[str]) -> dict[str, DocumentRecord]:
        """The records of these documents, in one statement: {document id: record}; unknown ids are absent."""
        unique = list(dict.fromkeys(document_ids))
        if not unique:
            return {}
        return {str(row.id): _document(row) for row in self._rows(GET_DOCUMENTS, {"document_ids": unique})}

    def load_pages(self, document_id: str) -> list[PageRecord]:
        """The document's pages in order, each with its current correction, if any."""
        return _pages(self._rows(LOAD_PAGES, {"document_id": document_id}))

    def load_attempts(self, document_id: str) -> list[AttemptRecord]:
        """Every call of the document, answered or failed, by page and in the order they were made."""
        return _attempts(self._rows(LOAD_ATTEMPTS, {"document_id": document_id}))

    def save_correction(
        self, document_id: str, page_number: int, markdown: str, *, max_revisions: int
    ) -> CorrectionSave:
        """Save a person's text for a page of a finished document as the page's next revision, unless it has
        ``max_revisions`` already; the model's answer and the page's attempts are left as they are."""

        def save(connection: psycopg.Connection[Any]) -> CorrectionSave:
            with connection.transaction(), connection.cursor(row_factory=namedtuple_row) as cursor:
                document: Any = cursor.execute(LOCK_DOCUMENT_FOR_CORRECTION, {"document_id": document_id}).fetchone()
                if document is None:
                    return CorrectionSave(None, None)
                status = DocumentStatus(document.status)
                if not document.finished:
                    return CorrectionSave(status, None)
                params = {"document_id": document_id, "page_number": page_number, "markdown": markdown}
                so_far: Any = cursor.execute(PAGE_REVISIONS, params).fetchone()
                if so_far.revisions >= max_revisions:
                    return CorrectionSave(status, None, int(so_far.revisions))
                row: Any = cursor.execute(INSERT_CORRECTION, params).fetchone()
            saved = PageCorrection(row.revision, row.markdown, row.created_at) if row is not None else None
            return CorrectionSave(status, saved)

        return self._with_connection(save)

    def transcript_version(self, document_id: str) -> TranscriptVersion | None:
        row = self._row(TRANSCRIPT_VERSION, {"document_id": document_id})
        return TranscriptVersion(row.finished_at, row.corrections) if row is not None else None

    def transcript_state(self, document_id: str) -> TranscriptState | None:
        """The finished document, its pages and its calls, read in one short transaction under a share lock of the
        document's row (so at one moment); None when it is not finished (or does not exist)."""

        def read(connection: psycopg.Connection[Any]) -> TranscriptState | None:
            params = {"document_id": document_id}
            with connection.transaction(), connection.cursor(row_factory=namedtuple_row) as cursor:
                version: Any = cursor.execute(LOCK_TRANSCRIPT_VERSION, params).fetchone()
                if version is None or version.finished_at is None:
                    return None
                document = _document(cursor.execute(GET_DOCUMENTS, {"document_ids": [document_id]}).fetchone())
                pages = _pages(cursor.execute(LOAD_PAGES, params).fetchall())
                attempts = _attempts(cursor.execute(LOAD_ATTEMPTS, params).fetchall())
            return TranscriptState(
                document, pages, attempts, TranscriptVersion(version.finished_at, version.corrections)
            )

        return self._with_connection(read)

    def finish_document(
        self, document_id: str, *, status: DocumentStatus, error: str | None, transcript_key: str
    ) -> bool:
        """Mark a document whose pages are all terminal as finished; False if it was already finished."""
        row = self._row(
            FINISH_DOCUMENT,
            {"document_id": document_id, "status": status.value, "error": error, "transcript_key": transcript_key},
        )
        return row is not None
