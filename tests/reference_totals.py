"""Reference ledger results: every job the tests attribute, keyed by its attribution inputs.

The conftest wraps the attribution core: after each run it computes a content key of what the core reads
(GPU ops, host ops, collectives, steps, traces' rank metadata, the user's patterns) and of the kernel-name rules
that turn names into families (ninefold.analysis.classify.RULES_VERSION, the key's ``-r<N>`` suffix), and the job's results
(step windows and the nine totals of each). With NINEFOLD_RECORD_REFERENCE=1 the results are recorded under
that key in tests/reference/ledger_totals.json.gz; otherwise a run whose key is recorded must reproduce the
recorded windows and totals to the nanosecond, or the attribution call fails naming the difference.

Recorded once with the numpy sweep core; the compiled core must reproduce them exactly.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "reference" / "ledger_totals.json.gz"

# what attribution reads of each table (never file paths, digests or ingest times)
INPUT_COLUMNS = {
    "gpu_ops": "rank, kind, name, stream, start_ns, end_ns, correlation",
    "host_ops": "rank, pid, tid, cat, name, start_ns, end_ns, correlation",
    "collectives": "rank, pg_name, pg_desc, pg_ranks, seq, coll, bytes, group_size, start_ns, end_ns, "
                   "kernel_name, source",
    "steps": "rank, step, start_ns, end_ns",
    "traces": "rank, world_size, host_name",
}


def input_key(con, job: str, recompute_pattern, io_pattern) -> str:
    """The digest of JOB's attribution inputs, suffixed with the kernel-rules version (-r<N>): the same trace read
    under other rules may charge a kernel to another ledger."""
    from ninefold.analysis.classify import RULES_VERSION

    parts = [repr((recompute_pattern, io_pattern))]
    for t, cols in INPUT_COLUMNS.items():
        n, h = con.execute(f"SELECT count(*), coalesce(sum(hash({cols})::HUGEINT), 0)::VARCHAR "
                           f"FROM {t} WHERE job = ?", [job]).fetchone()
        parts.append(f"{t}:{n}:{h}")
    return f"{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:24]}-r{RULES_VERSION}"


def results(con, job: str) -> dict:
    """Step windows and, per window, the nine ledgers' ns in LEDGERS order."""
    from ninefold.analysis.ledgers import LEDGERS

    wins = con.execute("SELECT rank, step, start_ns, end_ns FROM step_windows WHERE job = ? "
                       "ORDER BY rank, step, start_ns", [job]).fetchall()
    tot = {}
    for r, s, led, ns in con.execute("SELECT rank, step, ledger, ns FROM ledger_totals WHERE job = ?",
                                     [job]).fetchall():
        tot.setdefault((r, s), {})[led] = ns
    return {"windows": [list(w) for w in wins],
            "totals": [[r, s] + [tot[(r, s)].get(k, 0) for k in LEDGERS] for r, s in sorted(tot)]}


def load() -> dict:
    if not REFERENCE.exists():
        return {}
    with gzip.open(REFERENCE, "rt") as f:
        return json.load(f)


def save(ref: dict) -> None:
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(REFERENCE, "wb", mtime=0) as f:
        f.write(json.dumps(ref, sort_keys=True, separators=(",", ":")).encode())


def compare(want: dict, got: dict) -> str | None:
    """None when equal, else a one-line account of the first difference."""
    from ninefold.analysis.ledgers import LEDGERS

    if want["windows"] != got["windows"]:
        for a, b in zip(want["windows"], got["windows"]):
            if a != b:
                return f"step window differs: recorded {a}, now {b}"
        return f"{len(want['windows'])} step windows recorded, {len(got['windows'])} now"
    for a, b in zip(want["totals"], got["totals"]):
        if a != b:
            diff = {k: (x, y) for k, x, y in zip(LEDGERS, a[2:], b[2:]) if x != y}
            return f"rank {a[0]} step {a[1]}: (recorded, now) {diff}"
    if len(want["totals"]) != len(got["totals"]):
        return f"{len(want['totals'])} totals rows recorded, {len(got['totals'])} now"
    return None
