"""The reads the web app and the static report run, as named functions of a connection (views also call the
analysis functions directly, e.g. efficiency and what-if).

Each returns a polars DataFrame (or a small dict of them). Tables written by later stages
(``ledger_totals``, ``predicted_ledgers``, ``predicted_memory``, ``uploads`` ...) may be missing: every
query checks first and returns an empty frame, so a view can say what to run instead of failing.

Times stay integer ns; clocks are aligned with ``clock_offsets`` (aligned = own clock − offset_ns).
What the analysis layer decides is read from it, never re-derived here: the Stragglers and MoE queries take the
collectives attribution matched from ``ninefold.analysis.waits.collective_frame`` (what ``waits`` reads), kernel classes
from ``kernel_classes``, and the breakdown's collective from ``ninefold.analysis.attribution.attribute.drilldown_sql``.
"""
from __future__ import annotations

import polars as pl

from ninefold.analysis.ledgers import LEDGERS
from ninefold.store.connection import has_table  # noqa: F401  (views call queries.has_table)

NO_PREDICTION = "no prediction stored; run ninefold compare"
NOT_ATTRIBUTED = "no ledgers stored for this job; run ninefold attribute"

P2P_SQL = "lower(coll) IN ('send', 'recv', 'sendrecv', 'batch_isend_irecv')"

_LEDGER_ORDER = "CASE ledger " + " ".join(f"WHEN '{n}' THEN {i}" for i, n in enumerate(LEDGERS)) + " END"


# ---------------------------------------------------------------- helpers
def tables(con) -> set[str]:
    rows = con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    return {r[0] for r in rows}


def columns(con, name: str) -> list[str]:
    return [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                                      "ORDER BY ordinal_position", [name]).fetchall()]


