"""nccl-tests output (``all_reduce_perf`` and friends) → nccl_tests_runs, nccl_tests_results.

The result table is the calibration data a cost model fits α/β from (time vs bytes, formats.md §5). Runs
with ``NCCL_DEBUG=INFO`` interleave NCCL lines with the table, often mid-row (``...  -1host:1:1 [1] NCCL
INFO AllReduce: opCount ...``). So the file goes through the NCCL log splitter first (ninefold.ingest.nccl_log.stage):
what is left outside any NCCL prefix is the program's own stdout, in order. Per table (from one ``#  size
count  type`` header to its footer) those fragments are joined and the rows are read off with one regex per
table, in DuckDB. The NCCL lines of the same file are stored too (nccl_colls ...), in the same transaction.
"""
from __future__ import annotations

import re
from pathlib import Path

from ninefold.ingest import nccl_log
from ninefold.ingest.nccl_log import first, q
from ninefold.ingest.registry import Loader
from ninefold.store.connection import abort
from ninefold.store.errors import IngestConflict, TraceFormatError

SOURCE = "nccl_tests"
HEADER = re.compile(rb"#\s+size\s+count\s+type")
HEADER_RE = r"^#\s+size\s+count\s+type\s+redop\s+root\s+"
TEST_OPS = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
            "broadcast": "Broadcast", "reduce": "Reduce", "alltoall": "AlltoAll", "sendrecv": "SendRecv",
            "scatter": "Scatter", "gather": "Gather", "hypercube": "Hypercube"}
NUM = r"(\S+)"


def sniff(path: Path, head: bytes) -> bool:
    return bool(HEADER.search(head))


def _op_of(test: str | None) -> str | None:
    if not test:
        return None
    base = re.sub(r"_perf(_mpi)?$", "", test)
    return TEST_OPS.get(base, base)


