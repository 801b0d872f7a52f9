"""Charge every nanosecond of every rank's step windows to exactly one of the nine ledgers.

attribute_job matches collectives across ranks and aligns clocks (ninefold.analysis.attribution.alignment: the only cross-rank
phase), then takes the ranks in groups: each group's GPU ops are read as plain column scans, joined to their
launches and collective keys, sorted and swept rank by rank by the compiled core (ninefold.analysis.attribution.rank_pass,
ninefold.analysis.attribution.core, which holds the LEDGERS precedence), ranks in parallel threads; intervals, totals, windows,
offsets and the drill-down keys are stored through Arrow appends.
"""
from __future__ import annotations

import numpy as np

from ninefold.analysis.attribution.alignment import align
from ninefold.analysis.classify import classify_kernel
from ninefold.analysis.intervals import i64 as _i64
from ninefold.analysis.ledgers import LEDGERS
from ninefold.store.arrays import from_numpy, strings, table
from ninefold.store.connection import abort, append_arrow
from ninefold.analysis.attribution.rank_pass import (REENTRANT_HOST, RECOMPUTE_HOST, io_regions, rank_groups, read_group,  # noqa: F401
                                recomputed, sweep_group)

# the sweep's family codes (ninefold.analysis.attribution.core.sweep_rank) of ninefold.analysis.classify's families
FAMILY_CODE = {"compute": 0, "comm": 1, "copy": 2}

DDL = {
    # drill-down keys: the GPU op that the interval is charged to (for an idle/host/io/bubble gap, the op
    # that ends the gap), and for communication the collective's process group and sequence number
    # the intervals, stored with integer codes (the ledger's index in LEDGERS; the op and process group by
    # ledger_names, per job; -1 = none, also for seq: no NULLs to mask); read them through the ledger_intervals
    # view, which carries the names
    "ledger_segments": """job VARCHAR, rank INTEGER, step INTEGER, ledger_code UTINYINT, start_ns BIGINT,
                          end_ns BIGINT, op_code INTEGER, pg_code INTEGER, seq BIGINT""",
    "ledger_names": """job VARCHAR, kind VARCHAR, code INTEGER, name VARCHAR""",
    "ledger_totals": """job VARCHAR, rank INTEGER, step INTEGER, ledger VARCHAR, ns BIGINT""",
    "step_windows": """job VARCHAR, rank INTEGER, step INTEGER, start_ns BIGINT, end_ns BIGINT""",
    # offset_ns is the offset applied (0 where the estimate was not used); estimate_ns what the completions say
    "clock_offsets": """job VARCHAR, rank INTEGER, offset_ns BIGINT, residual_ns BIGINT, n_matched INTEGER,
                        estimate_ns BIGINT, applied BOOLEAN, reason VARCHAR""",
    # per job: the class rule each kernel name met, and the parallel axis each process group was read as
    "kernel_classes": """job VARCHAR, name VARCHAR, family VARCHAR, kclass VARCHAR, rules_version INTEGER""",
    "pg_axes": """job VARCHAR, pg_name VARCHAR, pg_desc VARCHAR, group_size INTEGER, axis VARCHAR""",
    # every collective kernel as matched across ranks: its own clock's start/end, the aligned arrival of itself
    # and of the last member (ns), whether it was matched (enough members, ends agree), the shortest member
    "collective_matches": """job VARCHAR, rank INTEGER, gid BIGINT, pg_name VARCHAR, coll VARCHAR, seq BIGINT,
                             ord BIGINT, start_ns BIGINT, end_ns BIGINT, arrival_ns BIGINT, last_arrival_ns BIGINT,
                             n_members INTEGER, p2p BOOLEAN, matched BOOLEAN, min_member_ns BIGINT""",
}

# Every charged interval with the LEDGERS drill-down keys: kernel class, collective type, process group and
# its axis, message bytes, copy direction; and, where an NCCL log was linked to the collective, its
# algorithm, protocol and channels. The collective is the one attribution matched (collective_matches, whose
# type `waits` reports): by (process group, sequence) where the interval carries them; else, for a collective
# matched by order, the kernel of the interval's op name on its rank that contains the interval, or that starts
# where it ends (a gap is keyed by the op that ended it).
MATCHED_KERNELS = """
        SELECT m.job, m.rank, m.pg_name, m.seq, m.start_ns, m.end_ns, c.kernel_name, min(m.coll) AS coll,
               max(c.bytes) AS bytes, max(c.group_size) AS group_size
        FROM collective_matches m
        JOIN collectives c ON c.job = m.job AND c.rank = m.rank AND c.start_ns = m.start_ns AND c.source = 'kernel'
             AND coalesce(c.pg_name, '') = coalesce(m.pg_name, '') AND coalesce(c.seq, -1) = coalesce(m.seq, -1)
        GROUP BY ALL"""
