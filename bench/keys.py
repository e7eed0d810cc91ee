"""What finding a caller's tenant costs the API function: a key looked up by its hash in PostgreSQL, against the
answer kept in the warm environment (pagescribe.tenancy.KeyRing).

The measurement behind keeping the key check in the handler with a short cache rather than a Lambda authorizer:
an authorizer is a second function invocation in front of every request its own cache misses. Run with
``.venv/bin/python -m bench.keys``; it prints the latencies side by side (milliseconds, median and 95th percentile).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pagescribe.settings import Settings
from pagescribe.store.postgres import Database, create_database_engine
from pagescribe.tenancy import KeyRing, create_key

from bench.common import fresh_database, median, percentile

KEYS = 1000  # of 50 tenants
LOOKUPS = 2000


def _timed(lookup: Callable[[str], str], keys: list[str]) -> list[float]:
    spent = []
    for index in range(LOOKUPS):
        started = time.perf_counter()
        lookup(keys[index % len(keys)])
        spent.append((time.perf_counter() - started) * 1000)
    return spent


def main() -> int:
    with fresh_database("keys") as url:
        engine = create_database_engine(url)
        try:
            db = Database(engine)
            keys = [create_key(db, f"tenant-{index % 50}")[1] for index in range(KEYS)]
            uncached = KeyRing(Settings(api_key_cache_seconds=0), db)
            cached = KeyRing(Settings(api_key_cache_seconds=30), db)
            for key in keys:
                cached.tenant_for(key)
            looked_up, remembered = _timed(uncached.tenant_for, keys), _timed(cached.tenant_for, keys)
        finally:
            engine.dispose()
    print(f"{KEYS} keys of 50 tenants, {LOOKUPS} lookups each way")
    print("| lookup | median ms | p95 ms |")
    print("| --- | ---: | ---: |")
    for label, spent in (("PostgreSQL, by hash", looked_up), ("kept in the environment", remembered)):
        print(f"| {label} | {median(spent):.4f} | {percentile(spent, 0.95):.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