def stage_tests(con, path: Path) -> tuple[list[dict], list[tuple[str, int, str]]]:
    """From the staged _nl_rec records (nccl_log.stage), read every result table. Returns (blocks, diags)."""
    fname = str(Path(path).resolve())
    # program stdout: records outside any NCCL prefix, in file order
    con.execute("""CREATE OR REPLACE TEMP TABLE _nt_out AS
        SELECT pos, line_no, msg FROM _nl_rec WHERE NOT has_prefix AND msg <> ''""")
    heads = con.execute(f"""SELECT pos, line_no, msg FROM _nt_out WHERE regexp_matches(msg, {q(HEADER_RE)})
                            ORDER BY pos""").fetchall()
    if not heads:
        raise TraceFormatError(path, None, "no nccl-tests result table (no '#  size  count  type' header line)")
    blocks, diags = [], []
    for b, (hpos, hline, htext) in enumerate(heads):
        cols = htext.lstrip("#").split()[5:]           # per half: time algbw busbw #wrong (+ extras)
        if len(cols) % 2 or len(cols) < 8:
            raise TraceFormatError(path, f"line {hline}", f"nccl-tests header with {len(cols)} result columns; "
                                   "expected two halves (out-of-place, in-place)")
        half = cols[: len(cols) // 2]
        try:
            it, ia, ib, iw = (half.index("time") if "time" in half else half.index("cputime"),
                              half.index("algbw"), half.index("busbw"), half.index("#wrong"))
        except ValueError:
            raise TraceFormatError(path, f"line {hline}", f"nccl-tests header lacks time/algbw/busbw/#wrong: "
                                   f"{' '.join(half)}") from None
        k = len(half)
        row_re = r"(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)" + (r"\s+" + NUM) * (2 * k)
        nxt = heads[b + 1][0] if b + 1 < len(heads) else (1 << 62)
        # the table's stdout, up to its footer (or the next header)
        end = con.execute("""SELECT min(pos) FROM _nt_out WHERE pos > ? AND pos < ?
                              AND regexp_matches(msg, '^#\\s*(Out of bounds|Avg bus bandwidth|Collective test concluded)')""",
                          [hpos, nxt]).fetchone()[0] or nxt
        names = ["size", "count", "type", "redop", "root"] + [f"o{i}" for i in range(k)] + [f"i{i}" for i in range(k)]
        con.execute(f"""CREATE OR REPLACE TEMP TABLE _nt_rows_{b} AS
            WITH s AS (
                SELECT string_agg(msg, ' ' ORDER BY pos) AS txt FROM _nt_out
                WHERE pos > ? AND pos < ? AND NOT starts_with(msg, '#')
            ), r AS (SELECT unnest(regexp_extract_all(txt, {q(row_re)})) AS row, txt FROM s)
            SELECT row_number() OVER () AS i, regexp_extract(row, {q(row_re)}, {names}) AS m FROM r""",
                    [hpos, end])
        left = con.execute(f"""SELECT trim(regexp_replace(string_agg(msg, ' ' ORDER BY pos), {q(row_re)}, '', 'g'))
            FROM _nt_out WHERE pos > ? AND pos < ? AND NOT starts_with(msg, '#')""", [hpos, end]).fetchone()[0]
        if left:
            diags.append(("unparsed_table_text", 1, f"{fname}:{hline}: {left[:120]!r}"))
        # context lines: test name, process/GPU counts, footer
        ctx = con.execute("""SELECT
            (SELECT regexp_extract(msg, 'Collective test starting: (\\S+)', 1) FROM _nt_out
               WHERE pos < ? AND contains(msg, 'Collective test starting:') ORDER BY pos DESC LIMIT 1),
            (SELECT regexp_extract(msg, 'Collective test concluded: (\\S+)', 1) FROM _nt_out
               WHERE pos > ? AND pos < ? AND contains(msg, 'Collective test concluded:') ORDER BY pos LIMIT 1),
            (SELECT msg FROM _nt_out WHERE pos < ? AND regexp_matches(msg, '^#\\s*nThread') ORDER BY pos DESC LIMIT 1),
            (SELECT max(pos) FROM _nt_out WHERE pos < ? AND (contains(msg, 'Collective test starting:')
                                                            OR regexp_matches(msg, '^#\\s*nThread'))),
            (SELECT TRY_CAST(regexp_extract(msg, 'Avg bus bandwidth\\s*:\\s*(\\S+)', 1) AS DOUBLE) FROM _nt_out
               WHERE pos > ? AND pos < ? AND contains(msg, 'Avg bus bandwidth') ORDER BY pos LIMIT 1),
            (SELECT TRY_CAST(regexp_extract(msg, 'Out of bounds values\\s*:\\s*(\\d+)', 1) AS BIGINT) FROM _nt_out
               WHERE pos > ? AND pos < ? AND contains(msg, 'Out of bounds values') ORDER BY pos LIMIT 1)
            """, [hpos, hpos, nxt, hpos, hpos, hpos, nxt, hpos, nxt]).fetchone()
        start_name, end_name, nthread, _, avg, oob = ctx
        nranks = con.execute("""SELECT count(DISTINCT regexp_extract(msg, '#\\s*Rank\\s+(\\d+)', 1)) FROM _nt_out
            WHERE pos < ? AND regexp_matches(msg, '^#\\s*Rank\\s+\\d+ ')
              AND pos > coalesce((SELECT max(pos) FROM _nt_out WHERE pos < ? AND
                                  contains(msg, 'Collective test starting:')), -1)""", [hpos, hpos]).fetchone()[0]

        def grab(pat, cast=int):
            m = re.search(pat, nthread or "")
            return cast(m.group(1)) if m else None
        test = start_name or end_name
        n_rows = con.execute(f"SELECT count(*) FROM _nt_rows_{b}").fetchone()[0]
        if n_rows == 0:
            diags.append(("empty_table", 1, f"{fname}:{hline}: a result table with no complete row"))
        if avg is None:
            diags.append(("no_avg_busbw", 1, f"{fname}:{hline}: no '# Avg bus bandwidth' line after this table"))
        blocks.append({"block": b, "test": test, "op": _op_of(test), "nranks": nranks or None,
                       "n_gpus": grab(r"nGpus (\d+)"), "min_bytes": grab(r"minBytes (\d+)"),
                       "max_bytes": grab(r"maxBytes (\d+)"), "iters": grab(r"(?<!warmup )iters: (\d+)"),
                       "avg": avg, "oob": oob, "n_rows": n_rows, "idx": (it, ia, ib, iw), "k": k})
    return blocks, diags


def insert_tests(con, job: str, f: str, digest: str, blocks: list[dict], diags) -> int:
    con.execute("DELETE FROM nccl_tests_results WHERE job = ? AND path = ?", [job, f])
    con.execute("DELETE FROM nccl_tests_runs WHERE job = ? AND path = ?", [job, f])
    con.execute("DELETE FROM diagnostics WHERE job = ? AND source = ? AND starts_with(example, ?)",
                [job, SOURCE, f + ":"])
    n = 0
    for bl in blocks:
        b = bl["block"]
        it, ia, ib, iw = bl["idx"]
        for placement, pre in (("out", "o"), ("in", "i")):
            con.execute(f"""INSERT INTO nccl_tests_results
                SELECT ?, ?, ?, ?, ?, ?, CAST(m.size AS BIGINT), CAST(m.count AS BIGINT), m.type, m.redop,
                       CAST(m.root AS INTEGER), ?, TRY_CAST(m.{pre}{it} AS DOUBLE), TRY_CAST(m.{pre}{ia} AS DOUBLE),
                       TRY_CAST(m.{pre}{ib} AS DOUBLE), TRY_CAST(m.{pre}{iw} AS BIGINT)
                FROM _nt_rows_{b} ORDER BY i""", [job, f, b, bl["test"], bl["op"], bl["nranks"], placement])
        con.execute("""INSERT INTO nccl_tests_runs (job, path, sha256, block, test, op, nranks, n_gpus, min_bytes,
                       max_bytes, iters, n_rows, avg_busbw_gbs, out_of_bounds) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
                    [job, f, digest, b, bl["test"], bl["op"], bl["nranks"], bl["n_gpus"], bl["min_bytes"],
                     bl["max_bytes"], bl["iters"], bl["n_rows"], bl["avg"], bl["oob"]])
        n += bl["n_rows"]
    for code, cnt, ex in diags:
        con.execute("INSERT INTO diagnostics VALUES (?, NULL, ?, ?, ?, ?)", [job, SOURCE, code, cnt, ex])
    con.execute("INSERT INTO jobs (job) VALUES (?) ON CONFLICT (job) DO NOTHING", [job])
    return n


def load(con, path, job, rank=None, replace=False, salvage=False):
    """Store the result tables and, when the file has NCCL lines, the NCCL log part, in one transaction.
    Returns one LoadResult, or two (tests, NCCL log) when both parts were stored."""
    from ninefold.ingest.load import LoadResult, sha256_of

    path = Path(path)
    if not path.exists():
        raise TraceFormatError(path, None, "no such file")
    f = str(path.resolve())
    digest = sha256_of(path)
    same = first(con, "SELECT 1 FROM nccl_tests_runs WHERE job = ? AND sha256 = ?", [job, digest])
    if same is not None:
        return LoadResult(str(path), job, rank, "unchanged", "already stored (same sha256)")
    other = first(con, "SELECT sha256 FROM nccl_tests_runs WHERE job = ? AND path = ?", [job, f])
    if other is not None and not replace:
        raise IngestConflict(path, f"job {job!r} already holds a different version of this file "
                             f"(sha256 {other[0][:12]}); pass --replace to overwrite it")
    _, text = nccl_log.read_text(path)
    try:
        st = nccl_log.stage(con, path, text, rank=rank, salvage=salvage, require_nccl=False)
        blocks, diags = stage_tests(con, path)
        log_state = nccl_log.check_existing(con, path, job, digest, replace) if st["n_nccl"] else "absent"
        con.execute("BEGIN TRANSACTION")
        try:
            n = insert_tests(con, job, f, digest, blocks, diags)
            log_counts = nccl_log.insert_staged(con, job, digest, st) if log_state is None else None
            con.execute("COMMIT")
        except BaseException as e:
            abort(con, e, "this file's rows")
            raise
    finally:
        for b in range(64):
            con.execute(f"DROP TABLE IF EXISTS _nt_rows_{b}")
        con.execute("DROP TABLE IF EXISTS _nt_out")
        nccl_log.drop_staged(con)
    out = [LoadResult(str(path), job, rank, "stored", f"{len(blocks)} table(s), {n} rows",
                      {"nccl_tests_rows": n, "tables": len(blocks)})]
    if log_counts is not None:
        out.append(LoadResult(str(path), job, rank, "stored", "NCCL log lines of the same file", log_counts))
    return out if len(out) > 1 else out[0]


def fit_alpha_beta(con, job: str, op: str | None = None, placement: str = "out") -> list[dict]:
    """Least-squares t(S) = α + S/β per (test, nranks): α in µs, β_alg in GB/s (GB = 1e9 B)."""
    rows = con.execute("""
        SELECT test, nranks, regr_intercept(time_us, size_bytes) AS alpha_us,
               1e-3 / nullif(regr_slope(time_us, size_bytes), 0) AS beta_gbs, count(*) AS n
        FROM nccl_tests_results WHERE job = ? AND placement = ? AND (? IS NULL OR op = ?)
          AND time_us IS NOT NULL GROUP BY test, nranks ORDER BY test, nranks""",
                       [job, placement, op, op]).fetchall()
    return [dict(zip(["test", "nranks", "alpha_us", "beta_alg_gbs", "n"], r)) for r in rows]


LOADER = Loader(name="nccl_tests", suffixes=(".log", ".txt", ".out"), claims=sniff, load=load,
                description="nccl-tests result tables (all_reduce_perf ...), with any NCCL INFO lines in them")