# a store attributed before collective_matches: the collectives themselves, typed as alignment types them
RECORDED_KERNELS = """
        SELECT job, rank, nullif(pg_name, '') AS pg_name, seq, start_ns, end_ns, kernel_name,
               min(nullif(lower(coll), '')) AS coll, max(bytes) AS bytes, max(group_size) AS group_size
        FROM collectives WHERE source = 'kernel' GROUP BY ALL"""


def drilldown_sql(nccl: bool = True, matches: bool = True) -> str:
    """The SELECT behind ledger_drilldown (queries embed it, so a store written by an older version, whose view
    lacks a column, still answers). NCCL=False leaves out the NCCL log columns (as NULL); MATCHES=False reads
    the collectives themselves, for a store without collective_matches."""
    sql = f"""
    WITH ck AS ({MATCHED_KERNELS if matches else RECORDED_KERNELS}
    ), iv AS (
        SELECT li.*, o.coll AS o_coll, o.bytes AS o_bytes, o.group_size AS o_group_size,
               li.seq IS NULL AND ((o.start_ns <= li.start_ns AND li.end_ns <= o.end_ns) OR o.start_ns = li.end_ns)
                   AS o_hit
        FROM ledger_intervals li
        ASOF LEFT JOIN (SELECT * FROM ck WHERE seq IS NULL) o
             ON o.job = li.job AND o.rank = li.rank AND o.kernel_name = li.op_name AND o.start_ns <= li.end_ns
    )
    SELECT li.* EXCLUDE (o_coll, o_bytes, o_group_size, o_hit), kc.kclass,
           coalesce(c.coll, CASE WHEN o_hit THEN o_coll END) AS coll,
           coalesce(c.bytes, CASE WHEN o_hit THEN o_bytes END) AS bytes,
           coalesce(c.group_size, CASE WHEN o_hit THEN o_group_size END) AS group_size,
           pa.axis, nl.algorithm, nl.protocol, nl.n_channels,
           CASE WHEN li.op_name LIKE 'Memcpy %' THEN nullif(regexp_extract(li.op_name, 'Memcpy (\\w+)', 1), '')
           END AS copy_kind
    FROM iv li
    LEFT JOIN kernel_classes kc ON kc.job = li.job AND kc.name = li.op_name
    LEFT JOIN (SELECT job, rank, pg_name, seq, min(coll) AS coll, max(bytes) AS bytes, max(group_size) AS group_size
               FROM ck WHERE seq IS NOT NULL GROUP BY ALL) c
           ON c.job = li.job AND c.rank = li.rank AND c.pg_name = li.pg_name AND c.seq = li.seq
    LEFT JOIN pg_axes pa ON pa.job = li.job AND pa.pg_name = li.pg_name
    LEFT JOIN (SELECT job, rank, pg_name, seq, min(algorithm) AS algorithm, min(protocol) AS protocol,
                      max(n_channels) AS n_channels
               FROM nccl_coll_links WHERE seq IS NOT NULL GROUP BY ALL) nl
           ON nl.job = li.job AND nl.rank = li.rank AND nl.pg_name = li.pg_name AND nl.seq = li.seq"""
    if not nccl:
        sql = sql.replace("nl.algorithm, nl.protocol, nl.n_channels,", "NULL AS algorithm, NULL AS protocol, "
                          "NULL::INTEGER AS n_channels,")
        sql = sql[:sql.index("    LEFT JOIN (SELECT job, rank, pg_name, seq, min(algorithm)")]
    return sql


DRILLDOWN_VIEW = "CREATE OR REPLACE VIEW ledger_drilldown AS" + drilldown_sql()
# every charged interval with its names: job, rank, step, ledger, start_ns, end_ns, op_name, pg_name, seq
INTERVALS_VIEW = f"""CREATE OR REPLACE VIEW ledger_intervals AS
    SELECT s.job, s.rank, s.step, ({list(LEDGERS)!r})[s.ledger_code + 1] AS ledger, s.start_ns, s.end_ns,
           o.name AS op_name, p.name AS pg_name, nullif(s.seq, -1) AS seq
    FROM ledger_segments s
    LEFT JOIN ledger_names o ON o.job = s.job AND o.kind = 'op' AND o.code = s.op_code
    LEFT JOIN ledger_names p ON p.job = s.job AND p.kind = 'pg' AND p.code = s.pg_code"""