def _one(con, sql: str, params=None):
    """First row or None. fetchall, not fetchone: DuckDB 2 keeps a partly fetched result open on the connection."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0] if rows else None


def _pl(con, sql: str, params=None) -> pl.DataFrame:
    """A polars frame of a query (DuckDB 2 results have no .pl(); relations go to Arrow without a copy)."""
    return pl.from_arrow(con.sql(sql, params=params or None).to_arrow_table())


def _empty(schema: dict) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def _offsets_cte(con, job_param: str = "?") -> str:
    """A CTE body giving (rank, offset_ns) for the job; zeros when no offsets were stored."""
    if has_table(con, "clock_offsets"):
        return (f"SELECT t.rank, coalesce(o.offset_ns, 0) AS offset_ns FROM traces t "
                f"LEFT JOIN clock_offsets o ON o.job = t.job AND o.rank = t.rank WHERE t.job = {job_param}")
    return f"SELECT rank, 0::BIGINT AS offset_ns FROM traces WHERE job = {job_param}"


# ---------------------------------------------------------------- jobs
def jobs(con) -> pl.DataFrame:
    """One row per job: ranks, status (ingested | attributed | failed), median step time, worst ledger.

    failed = every upload of the job failed (nothing stored); a job other loaders created without Kineto
    traces counts as ingested.

    worst ledger = the non-compute ledger holding the most time over all ranks and steps."""
    have = tables(con)
    attributed = "ledger_totals" in have
    lt = ("""
        , lt AS (SELECT job, ledger, sum(ns) AS ns FROM ledger_totals GROUP BY job, ledger)
        , worst AS (SELECT job, arg_max(ledger, ns) FILTER (ledger <> 'compute') AS worst_ledger,
                           max(ns) FILTER (ledger <> 'compute') / sum(ns) AS worst_share
                    FROM lt GROUP BY job)
        , win AS (SELECT job, rank, step, sum(ns) AS ns FROM ledger_totals GROUP BY job, rank, step)
        , stepmax AS (SELECT job, step, max(ns) AS ns FROM win GROUP BY job, step)
        , st AS (SELECT job, median(ns)::BIGINT AS step_ns, count(*) AS n_steps FROM stepmax GROUP BY job)""") \
        if attributed else ""
    sel = ("st.step_ns, st.n_steps, worst.worst_ledger, worst.worst_share"
           if attributed else "NULL::BIGINT AS step_ns, NULL::BIGINT AS n_steps, NULL::VARCHAR AS worst_ledger, "
                              "NULL::DOUBLE AS worst_share")
    joins = ("LEFT JOIN st ON st.job = j.job LEFT JOIN worst ON worst.job = j.job" if attributed else "")
    failed_union = ""
    if "uploads" in have:
        failed_union = """
        UNION ALL
        SELECT u.job, NULL, 0, 'failed', NULL, NULL, NULL, NULL, max(u.updated_at)::TIMESTAMP, any_value(u.message)
        FROM uploads u WHERE u.status = 'failed' AND u.job NOT IN (SELECT job FROM jobs) GROUP BY u.job"""
    fail_msg = ("(SELECT any_value(message) FROM uploads u WHERE u.job = j.job AND u.status = 'failed')"
                if "uploads" in have else "NULL::VARCHAR")
    sql = f"""
        WITH tr AS (SELECT job, count(*) AS n_ranks, max(ingested_at) AS ingested_at FROM traces GROUP BY job)
        {lt}
        SELECT j.job, j.world_size, coalesce(tr.n_ranks, 0) AS n_ranks,
               CASE WHEN {'st.step_ns IS NOT NULL' if attributed else 'false'} THEN 'attributed'
                    WHEN coalesce(tr.n_ranks, 0) = 0 AND {fail_msg} IS NOT NULL THEN 'failed'
                    ELSE 'ingested' END AS status,
               {sel}, coalesce(tr.ingested_at, j.created_at)::TIMESTAMP AS updated_at,
               {fail_msg} AS message
        FROM jobs j LEFT JOIN tr ON tr.job = j.job {joins}
        {failed_union}
        ORDER BY 1"""
    return _pl(con, sql)


def job_ranks(con, job: str) -> list[int]:
    return [r[0] for r in con.execute("SELECT rank FROM traces WHERE job = ? ORDER BY rank", [job]).fetchall()]


def job_steps(con, job: str) -> list[int]:
    if not has_table(con, "step_windows"):
        return []
    return [r[0] for r in con.execute("SELECT DISTINCT step FROM step_windows WHERE job = ? ORDER BY step",
                                      [job]).fetchall()]


def job_summary(con, job: str) -> dict:
    """Small facts for a page header: ranks, device, steps, diagnostics count."""
    row = _one(con, """SELECT count(*), any_value(device_name), max(world_size), any_value(backend),
                              any_value(nccl_version), sum(n_events)
                       FROM traces WHERE job = ?""", [job])
    out = {"job": job, "ranks": row[0], "device": row[1], "world_size": row[2], "backend": row[3],
           "nccl_version": row[4], "events": row[5], "steps": job_steps(con, job)}
    out["diagnostics"] = _one(con, "SELECT count(*) FROM diagnostics WHERE job = ?", [job])[0]
    return out


def diagnostics(con, job: str) -> pl.DataFrame:
    return _pl(con, """SELECT rank, source, code, count, example FROM diagnostics WHERE job = ?
                       ORDER BY source, code, rank NULLS FIRST""", [job])


# ---------------------------------------------------------------- overview
def job_overview(con, job: str) -> pl.DataFrame:
    """Per rank: mean ns per step of each of the nine ledgers, and step_ns; slowest rank first.

    Wide frame: rank, step_ns, n_steps, then one column per ledger (LEDGERS order)."""
    schema = {"rank": pl.Int32, "step_ns": pl.Float64, "n_steps": pl.Int64} | {n: pl.Float64 for n in LEDGERS}
    if not has_table(con, "ledger_totals"):
        return _empty(schema)
    pivot = ", ".join(f"sum(ns) FILTER (ledger = '{n}') / count(DISTINCT step) AS \"{n}\"" for n in LEDGERS)
    df = _pl(con, f"""
        SELECT rank, sum(ns) / count(DISTINCT step) AS step_ns, count(DISTINCT step) AS n_steps, {pivot}
        FROM ledger_totals WHERE job = ? GROUP BY rank ORDER BY step_ns DESC, rank""", [job])
    return df.with_columns([pl.col(n).fill_null(0.0) for n in LEDGERS]) if df.height else _empty(schema)


def comm_overlap(con, job: str) -> list[dict]:
    """Per rank: communication kernel time in the step windows and the share compute kernels overlap."""
    if not (has_table(con, "kernel_classes") and has_table(con, "step_windows")):
        return []
    from ninefold.analysis.waits import comm_compute_overlap

    return comm_compute_overlap(con, job)


def ledger_breakdown(con, job: str, top: int = 15) -> pl.DataFrame:
    """Where the time went: ns per rank-step (and share of all step time) by ledger and drill-down key — the
    collective (its type as attribution matched it, the one ``waits`` reports), its group's axis and (from a
    linked NCCL log) algorithm/protocol, the copy direction, or the kernel class; for a gap ledger, the work that
    ended the gap. ``coll`` is the key's collective type (null when the key is not a collective).
    Largest first."""
    schema = {"ledger": pl.Utf8, "key": pl.Utf8, "ns": pl.Float64, "share": pl.Float64, "coll": pl.Utf8}
    from ninefold.analysis.attribution.attribute import drilldown_sql

    if not all(has_table(con, t) for t in ("ledger_intervals", "kernel_classes", "pg_axes", "collectives",
                                             "step_windows")):
        return _empty(schema)   # not attributed, or attributed by a version without the drill-down tables
    drill = drilldown_sql(nccl=has_table(con, "nccl_coll_links"), matches=has_table(con, "collective_matches"))
    df = _pl(con, f"""
        WITH w AS (SELECT count(*) AS n, sum(end_ns - start_ns) AS total FROM step_windows
                   WHERE job = ? AND end_ns > start_ns),
        k AS (
            SELECT ledger, end_ns - start_ns AS ns, coll,
                   coalesce(CASE WHEN coll IS NOT NULL THEN coll || coalesce(' (' || axis || ')', '')
                                 || coalesce(' ' || algorithm || '/' || protocol, '') END,
                            CASE WHEN copy_kind IS NOT NULL THEN 'copy ' || copy_kind END, kclass) AS what
            FROM ({drill}) d WHERE job = ?
        )
        SELECT ledger,
               CASE WHEN ledger IN ('host', 'io', 'idle') OR (ledger = 'bubble' AND what IS NULL)
                    THEN coalesce('waiting, then ' || what, 'waiting') ELSE coalesce(what, '-') END AS key,
               sum(ns) / any_value(w.n) AS ns, sum(ns) / any_value(w.total) AS share, max(coll) AS coll
        FROM k, w GROUP BY ledger, key ORDER BY ns DESC, ledger, key LIMIT {int(top)}""", [job, job])
    return df if df.height else _empty(schema)


def prediction_config(con, job: str) -> str | None:
    """The config_sha of the most recently stored prediction for JOB (None when there is none)."""
    if not has_table(con, "predicted_ledgers"):
        return None
    row = _one(con, "SELECT config_sha FROM predicted_ledgers WHERE job = ? ORDER BY rowid DESC LIMIT 1",
                      [job])
    return row[0] if row else None


def ledger_compare(con, job: str, config_sha: str | None = None) -> pl.DataFrame:
    """Per ledger: measured and predicted ns per rank-step, residual (measured − predicted) and residual_pct, its
    share of the measured step in % (ninefold.analysis.cost_model.residual, as `ninefold compare` prints it).

    predicted_ns is null when no prediction is stored (view then says NO_PREDICTION)."""
    from ninefold.analysis.cost_model.residual import residual_share

    schema = {"ledger": pl.Utf8, "measured_ns": pl.Float64, "predicted_ns": pl.Float64,
              "residual_ns": pl.Float64, "residual_pct": pl.Float64}
    if not has_table(con, "ledger_totals"):
        return _empty(schema)
    cfg = config_sha or prediction_config(con, job)
    pred = ""
    if cfg is not None:
        pred = """, p AS (
            SELECT ledger, sum(ns) / count(DISTINCT (coalesce(rank, -1), coalesce(step, -1)))::DOUBLE AS ns
            FROM predicted_ledgers WHERE job = ? AND config_sha = ? GROUP BY ledger)"""
    params = [job] + ([job, cfg] if cfg is not None else [])
    df = _pl(con, f"""
        WITH m AS (
            SELECT ledger, sum(ns) / count(DISTINCT (rank, step))::DOUBLE AS ns
            FROM ledger_totals WHERE job = ? GROUP BY ledger) {pred}
        SELECT m.ledger, m.ns AS measured_ns, {'p.ns' if cfg else 'NULL::DOUBLE'} AS predicted_ns,
               m.ns - {'p.ns' if cfg else 'NULL::DOUBLE'} AS residual_ns,
        FROM m {'LEFT JOIN p ON p.ledger = m.ledger' if cfg else ''}
        ORDER BY {_LEDGER_ORDER.replace('ledger', 'm.ledger', 1)}""", params)
    if not df.height:
        return _empty(schema)
    step = df["measured_ns"].sum()
    pct = [None if s is None else 100 * s for s in (residual_share(r, step) for r in df["residual_ns"].to_list())]
    return df.with_columns(pl.Series("residual_pct", pct, dtype=pl.Float64))


def predicted_terms(con, job: str, config_sha: str | None = None) -> dict[str, list[dict]]:
    """Per ledger, the terms its prediction is made of (term, value, unit, source) in their order; {} when none
    are stored (no prediction, or one stored before the terms were)."""
    cfg = config_sha or prediction_config(con, job)
    if cfg is None or not has_table(con, "predicted_terms"):
        return {}
    out: dict = {}
    for led, term, value, unit, source in con.execute(
            "SELECT ledger, term, value, unit, source FROM predicted_terms WHERE job = ? AND config_sha = ? "
            "ORDER BY ledger, seq", [job, cfg]).fetchall():
        out.setdefault(led, []).append({"term": term, "value": value, "unit": unit, "source": source})
    return out


def predicted_overview(con, job: str, config_sha: str | None = None) -> pl.DataFrame:
    """Per rank: predicted step ns (sum over ledgers, mean over steps); empty when no prediction."""
    cfg = config_sha or prediction_config(con, job)
    if cfg is None:
        return _empty({"rank": pl.Int32, "predicted_step_ns": pl.Float64})
    return _pl(con, """
        WITH s AS (SELECT rank, step, sum(ns) AS ns FROM predicted_ledgers WHERE job = ? AND config_sha = ?
                   GROUP BY rank, step)
        SELECT rank, avg(ns) AS predicted_step_ns FROM s GROUP BY rank ORDER BY rank NULLS FIRST""", [job, cfg])


# ---------------------------------------------------------------- timeline
def timeline(con, job: str, step: int | None = None, max_rows: int = 20_000, width_px: int = 1600,
             t0_ns: int | None = None, t1_ns: int | None = None, ranks: tuple[int, int] | None = None
             ) -> pl.DataFrame:
    """Ledger intervals of one step, per rank, on the aligned clock, downsampled in SQL.

    The window [t0, t1) (default: the step's union over ranks) is cut into pixel buckets of width
    bw = span / width_px, widened until ranks × 2 × span / bw ≤ max_rows. An interval at least one
    bucket long is kept (clipped to the window); shorter ones are pooled per (rank, bucket) and drawn
    as one bar of the bucket's dominant ledger. Consecutive bars of one ledger are then merged.
    Columns: rank, ledger, start_ns, end_ns (relative to t0), ns (time of that ledger inside the bar),
    n (source intervals). At most max_rows rows."""
    schema = {"rank": pl.Int32, "ledger": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64,
              "ns": pl.Int64, "n": pl.Int64}
    if not has_table(con, "ledger_intervals") or not has_table(con, "step_windows"):
        return _empty(schema)
    if step is None:
        steps = job_steps(con, job)
        if not steps:
            return _empty(schema)
        step = steps[len(steps) // 2]
    off = _offsets_cte(con)
    rank_lo, rank_hi = ranks if ranks else (-(2 ** 31), 2 ** 31 - 1)
    win = _one(con, f"""
        WITH o AS ({off})
        SELECT min(w.start_ns - o.offset_ns), max(w.end_ns - o.offset_ns), count(DISTINCT w.rank)
        FROM step_windows w JOIN o ON o.rank = w.rank
        WHERE w.job = ? AND w.step = ? AND w.rank BETWEEN ? AND ?""", [job, job, step, rank_lo, rank_hi])
    if win[0] is None:
        return _empty(schema)
    t0 = int(t0_ns) if t0_ns is not None else int(win[0])
    t1 = int(t1_ns) if t1_ns is not None else int(win[1])
    n_ranks = max(int(win[2]), 1)
    span = max(t1 - t0, 1)
    width = max(1, min(int(width_px), max(1, max_rows // (2 * n_ranks))))
    bw = max(1, -(-span // width))  # ceil
    sql = f"""
        WITH o AS ({_offsets_cte(con, '$job')}),
        iv AS (
            SELECT i.rank, i.ledger,
                   greatest(i.start_ns - o.offset_ns, $t0) - $t0 AS s,
                   least(i.end_ns - o.offset_ns, $t1) - $t0 AS e
            FROM ledger_intervals i JOIN o ON o.rank = i.rank
            WHERE i.job = $job AND i.step = $step AND i.rank BETWEEN $rlo AND $rhi
              AND i.end_ns - o.offset_ns > $t0 AND i.start_ns - o.offset_ns < $t1
        ),
        long AS (SELECT rank, ledger, s, e, e - s AS ns, 1::BIGINT AS n FROM iv WHERE e - s >= $bw),
        short AS (SELECT rank, s // $bw AS b, ledger, sum(e - s) AS ns, count(*) AS n, min(s) AS s, max(e) AS e
                  FROM iv WHERE e - s < $bw GROUP BY ALL),
        pooled AS (
            SELECT rank, arg_max(ledger, ns) AS ledger, min(s) AS s, max(e) AS e,
                   max(ns) AS ns, sum(n)::BIGINT AS n
            FROM short GROUP BY rank, b
        ),
        bars AS (SELECT * FROM long UNION ALL SELECT rank, ledger, s, e, ns, n FROM pooled),
        runs AS (
            SELECT *, sum(CASE WHEN prev_ledger IS DISTINCT FROM ledger OR prev_e < s THEN 1 ELSE 0 END)
                      OVER (PARTITION BY rank ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS run
            FROM (SELECT *, lag(ledger) OVER (PARTITION BY rank ORDER BY s, e) AS prev_ledger,
                            lag(e) OVER (PARTITION BY rank ORDER BY s, e) AS prev_e FROM bars)
        )
        SELECT rank::INTEGER AS rank, ledger, min(s)::BIGINT AS start_ns, max(e)::BIGINT AS end_ns,
               sum(ns)::BIGINT AS ns, sum(n)::BIGINT AS n
        FROM runs GROUP BY rank, ledger, run
        ORDER BY rank, start_ns
        LIMIT $cap"""
    df = (_pl(con, sql, {"t0": t0, "t1": t1, "job": job, "step": step, "rlo": rank_lo, "rhi": rank_hi,
                           "bw": bw, "cap": int(max_rows)}))
    return df if df.height else _empty(schema)


def timeline_window(con, job: str, step: int) -> tuple[int, int] | None:
    """(t0, t1) of STEP on the aligned clock, over all ranks."""
    if not has_table(con, "step_windows"):
        return None
    row = _one(con, f"""WITH o AS ({_offsets_cte(con)})
        SELECT min(w.start_ns - o.offset_ns), max(w.end_ns - o.offset_ns)
        FROM step_windows w JOIN o ON o.rank = w.rank WHERE w.job = ? AND w.step = ?""", [job, job, step])
    return None if row[0] is None else (int(row[0]), int(row[1]))


# ---------------------------------------------------------------- stragglers
def _matched(con, job: str) -> pl.DataFrame:
    """The collectives attribution matched across ranks (by sequence or by order), not point-to-point, from
    ninefold.analysis.waits.collective_frame, with each one's first and last arrival and its last rank; pg is the process
    group's description where the trace gives one."""
    from ninefold.analysis.waits import collective_frame

    f = collective_frame(con, job).filter(pl.col("matched") & ~pl.col("p2p"))
    if f.height and has_table(con, "pg_axes"):
        desc = _pl(con, "SELECT DISTINCT pg_name AS pg, pg_desc FROM pg_axes WHERE job = ? AND pg_desc IS NOT NULL",
                   [job])
        if desc.height:
            f = (f.join(desc.unique("pg"), on="pg", how="left")
                 .with_columns(pl.coalesce("pg_desc", "pg").alias("pg")).drop("pg_desc"))
    return f.with_columns(pl.col("arrival_ns").min().over("gid").alias("first_ns"),
                          pl.col("arrival_ns").max().over("gid").alias("last_ns"),
                          pl.col("rank").sort_by(["arrival_ns", "rank"]).last().over("gid").alias("last_rank"))


def _label(pg, seq, coll, ord_) -> str:
    return f"{pg}:{seq} {coll}" if seq is not None else f"{pg + ':' if pg else ''}{coll} #{ord_}"


def straggler_matrix(con, job: str, max_collectives: int = 400) -> pl.DataFrame:
    """Rank × collective arrival skew: one row per (collective, rank) of the non-P2P collectives attribution
    matched across ranks (by process group and sequence, or by order).

    skew_ns = aligned arrival − first arrival of that collective; wait_ns = how long the rank waited for the
    last member, straggler_ns the part of it charged to the straggler ledger. ``col`` numbers the collectives in
    aligned-time order; at most max_collectives of them (those with the largest spread when there are more)."""
    schema = {"col": pl.Int64, "label": pl.Utf8, "pg": pl.Utf8, "seq": pl.Int64, "coll": pl.Utf8,
              "rank": pl.Int32, "skew_ns": pl.Int64, "wait_ns": pl.Int64, "straggler_ns": pl.Int64,
              "last_rank": pl.Int32}
    m = _matched(con, job)
    if m.height == 0:
        return _empty(schema)
    k = (m.group_by("gid").agg(pl.col("first_ns").first().alias("t"),
                               (pl.col("last_ns").first() - pl.col("first_ns").first()).alias("spread"))
         .sort(["spread", "t", "gid"], descending=[True, False, False]).head(int(max_collectives))
         .sort(["t", "gid"]).with_row_index("col").with_columns(pl.col("col").cast(pl.Int64)))
    out = m.join(k.select("gid", "col"), on="gid").sort(["col", "rank"])
    labels = [_label(*x) for x in zip(out["pg"], out["seq"], out["coll"], out["ord"])]
    return out.with_columns(pl.Series("label", labels, dtype=pl.Utf8),
                            (pl.col("arrival_ns") - pl.col("first_ns")).alias("skew_ns"),
                            pl.col("last_rank").cast(pl.Int32)).select(list(schema)).cast(schema)


def straggler_ranks(con, job: str, limit: int = 20) -> pl.DataFrame:
    """The ranks that make others wait most, over the non-P2P collectives attribution matched: per rank, the
    straggler time charged to the other members of the collectives where it arrived last (caused_wait_ns), how
    often it was last, its own wait (own_wait_ns), the part of that charged to straggler (straggler_ns: over
    all ranks, the job's straggler ledger) and how many matched collectives it ran."""
    schema = {"rank": pl.Int32, "caused_wait_ns": pl.Int64, "times_last": pl.Int64, "own_wait_ns": pl.Int64,
              "straggler_ns": pl.Int64, "collectives": pl.Int64}
    m = _matched(con, job)
    if m.height == 0:
        return _empty(schema)
    caused = (m.filter(pl.col("rank") != pl.col("last_rank")).group_by("last_rank")
              .agg(pl.col("straggler_ns").sum().alias("caused_wait_ns"), pl.col("gid").n_unique().alias("times_last"))
              .rename({"last_rank": "rank"}))
    own = m.group_by("rank").agg(pl.col("wait_ns").sum().alias("own_wait_ns"), pl.col("straggler_ns").sum(),
                                 pl.len().alias("collectives"))
    df = (own.join(caused, on="rank", how="left")
          .with_columns(pl.col("caused_wait_ns").fill_null(0), pl.col("times_last").fill_null(0))
          .sort(["caused_wait_ns", "rank"], descending=[True, False]).head(int(limit)))
    return df.select(list(schema)).cast(schema)


def straggler_total(con, job: str) -> int:
    """Time charged to the straggler ledger inside matched collectives, over all ranks (= the job's straggler
    ledger total: straggler time is only ever charged there)."""
    m = _matched(con, job)
    return int(m["straggler_ns"].sum()) if m.height else 0


# ---------------------------------------------------------------- MoE
def all_to_alls(con, job: str) -> pl.DataFrame:
    """The job's all-to-all kernels as attribution stored them (ninefold.analysis.waits.collective_frame rows whose type
    is an all-to-all: the recorded or host-op collective, else the kernel's class), matched or not, with the
    last member's rank of each matched one."""
    from ninefold.analysis.waits import collective_frame, is_all_to_all

    f = collective_frame(con, job)
    a2a = [c for c in f["coll"].unique().drop_nulls() if is_all_to_all(c)]  # the types, once each
    f = f.filter(pl.col("coll").is_in(a2a))
    last = pl.col("rank").sort_by(["arrival_ns", "rank"]).last().over("gid")
    return f.with_columns(pl.when(pl.col("matched")).then(last).otherwise(None).alias("last_rank"))


def _expert_gemms(con, job: str) -> pl.DataFrame:
    """Per rank: expert GEMM time and count — kernels of a grouped-GEMM class, or of any GEMM class (``gemm*`` in
    kernel_classes) launched inside an ``*expert*`` host range of their rank."""
    if not has_table(con, "kernel_classes"):
        return _empty({"rank": pl.Int32, "expert_gemm_ns": pl.Int64, "expert_gemms": pl.Int64})
    return _pl(con, """
        WITH ex AS (SELECT rank, start_ns, end_ns FROM host_ops WHERE job = $job AND name ILIKE '%expert%'),
        launch AS (SELECT h.rank, h.correlation, h.start_ns FROM host_ops h
                   WHERE h.job = $job AND h.cat IN ('cuda_runtime', 'cuda_driver') AND h.correlation IS NOT NULL),
        k AS (SELECT g.rank, g.end_ns - g.start_ns AS ns, kc.kclass LIKE '%grouped%' AS grouped,
                     l.start_ns AS launch_ns
              FROM gpu_ops g JOIN kernel_classes kc ON kc.job = g.job AND kc.name = g.name
              LEFT JOIN launch l ON l.rank = g.rank AND l.correlation = g.correlation
              WHERE g.job = $job AND g.kind = 'kernel' AND kc.kclass LIKE 'gemm%'),
        tagged AS (SELECT rank, ns, grouped OR EXISTS (SELECT 1 FROM ex WHERE ex.rank = k.rank
                                                       AND k.launch_ns >= ex.start_ns AND k.launch_ns < ex.end_ns)
                                    AS expert FROM k)
        SELECT rank::INTEGER AS rank, coalesce(sum(ns) FILTER (expert), 0)::BIGINT AS expert_gemm_ns,
               count(*) FILTER (expert) AS expert_gemms
        FROM tagged GROUP BY rank""", {"job": job})


def moe(con, job: str) -> dict:
    """The MoE drill-down.

    ranks: per rank all-to-all count, how many of them recorded their size (a2a_sized), bytes sent (a2a_bytes)
    and received (a2a_out_bytes), kernel time (a2a_ns),
    wait for the last member (a2a_wait_ns), times it arrived last, expert GEMM time and count, step_ns — the
    all-to-alls of all_to_alls(), the expert GEMMs of _expert_gemms().
    one_rank: the job has one rank (its all-to-alls have no peer: no wait, no cross-rank comparison).
    slowest: the busiest expert rank (largest expert GEMM time; step time breaks ties); None without all-to-alls.
    ledgers: that rank's mean per-step ledgers against the mean over ranks.
    predicted_makespan_ns: busiest predicted rank's step (None when no prediction)."""
    ranks_ = job_ranks(con, job)
    out = {"ranks": _empty({"rank": pl.Int32}), "slowest": None, "ledgers": _empty({"ledger": pl.Utf8}),
           "predicted_makespan_ns": None, "measured_makespan_ns": None, "one_rank": len(ranks_) == 1}
    a = all_to_alls(con, job)
    if a.height == 0:
        return out
    a2a = a.group_by("rank").agg(
        pl.len().alias("a2a_count"), pl.col("bytes").count().alias("a2a_sized"),
        pl.col("bytes").fill_null(0).sum().alias("a2a_bytes"),
        pl.col("out_bytes").fill_null(0).sum().alias("a2a_out_bytes"),
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("a2a_ns"), pl.col("wait_ns").sum().alias("a2a_wait_ns"),
        (pl.col("rank") == pl.col("last_rank")).sum().alias("times_last"))
    ov = job_overview(con, job).select(["rank", "step_ns"])
    ranks = (pl.DataFrame({"rank": ranks_}, schema={"rank": pl.Int32})
             .join(a2a.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left")
             .join(_expert_gemms(con, job).with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left")
             .join(ov.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left")
             .with_columns([pl.col(c).fill_null(0).cast(pl.Int64)
                            for c in ("a2a_count", "a2a_sized", "a2a_bytes", "a2a_out_bytes", "a2a_ns", "a2a_wait_ns",
                                      "times_last", "expert_gemm_ns", "expert_gemms")])
             .sort("rank"))
    out["ranks"] = ranks
    if ranks.height:
        key = ranks.sort(["expert_gemm_ns", "step_ns", "a2a_ns"], descending=True, nulls_last=True)
        out["slowest"] = int(key["rank"][0])
        out["measured_makespan_ns"] = float(ranks["step_ns"].max()) if ranks["step_ns"].null_count() < ranks.height \
            else None
        if has_table(con, "ledger_totals"):
            out["ledgers"] = _pl(con, f"""
                WITH r AS (SELECT rank, ledger, sum(ns) / count(DISTINCT step)::DOUBLE AS ns FROM ledger_totals
                           WHERE job = ? GROUP BY rank, ledger)
                SELECT ledger, avg(ns) FILTER (rank = ?) AS slowest_ns, avg(ns) AS mean_ns
                FROM r GROUP BY ledger ORDER BY {_LEDGER_ORDER}""", [job, out["slowest"]])
    pred = predicted_overview(con, job)
    if pred.height:
        out["predicted_makespan_ns"] = float(pred["predicted_step_ns"].max())
    return out


# ---------------------------------------------------------------- pipeline
def pipeline(con, job: str, step: int | None = None, max_rows: int = 20_000) -> dict:
    """Pipeline schedule as measured and its bubble against (p−1)/(m+p−1).

    p = ranks joined by P2P send/recv; m = micro-batches = median over (rank, pg) of P2P ops per step / 2
    (each neighbour pair carries one activation and one gradient per micro-batch).
    stages: per rank window_ns, compute_ns (compute + recompute), bubble_ns, idle fraction = 1 − compute/window.
    schedule: the timeline() bars of that step."""
    out = {"p": 0, "m": 0, "formula": None, "measured": None, "predicted": None,
           "stages": _empty({"rank": pl.Int32}),
           "schedule": _empty({"rank": pl.Int32}), "step": step}
    if not has_table(con, "collectives"):
        return out
    pm = _one(con, f"""
        WITH p2p AS (SELECT rank, pg_name, count(*) AS n FROM collectives
                     WHERE job = ? AND {P2P_SQL} AND pg_name IS NOT NULL GROUP BY rank, pg_name),
        ns AS (SELECT greatest(count(DISTINCT step), 1) AS n FROM steps WHERE job = ?)
        SELECT count(DISTINCT rank), median(n) / (SELECT n FROM ns) / 2 FROM p2p""", [job, job])
    if not pm[0]:
        return out
    p, m = int(pm[0]), int(round(pm[1] or 0))
    out["p"], out["m"] = p, m
    out["formula"] = (p - 1) / (m + p - 1) if m + p - 1 > 0 else None
    if has_table(con, "ledger_totals"):
        steps = job_steps(con, job)
        if step is None and steps:
            step = steps[0]
        out["step"] = step
        st = _pl(con, """
            SELECT rank, sum(ns)::BIGINT AS window_ns,
                   coalesce(sum(ns) FILTER (ledger IN ('compute', 'recompute')), 0)::BIGINT AS compute_ns,
                   coalesce(sum(ns) FILTER (ledger = 'bubble'), 0)::BIGINT AS bubble_ns,
                   coalesce(sum(ns) FILTER (ledger = 'idle'), 0)::BIGINT AS idle_ns
            FROM ledger_totals WHERE job = ? AND step = ? GROUP BY rank ORDER BY rank""", [job, step])
        st = st.with_columns((1 - pl.col("compute_ns") / pl.col("window_ns")).alias("non_compute_fraction"),
                             (pl.col("bubble_ns") / pl.col("window_ns")).alias("bubble_fraction"))
        out["stages"] = st
        if st.height:
            # the pipeline's bubble: the mean non-compute share of a stage's step window
            out["measured"] = float(st["non_compute_fraction"].mean())
        out["schedule"] = timeline(con, job, step, max_rows=max_rows)
    pred = ledger_compare(con, job)
    if pred.height and pred["predicted_ns"].null_count() < pred.height:
        tot = pred["predicted_ns"].sum()
        b = pred.filter(pl.col("ledger") == "bubble")["predicted_ns"]
        out["predicted"] = float(b[0] / tot) if tot and b.len() and b[0] is not None else None
    return out


# ---------------------------------------------------------------- memory
MEMORY_EVENT_TABLES = ("memory_events",)
MEMORY_TOTAL_COLUMNS = ("total_allocated", "total_allocated_bytes", "allocated_bytes", "bytes_allocated")


def memory(con, job: str) -> dict:
    """predicted: predicted_memory rows (rank, item, bytes); measured: per rank peak allocated bytes from the
    trace's memory events when a memory-event table is stored. Either may be empty."""
    out = {"predicted": _empty({"rank": pl.Int32, "item": pl.Utf8, "bytes": pl.Int64}),
           "measured": _empty({"rank": pl.Int32, "peak_bytes": pl.Int64})}
    if has_table(con, "predicted_memory"):
        out["predicted"] = _pl(con, """SELECT rank, item, sum(bytes)::BIGINT AS bytes FROM predicted_memory
                                       WHERE job = ? GROUP BY rank, item ORDER BY rank NULLS FIRST, item""", [job])
    for t in MEMORY_EVENT_TABLES:
        if not has_table(con, t):
            continue
        cols = columns(con, t)
        col = next((c for c in MEMORY_TOTAL_COLUMNS if c in cols), None)
        if col and "job" in cols and "rank" in cols:
            out["measured"] = _pl(con, f"""SELECT rank::INTEGER AS rank, max({col})::BIGINT AS peak_bytes
                                           FROM {t} WHERE job = ? GROUP BY rank ORDER BY rank""", [job])
            break
    return out

