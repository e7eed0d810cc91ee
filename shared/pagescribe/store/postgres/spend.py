"""Spend and rate buckets: what may be spent on a call, and when it may start."""

from __future__ import annotations

from collections.abc import Sequence

from pagescribe.domain import (
    ClaimedJob,
    PricedCall,
    RateBucket,
    RateGrant,
    SpendVerdict,
    TenantDay,
    document_of,
)
from pagescribe.store.postgres.connection import Connected
from pagescribe.store.postgres.rows import (
    float_or_none,
)


class PgSpend(Connected):
    """Money and rate: the cost gate before a call (a document's cap, a tenant's daily budget), the price estimate,
    and the rate governor's buckets shared by every environment."""

    # The gate before a model call: LOCK_SPENDERS, then ADMIT_SPEND, in one short transaction. The document's and
    # the tenant's rows are locked first, so calls of one tenant pass the gate one at a time, and ADMIT_SPEND, a
    # statement of its own, reads what the gates before it committed (in one statement, the reads of the other
    # tables would keep the snapshot taken before the lock was granted, and miss the price a concurrent gate had
    # just held). The transaction is one round trip all the same (``_in_one_transaction``: BEGIN, the statements
    # and COMMIT sent as one query string, each statement with its own snapshot), not four.
    #
    # Pages of one document that reach the gate together pass it at once (``admit_spends``; a page alone is a list of
    # one): the rows are locked, the price read and the calls in flight summed once for them, and the n-th page is
    # held behind the n - 1 pages before it, at the same reserve, as a gate of its own just after theirs would hold
    # it (the pages' earlier reserves, from a claim before, count no more). Its CAP and DAILY_BUDGET do not depend on
    # n; its DEFER grows with n, so the pages that go are the first ones. The locks are taken and the commit flushed
    # once for the pages, not once a page.
    #
    # A call is held at its worst case (reserve), priced on the tenant's own latest calls of the model, never on
    # other tenants': each call's cost is at least its prompt tokens times the price of a prompt token, and at least
    # its completion tokens times the price of a completion token, so the least cost per prompt token and the least
    # cost per completion token seen are upper bounds of those prices. The worst case is the largest prompt seen
    # (plus the document's own prompt text, never more tokens than bytes) at the one, and the output limit
    # (MAX_OUTPUT_TOKENS) at the other; where the calls reported no tokens, the dearest call seen. While a call runs
    # its reserve is held on its page (reserved_usd) and it is settled by the real cost when the call is recorded
    # with the page's end.
    #
    # A page ends SKIPPED when what its tenant spent today plus the reserve would pass the daily budget, or what its
    # document spent plus the reserve would pass the document's cap (max_cost_usd): spend only grows, so no wait
    # helps. A page that would fit once the calls in flight settle waits (DEFER). Before the tenant's first call of
    # the model that reported a cost the reserve is unknown: a capped document, or a tenant with a budget, makes one
    # call at a time.
    #
    # The locked section reads in O(1): the document's spend is its running total (document_counts, summed over its
    # shards, moved by each call's write), not a sum over its calls. The lock is NO KEY UPDATE: it excludes the other
    # gates as FOR UPDATE did, but not the key-share locks a page's write takes on the document's row (the attempts'
    # and the counts' foreign keys), so a page's end never waits for a gate of its document.
    LOCK_SPENDERS = """
    SELECT 1 FROM documents d JOIN tenants t ON t.id = d.tenant_id WHERE d.id = %(document_id)s
    FOR NO KEY UPDATE OF d, t
    """

    ADMIT_SPEND = """
    WITH doc AS (
        SELECT d.id, d.tenant_id, d.max_cost_usd, octet_length(coalesce(d.prompt, '')) AS prompt_bytes,
               coalesce(t.daily_budget_usd, CAST(%(daily_budget)s AS numeric)) AS budget,
               coalesce((SELECT sum(spent_usd) FROM tenant_days
                         WHERE tenant_id = d.tenant_id AND day = CAST(now() AT TIME ZONE 'UTC' AS date)), 0) AS today
        FROM documents d JOIN tenants t ON t.id = d.tenant_id
        WHERE d.id = %(document_id)s
    ),
    history AS (
        SELECT cost, prompt_tokens, completion_tokens FROM attempts
        WHERE tenant_id = (SELECT tenant_id FROM doc) AND model = %(model)s AND cost IS NOT NULL
          AND NOT cost_estimated
        ORDER BY id DESC LIMIT 100
    ),
    price AS (
        SELECT avg(cost) AS usd,
               coalesce(min(cost / nullif(prompt_tokens, 0)) FILTER (WHERE cost > 0)
                          * (max(prompt_tokens) + (SELECT prompt_bytes FROM doc))
                        + min(cost / nullif(completion_tokens, 0)) FILTER (WHERE cost > 0) * %(max_output_tokens)s,
                        max(cost)) AS reserve
        FROM history
    ),
    spent AS (SELECT coalesce(sum(spent_usd), 0) AS usd FROM document_counts WHERE document_id = %(document_id)s),
    asked AS (
        SELECT job_id, lease_token, n
        FROM unnest(CAST(%(job_ids)s AS uuid[]), CAST(%(lease_tokens)s AS uuid[]))
             WITH ORDINALITY AS a (job_id, lease_token, n)
    ),
    in_flight AS (
        SELECT j.document_id, j.reserved_usd FROM jobs j JOIN documents d ON d.id = j.document_id
        WHERE j.reserved_usd IS NOT NULL AND j.status = 'PROCESSING' AND j.lease_expires_at > now()
          AND j.id <> ALL(CAST(%(job_ids)s AS uuid[])) AND d.tenant_id = (SELECT tenant_id FROM doc)
    ),
    held AS (
        SELECT coalesce(sum(reserved_usd) FILTER (WHERE document_id = %(document_id)s), 0) AS doc_usd,
               count(*) FILTER (WHERE document_id = %(document_id)s) AS doc_calls,
               coalesce(sum(reserved_usd), 0) AS tenant_usd, count(*) AS tenant_calls
        FROM in_flight
    ),
    verdict AS (
        SELECT asked.job_id, asked.lease_token, asked.n, CASE
                 WHEN doc.budget IS NOT NULL
                      AND (doc.today >= doc.budget OR doc.today + coalesce(price.reserve, 0) > doc.budget)
                   THEN 'DAILY_BUDGET'
                 WHEN doc.max_cost_usd IS NOT NULL
                      AND (spent.usd >= doc.max_cost_usd OR spent.usd + coalesce(price.reserve, 0) > doc.max_cost_usd)
                   THEN 'CAP'
                 WHEN doc.budget IS NULL AND doc.max_cost_usd IS NULL THEN 'GO'
                 WHEN price.reserve IS NULL
                      AND ((doc.budget IS NOT NULL AND held.tenant_calls + asked.n > 1)
                           OR (doc.max_cost_usd IS NOT NULL AND held.doc_calls + asked.n > 1))
                   THEN 'DEFER'
                 WHEN doc.today + held.tenant_usd + asked.n * coalesce(price.reserve, 0) > doc.budget THEN 'DEFER'
                 WHEN spent.usd + held.doc_usd + asked.n * coalesce(price.reserve, 0) > doc.max_cost_usd
                   THEN 'DEFER'
                 ELSE 'GO'
               END AS verdict,
               doc.budget IS NOT NULL OR doc.max_cost_usd IS NOT NULL AS capped,
               price.usd AS price, price.reserve, spent.usd AS spent, doc.max_cost_usd, doc.budget, doc.today
        FROM asked, doc, price, spent, held
    ),
    held_now AS (
        UPDATE jobs j SET reserved_usd = coalesce(v.reserve, 0)
        FROM verdict v
        WHERE j.id = v.job_id AND j.status = 'PROCESSING' AND j.lease_token = v.lease_token
          AND v.verdict = 'GO' AND v.capped
        RETURNING j.id
    )
    SELECT job_id, verdict, price, reserve, spent, max_cost_usd, budget, today FROM verdict ORDER BY n
    """

    def admit_spends(
        self, jobs: Sequence[ClaimedJob], model: str, *, daily_budget_usd: float | None, max_output_tokens: int
    ) -> list[SpendVerdict]:
        params = {
            "document_id": document_of(jobs),
            "job_ids": [job.job_id for job in jobs],
            "lease_tokens": [job.lease_token for job in jobs],
            "model": model,
            "daily_budget": daily_budget_usd,
            "max_output_tokens": max_output_tokens,
        }
        rows = self._in_one_transaction((self.LOCK_SPENDERS, self.ADMIT_SPEND), params)
        if not rows:  # the document is gone (deleted by hand): nothing to hold the calls against
            return [SpendVerdict("GO", None, None, 0.0, None, None, 0.0) for _ in jobs]
        return [
            SpendVerdict(
                row.verdict,
                float_or_none(row.price),
                float_or_none(row.reserve),
                float(row.spent),
                float_or_none(row.max_cost_usd),
                float_or_none(row.budget),
                float(row.today),
            )
            for row in rows
        ]

    # The estimate of a document before it starts: the mean cost per page of the model's latest calls.
    # A tenant's own price history only: an estimate must not tell one tenant how much, or how dearly, others call.
    MODEL_PRICE = """
    SELECT avg(cost) AS usd, count(*) AS calls FROM (
        SELECT cost FROM attempts
        WHERE tenant_id = %(tenant_id)s AND model = %(model)s AND cost IS NOT NULL AND NOT cost_estimated
        ORDER BY id DESC LIMIT 100
    ) latest
    """

    def model_price(self, model: str, tenant_id: str) -> tuple[float | None, int]:
        row = self._row(self.MODEL_PRICE, {"model": model, "tenant_id": tenant_id})
        return (float_or_none(row.usd), int(row.calls)) if row is not None else (None, 0)

    # What a call's cost is estimated from when its provider reported none (a call cut at a loop): the tenant's own
    # latest calls of the model with the tokens and the cost their provider reported (never an estimate).
    PRICE_HISTORY = """
    SELECT prompt_tokens, completion_tokens, cost FROM attempts
    WHERE tenant_id = %(tenant_id)s AND model = %(model)s AND cost IS NOT NULL AND NOT cost_estimated
      AND prompt_tokens IS NOT NULL AND completion_tokens IS NOT NULL
    ORDER BY id DESC LIMIT 100
    """

    def price_history(self, model: str, tenant_id: str) -> list[PricedCall]:
        rows = self._rows(self.PRICE_HISTORY, {"model": model, "tenant_id": tenant_id})
        return [PricedCall(r.prompt_tokens, r.completion_tokens, float(r.cost)) for r in rows]

    SET_TENANT_BUDGET = "UPDATE tenants SET daily_budget_usd = %(usd)s WHERE id = %(tenant_id)s RETURNING id"

    def set_daily_budget(self, tenant_id: str, usd: float | None) -> bool:
        return self._row(self.SET_TENANT_BUDGET, {"tenant_id": tenant_id, "usd": usd}) is not None

    # A tenant's day: the sum of its shards (DAY_SHARDS).
    TENANT_DAY = """
    SELECT t.daily_budget_usd, d.spent_usd, d.calls FROM tenants t
    CROSS JOIN LATERAL (
        SELECT sum(spent_usd) AS spent_usd, sum(calls) AS calls FROM tenant_days
        WHERE tenant_id = t.id AND day = CAST(now() AT TIME ZONE 'UTC' AS date)
    ) d
    WHERE t.id = %(tenant_id)s
    """

    def tenant_day(self, tenant_id: str) -> TenantDay | None:
        row = self._row(self.TENANT_DAY, {"tenant_id": tenant_id})
        if row is None:
            return None
        return TenantDay(float_or_none(row.daily_budget_usd), float(row.spent_usd or 0), int(row.calls or 0))

    # The rate governor's take, one statement: the bucket is refilled for the time since it was last touched, then a
    # call may start now (wait 0), or reserves the next free slot ahead (requests goes below zero by the slots reserved)
    # and waits for it off the Lambda clock, in the queue. During a 429's pause nothing is reserved: the wait is the
    # pause. A page back for the slot it reserved (prepaid) takes nothing more; only a pause holds it back.
    #
    # The pages of a batch that reach the governor together take their slots at once (a page alone is a list of one),
    # each as a take of its own just after those before it would: the n-th page sees the bucket less the slots the
    # pages before it took (``ahead``: the pages before it that are not prepaid; its wait only grows with them, so
    # those that take are the first, and a page that takes none sees the bucket less those that did, ``taken``).
    #
    # The bucket is one row for every call of every tenant to the model, held from its update to its commit: once for
    # the batch, not once a page. Its state is approximate by nature (a refill estimate), so its commit does not wait
    # for the WAL flush (synchronous_commit off for this statement's transaction, set in the statement itself: no round
    # trip more): the row is free again as soon as the commit is written, not flushed. A crash may forget the last
    # fraction of a second of takes.
    TAKE_RATE_SLOTS = """
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
    pages AS (
        SELECT n, prepaid,
               count(*) FILTER (WHERE NOT prepaid) OVER (ORDER BY n ROWS UNBOUNDED PRECEDING EXCLUDE CURRENT ROW)
                   AS ahead
        FROM unnest(CAST(%(prepaid)s AS boolean[])) WITH ORDINALITY AS p (prepaid, n)
    ),
    candidates AS (
        SELECT p.n, p.prepaid, b.requests, b.tokens, b.mean_tokens, b.paused,
               b.paused = 0 AND NOT p.prepaid
               AND greatest(0, (1 - (b.requests - p.ahead)) / %(requests_per_second)s,
                            (least(b.mean_tokens, %(token_burst)s) - (b.tokens - p.ahead * b.mean_tokens))
                                / nullif(%(tokens_per_second)s, 0)) <= %(max_wait)s AS takes
        FROM pages p, bucket b
    ),
    decision AS (
        SELECT n, takes, mean_tokens, paused,
               CASE
                 WHEN paused > 0 THEN paused
                 WHEN prepaid THEN 0
                 ELSE greatest(0, (1 - (requests - taken)) / %(requests_per_second)s,
                               (least(mean_tokens, %(token_burst)s) - (tokens - taken * mean_tokens))
                                   / nullif(%(tokens_per_second)s, 0))
               END AS wait
        FROM (
            SELECT *, count(*) FILTER (WHERE takes) OVER (ORDER BY n ROWS UNBOUNDED PRECEDING EXCLUDE CURRENT ROW)
                          AS taken
            FROM candidates
        ) c
    ),
    taking AS (
        UPDATE rate_buckets r
        SET requests = b.requests - t.slots,
            tokens = b.tokens - CASE WHEN %(tokens_per_second)s > 0 THEN t.slots * b.mean_tokens ELSE 0 END,
            refilled_at = now()
        FROM bucket b, (SELECT count(*) FILTER (WHERE takes) AS slots FROM candidates) t,
             (SELECT set_config('synchronous_commit', 'off', true) AS relaxed) commit_unflushed
        WHERE r.provider = b.provider AND r.model = b.model AND commit_unflushed.relaxed = 'off'
        RETURNING r.provider
    )
    SELECT d.wait, d.takes AS reserved, d.paused > 0 AS paused, d.mean_tokens,
           now() + make_interval(secs => d.wait) AS slot_at
    FROM decision d, taking
    ORDER BY d.n
    """

    CREATE_RATE_BUCKET = """
    INSERT INTO rate_buckets (provider, model, requests, tokens)
    VALUES (%(provider)s, %(model)s, %(burst)s, %(token_burst)s)
    ON CONFLICT (provider, model) DO NOTHING
    """

    def take_rate_slots(
        self, bucket: RateBucket, model: str, *, prepaid: Sequence[bool], max_wait: float
    ) -> list[RateGrant]:
        params = {**bucket.params(model), "prepaid": list(prepaid), "max_wait": max_wait}
        rows = self._rows(self.TAKE_RATE_SLOTS, params)
        if not rows:
            self._rows(self.CREATE_RATE_BUCKET, params)
            rows = self._rows(self.TAKE_RATE_SLOTS, params)
            assert rows, "the bucket was just made"
        return [
            RateGrant(float(row.wait), row.reserved, row.paused, float(row.mean_tokens), row.slot_at) for row in rows
        ]

    # A 429: every environment holds its calls to this model until the provider's Retry-After has passed.
    PAUSE_RATE_BUCKET = """
    UPDATE rate_buckets
    SET paused_until = greatest(coalesce(paused_until, now()), now() + make_interval(secs => %(seconds)s))
    WHERE provider = %(provider)s AND model = %(model)s
    """

    def pause_rate_bucket(self, bucket: RateBucket, model: str, seconds: float) -> None:
        self._rows(self.PAUSE_RATE_BUCKET, {**bucket.params(model), "seconds": seconds})

    # Calls' real tokens against the estimates they took: the bucket owes or is owed the difference, and learns the
    # mean, each call moving it a tenth of the way to its own tokens (in the order the calls ended: ``_mean_after``).
    # Its commit, as TAKE_RATE_SLOTS', does not wait for the WAL flush.
    SETTLE_RATE_USAGE = """
    UPDATE rate_buckets
    SET tokens = tokens - %(owed)s,
        mean_tokens = CASE WHEN mean_tokens IS NULL THEN %(first_mean)s ELSE %(kept)s * mean_tokens + %(learned)s END
    FROM (SELECT set_config('synchronous_commit', 'off', true) AS relaxed) commit_unflushed
    WHERE provider = %(provider)s AND model = %(model)s AND commit_unflushed.relaxed = 'off'
    """

    def settle_rate_tokens(self, bucket: RateBucket, model: str, *, calls: Sequence[tuple[float, int]]) -> None:
        if not calls:
            return
        actuals = [actual for _, actual in calls]
        kept, learned = _mean_after(actuals)
        _, first_learned = _mean_after(actuals[1:])
        params = {
            "owed": sum(actual - estimate for estimate, actual in calls),
            "kept": kept,
            "learned": learned,
            "first_mean": 0.9 ** (len(actuals) - 1) * actuals[0] + first_learned,
        }
        self._rows(self.SETTLE_RATE_USAGE, {**bucket.params(model), **params})


def _mean_after(tokens: Sequence[int]) -> tuple[float, float]:
    """What a mean becomes after these calls, each moving it a tenth of the way to its own tokens: the share of the
    mean kept, and what the calls add (``kept * mean + learned``)."""
    kept, learned = 1.0, 0.0
    for used in tokens:
        kept, learned = 0.9 * kept, 0.9 * learned + 0.1 * used
    return kept, learned