OLD_COLUMNS = (("op_name", "VARCHAR"), ("pg_name", "VARCHAR"), ("seq", "BIGINT"))
# tables other modules compute from a job's attribution: a new attribution removes the job's rows
DERIVED = ("critical_path", "kernel_efficiency")

def _ensure_tables(con):
    for t, cols in DDL.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({cols})")
    for col, typ in (("estimate_ns", "BIGINT"), ("applied", "BOOLEAN"), ("reason", "VARCHAR")):
        con.execute(f"ALTER TABLE clock_offsets ADD COLUMN IF NOT EXISTS {col} {typ}")
    if con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'ledger_intervals' AND NOT temporary "
                   "AND schema_name = current_schema()").fetchone()[0]:
        _migrate_intervals(con)
    con.execute(INTERVALS_VIEW)
    con.execute(DRILLDOWN_VIEW)


def insert_named_intervals(con, source: str) -> None:
    """Store the rows of SOURCE (a table or view with ledger_intervals' named columns) as coded segments: names
    a job does not have yet get the next codes of its ledger_names."""
    for kind, col in (("op", "op_name"), ("pg", "pg_name")):
        con.execute(f"""INSERT INTO ledger_names
            SELECT x.job, '{kind}', coalesce(n.top, -1) + row_number() OVER (PARTITION BY x.job ORDER BY x.name),
                   x.name
            FROM (SELECT DISTINCT job, {col} AS name FROM {source} WHERE {col} IS NOT NULL) x
            LEFT JOIN (SELECT job, max(code) AS top FROM ledger_names WHERE kind = '{kind}' GROUP BY job) n
                   ON n.job = x.job
            WHERE NOT EXISTS (SELECT 1 FROM ledger_names y WHERE y.job = x.job AND y.kind = '{kind}'
                              AND y.name = x.name)""")
    con.execute(f"""INSERT INTO ledger_segments
        SELECT i.job, i.rank, i.step, list_position({list(LEDGERS)!r}, i.ledger) - 1, i.start_ns, i.end_ns,
               coalesce(o.code, -1), coalesce(p.code, -1), coalesce(i.seq, -1)
        FROM {source} i
        LEFT JOIN ledger_names o ON o.job = i.job AND o.kind = 'op' AND o.name = i.op_name
        LEFT JOIN ledger_names p ON p.job = i.job AND p.kind = 'pg' AND p.name = i.pg_name
        ORDER BY i.job, i.rank, i.start_ns""")


def _migrate_intervals(con) -> None:
    """A store written before the coded layout holds ledger_intervals as a table: its rows move to
    ledger_segments / ledger_names (the same intervals and names), and the table makes way for the view."""
    for col, typ in OLD_COLUMNS:
        con.execute(f"ALTER TABLE ledger_intervals ADD COLUMN IF NOT EXISTS {col} {typ}")
    con.execute("ALTER TABLE ledger_intervals RENAME TO _ledger_intervals_old")
    con.execute("DROP VIEW IF EXISTS ledger_drilldown")
    insert_named_intervals(con, "_ledger_intervals_old")
    con.execute("DROP TABLE _ledger_intervals_old")


def _store_keys(con, job: str, knames: list, rules: list) -> None:
    """kernel_classes and pg_axes rows of JOB (small: one per distinct kernel name and process group)."""
    from ninefold.analysis.classify import RULES_VERSION
    from ninefold.analysis.process_groups import process_groups

    if knames:
        # copies and memsets are known by their activity kind, not by a name rule
        kinds = dict(con.execute("SELECT name, min(kind) FROM gpu_ops WHERE job = ? AND kind IN ('memcpy', 'memset') "
                                 "GROUP BY name", [job]).fetchall())
        fam = ["copy" if n in kinds else r[0] for n, r in zip(knames, rules)]
        cls = [kinds.get(n, r[1]) for n, r in zip(knames, rules)]
        con.execute("INSERT INTO kernel_classes SELECT ?, unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
                    "unnest(?::VARCHAR[]), ?", [job, knames, fam, cls, RULES_VERSION])
    world = con.execute("SELECT max(world_size) FROM traces WHERE job = ?", [job]).fetchall()[0][0] or 0
    groups = process_groups(con, job, world=world)
    if groups:
        names = sorted(groups)
        con.execute("INSERT INTO pg_axes SELECT ?, unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
                    "unnest(?::INTEGER[]), unnest(?::VARCHAR[])",
                    [job, names, [groups[n]["desc"] for n in names], [groups[n]["size"] for n in names],
                     [groups[n]["axis"] for n in names]])


def check_pattern(what: str, pat: str | None) -> None:
    """ValueError naming WHAT when PAT (a user's host-op name pattern) is not a regular expression."""
    import re

    if pat is not None:
        try:
            re.compile(pat)
        except re.error as e:
            raise ValueError(f"{what} {pat!r} is not a regular expression: {e}") from None


def attribute_job(con, job: str, recompute_pattern: str | None = None, io_pattern: str | None = None,
                  progress=None) -> dict:
    """Charge every step window of JOB to the nine ledgers (tables in DDL). RECOMPUTE_PATTERN / IO_PATTERN: a
    regular expression on host op names (annotations, cpu ops, python frames) marking recomputation or
    data-loading / storage regions, beside the built-in rules. One transaction: a reader (or a store after a
    crash) sees the job's previous results or the new ones, never a mix. PROGRESS, when given, is called as
    progress(ranks_done, ranks) after each group of ranks is swept and written."""
    check_pattern("recompute pattern", recompute_pattern)
    check_pattern("io pattern", io_pattern)
    import duckdb

    try:
        _ensure_tables(con)
    except duckdb.Error as e:   # a full disk: one DiskFull line, nothing changed
        abort(con, e, f"the ledger tables for job {job!r}")
        raise
    try:
        con.execute("BEGIN TRANSACTION")
    except duckdb.TransactionException:  # the caller's transaction already holds the work
        return _attribute(con, job, recompute_pattern, io_pattern, progress)
    try:
        out = _attribute(con, job, recompute_pattern, io_pattern, progress)
        con.execute("COMMIT")
    except BaseException as e:
        abort(con, e, f"the ledgers of job {job!r}")
        raise
    return out


def _attribute(con, job, recompute_pattern, io_pattern, progress=None) -> dict:
    for t in DDL:
        if t != "clock_offsets":
            con.execute(f"DELETE FROM {t} WHERE job = ?", [job])
    con.execute("DELETE FROM diagnostics WHERE job = ? AND source = 'attribution'", [job])
    # results computed from the previous attribution (critical paths, per-kernel efficiency with its waits) go
    # with it, so no view shows them beside the new ledgers
    for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND schema_name = "
                            "current_schema() AND list_contains(?, table_name)", [list(DERIVED)]).fetchall():
        con.execute(f"DELETE FROM {t} WHERE job = ?", [job])
    import time

    t0 = time.perf_counter()
    ranks = [r[0] for r in con.execute("SELECT rank FROM traces WHERE job = ? ORDER BY rank", [job]).fetchall()]
    # kernel-name rules applied once per distinct name: family code 0 compute, 1 comm, 2 copy (memcpy/memset by
    # kind, and a runtime's copy kernels by name: ROCm 7.1 wrote its copies as kernels)
    knames = [r[0] for r in con.execute("SELECT DISTINCT name FROM gpu_ops WHERE job = ? "
                                        "AND name IS NOT NULL ORDER BY name", [job]).fetchall()]
    rules = [classify_kernel(n) for n in knames]
    con.register("_kclass", table({"kid": np.arange(len(knames), dtype=np.int32), "name": strings(knames),
                                   "fam": np.array([FAMILY_CODE.get(r[0], 0) for r in rules], np.int8),
                                   "p2p": np.array([r[1] == "sendrecv" for r in rules], np.bool_),
                                   "cls": strings([r[1] for r in rules])}))
    _store_keys(con, job, knames, rules)
    con.execute("INSERT INTO ledger_names SELECT ?, 'op', unnest(range(?)), unnest(?::VARCHAR[])",
                [job, len(knames), knames])
    hn = dict(con.execute("SELECT rank, host_name FROM traces WHERE job = ?", [job]).fetchall())
    codes = {h: k for k, h in enumerate(sorted({h for h in hn.values() if h}))}
    offsets, waits, matched_keys = align(con, job, ranks, [codes.get(hn.get(r), -1) for r in ranks])
    t_align = time.perf_counter()
    world = con.execute("SELECT max(world_size) FROM traces WHERE job = ?", [job]).fetchone()[0] or 1
    pg_names = [r[0] for r in con.execute("SELECT DISTINCT pg_name FROM collectives WHERE job = ? "
                                          "AND pg_name IS NOT NULL ORDER BY 1", [job]).fetchall()]
    con.register("_pgs", table({"pgid": np.arange(len(pg_names), dtype=np.int32), "pg_name": strings(pg_names)}))
    con.execute("INSERT INTO ledger_names SELECT ?, 'pg', unnest(range(?)), unnest(?::VARCHAR[])",
                [job, len(pg_names), pg_names])
    fam_of = np.array([FAMILY_CODE.get(r[0], 0) for r in rules], dtype=np.int8)
    p2p_of = np.array([r[1] == "sendrecv" for r in rules], dtype=bool)
    # as many threads as the connection lets DuckDB use (a batch worker runs with one), at most two
    threads = max(1, min(2, int(con.execute("SELECT current_setting('threads')").fetchall()[0][0])))
    steps = con.execute("SELECT rank, step, start_ns, end_ns FROM steps WHERE job = ? ORDER BY rank, step",
                        [job]).fetchnumpy()
    secs = {"read": 0.0, "sweep": 0.0, "write": 0.0}
    unmatched_total = n_intervals = n_windows = 0
    groups = rank_groups(con, job)
    n_ranks = sum(1 for r in ranks if any(lo <= r <= hi for lo, hi in groups))
    bufs = {}  # the group's sorted op columns, reused by the next group
    for lo, hi in groups:
        t = time.perf_counter()
        allops = read_group(con, job, lo, hi, fam_of, p2p_of, threads, bufs)
        allops["re"] = recomputed(con, job, allops, recompute_pattern)
        io = io_regions(con, job, lo, hi, io_pattern)
        t1 = time.perf_counter()
        out = sweep_group(allops, io, _rows(steps, lo, hi), {k: _rows(v, lo, hi) for k, v in waits.items()},
                          _rows(matched_keys, lo, hi), threads)
        del allops
        t2 = time.perf_counter()
        unmatched_total += out["unmatched"]
        n_intervals += out["intervals"].num_rows
        n_windows += int(out["win_rank"].size)
        _write(con, job, out, knames, pg_names)
        secs["read"] += t1 - t
        secs["sweep"] += t2 - t1
        secs["write"] += time.perf_counter() - t2
        if progress is not None:
            progress(sum(1 for r in ranks if r <= hi and any(a <= r <= b for a, b in groups)), n_ranks)
    con.unregister("_kclass")
    con.unregister("_pgs")
    if unmatched_total:
        con.execute("INSERT INTO diagnostics VALUES (?, NULL, 'attribution', 'unmatched_comm', ?, ?)",
                    [job, unmatched_total, f"comm kernels with no peer trace (world {world}); charged to exposed_comm"])
    return {"intervals": n_intervals, "totals": n_windows * len(LEDGERS), "offsets": offsets,
            "seconds": {"align": t_align - t0, **secs}}


def _rows(cols, lo, hi):
    """The rows of ranks LO..HI of a column dict / tuple whose first (or "rank") column is the rank."""
    if isinstance(cols, dict):
        r = _i64(cols["rank"])
        m = (r >= lo) & (r <= hi)
        return {k: np.asarray(v)[m] for k, v in cols.items()}
    r = _i64(cols[0])
    m = (r >= lo) & (r <= hi)
    return tuple(_i64(c)[m] for c in cols)


def _write(con, job, out, knames, pg_names):
    """step_windows, ledger_intervals and ledger_totals rows of one group of ranks, each one Arrow append (not a
    registered table: the transaction would keep every group's rows alive until its commit)."""
    import pyarrow as pa

    nw = out["win_rank"].size
    if not nw:
        return
    append_arrow(con, "step_windows", table({"rank": out["win_rank"], "step": out["win_step"],
                                             "start_ns": out["w0"], "end_ns": out["w1"]}), job)

    def named(codes, names):
        # -1 = no name; dictionary-encoded, so no join and no per-row string is built here
        codes = np.asarray(codes, dtype=np.int32)
        return pa.DictionaryArray.from_arrays(from_numpy(codes, mask=codes < 0), strings(names))

    # produced rank by rank, window by window, in time order: already sorted for range scans
    append_arrow(con, "ledger_segments", out["intervals"], job)
    nl = len(LEDGERS)
    append_arrow(con, "ledger_totals", table({
        "rank": np.repeat(out["win_rank"], nl), "step": np.repeat(out["win_step"], nl),
        "ledger": named(np.tile(np.arange(nl, dtype=np.int32), nw), list(LEDGERS)),
        "ns": out["totals"].reshape(-1)}), job)
