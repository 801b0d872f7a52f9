"""Writing an Nsight Systems export's rows: decoded helper tables, then gpu_ops, host_ops (with NVTX depth),
steps and collectives in DuckDB SQL over the registered Arrow tables, and the counts and diagnostics of each
rank (the mapping is in ninefold.ingest.nsys's doc)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ninefold.ingest.depths import sorted_depths
from ninefold.ingest.nsys_ranks import _gpid
from ninefold.ingest.nsys_read import KERNEL_ARG_COLS, _Src
from ninefold.store.arrays import from_numpy, to_numpy

STEP_PATTERN = r"(?i)^(?:train(?:ing)?[ _.:-]*)?(?:step|iter|iteration)[ _#:=-]*(\d+)$"
PROFILER_STEP = r"^ProfilerStep#(\d+)(?:\D|$)"
NVTX_RANGE_TYPES = ("NvtxPushPopRange", "NvtxStartEndRange", "NvtxtPushPopRange", "NvtxtStartEndRange")
NVTX_MARK_TYPES = ("NvtxMark", "NvtxtMark")


def _lookup(enum: str, col: str, what: str = "label") -> str:
    return f"(SELECT e.{what} FROM _nenum e WHERE e.enum = '{enum}' AND e.id = {col})"


def _etype(names) -> str:
    lst = ", ".join(f"'{n}'" for n in names)
    return f"(SELECT id FROM _nenum WHERE enum = 'ENUM_NSYS_EVENT_TYPE' AND name IN ({lst}))"


def _stage(con, base: int) -> None:
    """Small decoded helper tables (before the transaction): enum decodings, API names, NVTX with depth."""
    b = int(base)
    # CUDA_MEMCPY_KIND_HTOD -> HtoD (Kineto's spelling), UVM_HTOD -> UVM_HtoD, UNKNOWN -> its label
    rx = "^(?:CUDA_MEMCPY_KIND_)?((?:UVM_)?)([A-Z])TO([A-Z])$"
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nck AS
        SELECT id, CASE WHEN regexp_matches(name, '{rx}') THEN regexp_replace(name, '{rx}', '\\1\\2to\\3')
                        ELSE coalesce(nullif(label, ''), regexp_replace(name, '^CUDA_MEMCPY_KIND_', '')) END AS kind,
               label
        FROM _nenum WHERE enum = 'ENUM_CUDA_MEMCPY_OPER'""")
    con.execute("""CREATE OR REPLACE TEMP TABLE _nmk AS
        SELECT id, coalesce(nullif(label, ''), name) AS label FROM _nenum WHERE enum = 'ENUM_CUDA_MEM_KIND'""")
    # API names, once per distinct string: the _v7000-style version suffix goes (Kineto's names have none)
    con.execute("""CREATE OR REPLACE TEMP TABLE _napiname AS
        SELECT s.id, regexp_replace(s.value, '_v\\d+$', '') AS name, s.value AS raw
        FROM _nstr s WHERE s.id IN (SELECT DISTINCT nameId FROM _napi)""")
    # event class: runtime / driver; 'CUDA backtrace' rows repeat a call already recorded
    con.execute("""CREATE OR REPLACE TEMP TABLE _nclass AS
        SELECT id, CASE WHEN name LIKE '%CUDABACKTRACE%' THEN 'skip' WHEN name LIKE '%CUDA_RUNTIME' THEN 'cuda_runtime'
                        WHEN name LIKE '%CUDA_DRIVER' THEN 'cuda_driver' END AS cat
        FROM _nenum WHERE enum = 'ENUM_NSYS_EVENT_CLASS'""")
    # NVTX ranges and marks, with their domain's name (the DomainCreate event of the same domainId)
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nnvtx0 AS
        WITH dom AS (
            SELECT n.domainId, any_value(coalesce(nullif(n.text, ''), s.value)) AS domain
            FROM _nv n LEFT JOIN _nstr s ON s.id = n.textId
            WHERE n.eventType IN {_etype(['NvtxDomainCreate'])} GROUP BY n.domainId
        )
        SELECT row_number() OVER () AS ord, r.rank, n.globalTid AS gtid,
               coalesce(nullif(n.text, ''), s.value, '') AS name, n.start + {b} AS start_ns,
               CASE WHEN n.eventType IN {_etype(NVTX_MARK_TYPES)} THEN n.start
                    ELSE greatest(n."end", n.start) END + {b} AS end_ns,
               n.eventType IN {_etype(NVTX_MARK_TYPES)} AS is_mark, dom.domain, n.category
        FROM _nv n JOIN _nrank r ON r.g = {_gpid('n.globalTid')}
        LEFT JOIN _nstr s ON s.id = n.textId
        LEFT JOIN dom ON dom.domainId = n.domainId AND n.domainId <> 0
        WHERE n.start IS NOT NULL AND (
              (n.eventType IN {_etype(NVTX_RANGE_TYPES)} AND n."end" IS NOT NULL)
              OR n.eventType IN {_etype(NVTX_MARK_TYPES)})""")
    # depth of a range on its thread: ranges open at its start (ties: the longer range is the outer one), the
    # rule host ops of a Kineto trace follow (ninefold.ingest.depths); marks have depth 0
    rng = con.sql("""SELECT ord, gtid, start_ns, end_ns FROM _nnvtx0 WHERE NOT is_mark
                     ORDER BY gtid, start_ns, end_ns DESC, ord""").to_arrow_table()
    depth = sorted_depths(*(to_numpy(rng.column(k)) for k in ("gtid", "start_ns", "end_ns")))
    con.register("_nvdepth", pa.table({"ord": rng.column("ord"), "depth": from_numpy(depth.astype(np.int32))}))
    try:
        con.execute("""CREATE OR REPLACE TEMP TABLE _nnvtx AS
            SELECT x.*, coalesce(d.depth, 0) AS depth, CAST(x.gtid % 16777216 AS VARCHAR) AS tid
            FROM _nnvtx0 x LEFT JOIN _nvdepth d ON d.ord = x.ord""")
    finally:
        con.unregister("_nvdepth")
    con.execute("DROP TABLE _nnvtx0")
    # open-range count per thread after each NVTX boundary: the depth of a CUDA call starting at t
    con.execute("""CREATE OR REPLACE TEMP TABLE _nopen AS
        SELECT DISTINCT gtid, t, sum(d) OVER (PARTITION BY gtid ORDER BY t RANGE UNBOUNDED PRECEDING) AS open
        FROM (SELECT gtid, start_ns AS t, 1 AS d FROM _nnvtx WHERE NOT is_mark
              UNION ALL SELECT gtid, end_ns, -1 FROM _nnvtx WHERE NOT is_mark)""")


def _insert_gpu(con, job: str, base: int) -> None:
    b = int(base)
    g = _gpid("coalesce(x.globalPid, 0)")
    # kernels: name and args are built once per distinct (name ids, launch configuration), then joined
    key = ["demangledName", "shortName", "mangledName", "name"]
    if con.execute("SELECT count(gridX) > 0 FROM _nk").fetchall()[0][0]:
        key += KERNEL_ARG_COLS
    args = "json_object('short name', ss.value)"
    if len(key) > 4:
        args = ("json_object('short name', ss.value, 'grid', [c.gridX, c.gridY, c.gridZ], "
                "'block', [c.blockX, c.blockY, c.blockZ], 'registers per thread', c.registersPerThread, "
                "'shared memory', c.staticSharedMemory + c.dynamicSharedMemory)")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _nkname AS
        SELECT c.*, coalesce(nullif(sd.value, ''), nullif(ss.value, ''), nullif(sm.value, ''), nullif(sn.value, ''),
                             CASE WHEN sn.id IS NULL THEN nullif(c.name, '') END, '<unnamed kernel>') AS kname,
               {args} AS args
        FROM (SELECT DISTINCT {", ".join(key)} FROM _nk) c
        LEFT JOIN _nstr sd ON sd.id = c.demangledName
        LEFT JOIN _nstr ss ON ss.id = c.shortName
        LEFT JOIN _nstr sm ON sm.id = c.mangledName
        LEFT JOIN _nstr sn ON sn.id = TRY_CAST(c.name AS BIGINT)""")
    on = " AND ".join(f"c.{k} IS NOT DISTINCT FROM x.{k}" for k in key)
    con.execute(f"""INSERT INTO gpu_ops
        SELECT ?, r.rank, CAST(x.deviceId AS INTEGER), x.streamId, 'kernel', c.kname,
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, x.correlationId, NULL, NULL, NULL,
               c.args
        FROM _nk x JOIN _nrank r ON r.g = {g}
        JOIN _nkname c ON {on}
        WHERE x.start IS NOT NULL""", [job])
    con.execute(f"""INSERT INTO gpu_ops
        SELECT ?, r.rank, CAST(x.deviceId AS INTEGER), x.streamId, 'memcpy',
               'Memcpy ' || coalesce(ck.kind, 'Unknown') || ' (' || coalesce(sk.label, '?') || ' -> '
                   || coalesce(dk.label, '?') || ')',
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, x.correlationId, NULL,
               ck.kind, x.bytes,
               json_object('copy kind', ck.label, 'src kind', sk.label, 'dst kind', dk.label,
                           'context', x.contextId, 'graph node', x.graphNodeId)
        FROM _nm x JOIN _nrank r ON r.g = {g}
        LEFT JOIN _nck ck ON ck.id = x.copyKind
        LEFT JOIN _nmk sk ON sk.id = x.srcKind
        LEFT JOIN _nmk dk ON dk.id = x.dstKind
        WHERE x.start IS NOT NULL""", [job])
    con.execute(f"""INSERT INTO gpu_ops
        SELECT ?, r.rank, CAST(x.deviceId AS INTEGER), x.streamId, 'memset', 'Memset (' || coalesce(mk.label, '?') || ')',
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, x.correlationId, NULL, NULL, x.bytes,
               json_object('mem kind', mk.label, 'value', x.value, 'context', x.contextId, 'graph node', x.graphNodeId)
        FROM _ns x JOIN _nrank r ON r.g = {g}
        LEFT JOIN _nmk mk ON mk.id = x.memKind
        WHERE x.start IS NOT NULL""", [job])
    # 0xFFFFFFFF is CUPTI's "none" for a sync record's stream and event
    con.execute(f"""INSERT INTO gpu_ops
        SELECT ?, r.rank, CAST(x.deviceId AS INTEGER), nullif(x.streamId, 4294967295), 'sync',
               coalesce(nullif({_lookup('ENUM_CUPTI_SYNC_TYPE', 'x.syncType')}, ''), 'Synchronization'),
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, x.correlationId, NULL, NULL, NULL,
               json_object('sync type', {_lookup('ENUM_CUPTI_SYNC_TYPE', 'x.syncType', 'name')},
                           'event', nullif(x.eventId, 4294967295), 'context', x.contextId)
        FROM _nsy x JOIN _nrank r ON r.g = {g}
        WHERE x.start IS NOT NULL""", [job])


def _call_depths(con, api: pa.Table, base: int) -> pa.Array:
    """Per CUDA call, the NVTX ranges open on its thread when it starts: the count after _nopen's last
    boundary at or before the start, 0 before the first. One searchsorted per thread with NVTX ranges
    (an ASOF join did the same, but sorted every call with all its columns: several times slower). Calls
    with a NULL thread or start get some number too; the insert drops them."""
    depth = np.zeros(api.num_rows, np.int64)
    bounds = con.sql("SELECT CAST(gtid AS BIGINT) AS gtid, CAST(t AS BIGINT) AS t, CAST(open AS BIGINT) AS open "
                     "FROM _nopen ORDER BY gtid, t").to_arrow_table()
    if bounds.num_rows and api.num_rows:
        bg, bt, bo = (to_numpy(bounds.column(c)) for c in ("gtid", "t", "open"))
        g, start = to_numpy(api.column("globalTid")), to_numpy(api.column("start")) + base
        threads, first = np.unique(bg, return_index=True)
        last = np.append(first[1:], len(bg))
        ti = np.minimum(np.searchsorted(threads, g), len(threads) - 1)
        mine = np.flatnonzero(threads[ti] == g)           # calls on a thread with NVTX ranges
        tm = ti[mine]
        # those calls grouped by thread (a stable radix sort when the thread index fits 16 bits)
        order = mine[np.argsort(tm.astype(np.uint16) if len(threads) <= 65536 else tm, kind="stable")]
        groups = np.split(order, np.cumsum(np.bincount(tm, minlength=len(threads)))[:-1])
        for i, rows in enumerate(groups):
            k = np.searchsorted(bt[first[i]:last[i]], start[rows], side="right")   # boundaries at or before
            depth[rows] = np.where(k > 0, bo[first[i] + np.maximum(k, 1) - 1], 0)
    return from_numpy(depth)


def _insert_host(con, job: str, base: int, apis: dict[str, pa.Table]) -> None:
    b = int(base)
    con.execute("""INSERT INTO host_ops
        SELECT ?, rank, CAST((gtid // 16777216) % 16777216 AS VARCHAR), tid, 'user_annotation', name, start_ns, end_ns,
               NULL, NULL, depth,
               CASE WHEN domain IS NOT NULL OR category IS NOT NULL
                    THEN json_object('domain', domain, 'category', category) END
        FROM _nnvtx WHERE NOT is_mark""", [job])
    # CUDA runtime/driver calls (APIS by category, registered as _napi_<cat>), each with its depth
    for cat, a in apis.items():
        con.register(f"_napi_{cat}", a.append_column("depth", _call_depths(con, a, b)))
    con.execute(f"""INSERT INTO host_ops
        SELECT ?, r.rank, CAST((x.globalTid // 16777216) % 16777216 AS VARCHAR),
               CAST(x.globalTid % 16777216 AS VARCHAR), coalesce(c.cat, x.cat),
               coalesce(n.name, nullif(x.name, ''), '<unnamed API>'),
               x.start + {b}, greatest(coalesce(x."end", x.start), x.start) + {b}, NULL, x.correlationId,
               CAST(x.depth AS INTEGER),
               CASE WHEN x.returnValue <> 0 THEN json_object('api', n.raw, 'return', x.returnValue) END
        FROM _napi x JOIN _nrank r ON r.g = {_gpid('x.globalTid')}
        LEFT JOIN _nclass c ON c.id = x.eventClass
        LEFT JOIN _napiname n ON n.id = x.nameId
        WHERE x.start IS NOT NULL AND c.cat IS DISTINCT FROM 'skip'""", [job])


def _insert_steps(con, job: str, pattern: str | None, n_groups: int | None) -> dict:
    """Steps per rank by the rules in the module doc; returns rank → [(diagnostic code, count, example)]."""
    done: dict = {}
    ranks = [r for (r,) in con.execute("SELECT rank FROM _nrank ORDER BY rank").fetchall()]

    def add(sql, code, what, params=()):
        todo = [r for r in ranks if r not in done]
        if not todo:
            return
        lst = ", ".join(str(r) for r in todo)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _nstep AS {sql.format(ranks=lst)}", list(params))
        for r, n, ex in con.execute("SELECT rank, count(*), min(ex) FROM _nstep GROUP BY rank").fetchall():
            done[r] = [(code, n, f"{what}: {ex}")]
        con.execute("INSERT INTO steps SELECT ?, rank, step, start_ns, end_ns FROM _nstep", [job])
        con.execute("DROP TABLE _nstep")

    def by_name(rx, numbered):
        if numbered:
            return """SELECT rank, TRY_CAST(regexp_extract(name, ?, 1) AS INTEGER) AS step, min(start_ns) AS start_ns,
                           max(end_ns) AS end_ns, min(name) AS ex
                       FROM _nnvtx WHERE NOT is_mark AND rank IN ({ranks}) AND regexp_matches(name, ?)
                       GROUP BY rank, step HAVING step IS NOT NULL""", [rx, rx]
        return """SELECT rank, CAST(row_number() OVER (PARTITION BY rank ORDER BY start_ns) - 1 AS INTEGER) AS step,
                       start_ns, end_ns, name AS ex
                   FROM _nnvtx WHERE NOT is_mark AND rank IN ({ranks}) AND regexp_matches(name, ?)""", [rx]

    def by_mark(rx, numbered):
        num = "TRY_CAST(regexp_extract(name, ?, 1) AS INTEGER)" if numbered else \
            "CAST(row_number() OVER (PARTITION BY rank ORDER BY start_ns) - 1 AS INTEGER)"
        return f"""WITH m AS (
                       SELECT rank, {num} AS step, min(start_ns) AS start_ns, min(name) AS ex FROM _nnvtx
                       WHERE is_mark AND rank IN ({{ranks}}) AND regexp_matches(name, ?) GROUP BY rank, step
                   ), last AS (
                       SELECT rank, max(end_ns) AS e FROM (SELECT rank, end_ns FROM _ngpu UNION ALL
                                                           SELECT rank, end_ns FROM _nhost) GROUP BY rank
                   )
                   SELECT m.rank, m.step, m.start_ns,
                          greatest(coalesce(lead(m.start_ns) OVER (PARTITION BY m.rank ORDER BY m.start_ns), last.e),
                                   m.start_ns) AS end_ns, m.ex
                   FROM m JOIN last USING (rank) WHERE m.step IS NOT NULL""", ([rx, rx] if numbered else [rx])

    sql, p = by_name(PROFILER_STEP, True)
    add(sql, "steps_from_profiler_step", "NVTX ProfilerStep#N ranges", p)
    pat = pattern if pattern is not None else STEP_PATTERN
    numbered = (n_groups if pattern is not None else 1) >= 1
    sql, p = by_name(pat, numbered)
    add(sql, "steps_from_step_pattern", f"NVTX ranges matching {pat!r}", p)
    for rx, nb in ((PROFILER_STEP, True), (pat, numbered)):
        sql, p = by_mark(rx, nb)
        add(sql, "steps_from_marks", f"NVTX marks matching {rx!r}", p)
    # the repeated outermost range enclosing GPU launches
    add("""WITH d AS (
               SELECT rank, gtid, tid, name, start_ns, end_ns FROM _nnvtx
               WHERE depth = 0 AND NOT is_mark AND rank IN ({ranks})
           ), launches AS (
               SELECT a.rank, a.tid, a.start_ns FROM _nhost a
               WHERE EXISTS (SELECT 1 FROM _ngpu g WHERE g.rank = a.rank AND g.correlation = a.correlation)
           ), occ AS (
               SELECT d.rank, d.gtid, d.name, d.start_ns, d.end_ns,
                      (SELECT count(*) FROM launches l WHERE l.rank = d.rank AND l.tid = d.tid
                       AND l.start_ns >= d.start_ns AND l.start_ns <= d.end_ns) AS n_launch
               FROM (SELECT DISTINCT * FROM d) d
           ), cand AS (
               SELECT rank, gtid, name, count(*) AS n, sum(n_launch) AS nl, min(start_ns) AS first FROM occ
               GROUP BY rank, gtid, name HAVING count(*) >= 2 AND min(n_launch) >= 1
           ), best AS (
               SELECT * FROM cand QUALIFY row_number() OVER (PARTITION BY rank ORDER BY n DESC, nl DESC, first) = 1
           )
           SELECT o.rank, CAST(row_number() OVER (PARTITION BY o.rank ORDER BY o.start_ns) - 1 AS INTEGER) AS step,
                  o.start_ns, o.end_ns, o.name AS ex
           FROM occ o JOIN best b ON b.rank = o.rank AND b.gtid = o.gtid AND b.name = o.name""",
        "steps_from_repeated_range", "repeated outermost NVTX range enclosing GPU launches")
    return done


def _insert_collectives(con, job: str) -> None:
    # every communication kernel (ninefold.analysis.classify); the collective: the one its name names
    # (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclKernel_AllReduce_RING_LL_Sum_float, DeepEP dispatch, ...), else
    # (NCCL's Generic kernel) the NCCL-domain NVTX range (ncclAllReduce, ...) enclosing the launch on the same thread
    from ninefold.analysis.classify import classify_kernel

    comm = {}
    for (n,) in con.execute("SELECT DISTINCT name FROM _ngpu WHERE kind = 'kernel' AND name IS NOT NULL").fetchall():
        fam, cls = classify_kernel(n)
        if fam == "comm":
            comm[n] = None if cls == "nccl_other" else cls
    if not comm:
        return
    names = sorted(comm)
    con.execute(r"""INSERT INTO collectives
        WITH c AS (SELECT unnest(?::VARCHAR[]) AS name, unnest(?::VARCHAR[]) AS coll),
        k AS (
            SELECT g.rank, g.name, g.start_ns, g.end_ns, g.correlation, c.coll
            FROM _ngpu g JOIN c ON c.name = g.name WHERE g.kind = 'kernel'
        ), nv AS (
            SELECT k.rank, k.correlation, k.start_ns,
                   min(lower(regexp_replace(n.name, '^nccl', ''))) AS coll
            FROM k JOIN _nhost a ON a.rank = k.rank AND a.correlation = k.correlation
            JOIN _nnvtx n ON n.rank = a.rank AND n.tid = a.tid AND NOT n.is_mark AND n.domain = 'NCCL'
                          AND a.start_ns BETWEEN n.start_ns AND n.end_ns
                          AND n.name NOT IN ('ncclGroupStart', 'ncclGroupEnd')
            WHERE k.coll IS NULL GROUP BY ALL
        )
        SELECT ?, k.rank, NULL, NULL, NULL, NULL, coalesce(k.coll, nv.coll, 'nccl_other'), NULL, NULL, NULL, NULL,
               NULL, k.start_ns, k.end_ns, k.name, NULL, 'kernel'
        FROM k LEFT JOIN nv ON nv.rank = k.rank AND nv.correlation = k.correlation AND nv.start_ns = k.start_ns
        ORDER BY k.rank, k.start_ns""", [names, [comm[n] for n in names], job])


def _device_names(con, src: _Src) -> dict[int, str]:
    """globalPid → the name of the GPU its first kernel ran on (TARGET_INFO_GPU)."""
    t = "TARGET_INFO_GPU"
    if not src.has(t, "name"):
        return {}
    key = "cuDevice" if src.has(t, "cuDevice") else ("id" if src.has(t, "id") else None)
    gpus = src.rows(f'SELECT {key or "NULL"}, name FROM {t}', t)
    by_id = {i: n for i, n in gpus}
    out = {}
    for g, d in con.execute("""SELECT r.g, min(x.device) FROM _nrank r JOIN _ngpu x ON x.rank = r.rank
                               GROUP BY r.g""").fetchall():
        out[g] = by_id.get(d) or (gpus[0][1] if gpus else None)
    return out


def _counts(con, job: str, rank: int) -> dict:
    k, m, s, y = con.execute("""SELECT count(*) FILTER (kind = 'kernel'), count(*) FILTER (kind = 'memcpy'),
                                count(*) FILTER (kind = 'memset'), count(*) FILTER (kind = 'sync')
                                FROM gpu_ops WHERE job = ? AND rank = ?""", [job, rank]).fetchall()[0]
    out = {"kernel": k, "memcpy": m, "memset": s, "sync": y}
    for t in ("host_ops", "steps", "collectives"):
        out[t] = con.execute(f"SELECT count(*) FROM {t} WHERE job = ? AND rank = ?", [job, rank]).fetchall()[0][0]
    return out


def _no_corr(con) -> dict:
    """rank → GPU activities (not syncs) with no CUDA call of the same correlation id; computed once."""
    rows = con.execute("""SELECT g.rank, count(*) FROM _ngpu g ANTI JOIN _nhost a
                          ON a.rank = g.rank AND a.correlation = g.correlation
                          WHERE g.kind <> 'sync' GROUP BY g.rank""").fetchall()
    return dict(rows)


def _rank_diags(con, job: str, rank: int, counts: dict, no_corr_by_rank: dict) -> list:
    out = []
    neg = con.execute(" UNION ALL ".join(
        f"SELECT '{k}' FROM {v} x JOIN _nrank r ON r.g = {_gpid('coalesce(x.globalPid, 0)')} "
        f'WHERE r.rank = {int(rank)} AND x."end" < x.start' for k, v in
        (("kernel", "_nk"), ("memcpy", "_nm"), ("memset", "_ns"), ("sync", "_nsy")))).fetchall()
    if neg:
        out.append(("nsys", "negative_duration", len(neg), f"{neg[0][0]} rows ending before they start "
                    "(end clamped to start)"))
    no_corr = no_corr_by_rank.get(rank, 0)
    if no_corr:
        out.append(("nsys", "gpu_op_without_correlation", no_corr, "GPU activity with no CUDA API call of the same "
                    "correlation id in its process"))
    marks = con.execute("SELECT count(*) FROM _nnvtx WHERE rank = ? AND is_mark", [rank]).fetchall()[0][0]
    if marks:
        out.append(("nsys", "nvtx_marks", marks, "NVTX marks are used as step markers only, not stored as host_ops"))
    if counts["collectives"]:
        out.append(("nsys", "collectives_without_group", counts["collectives"], "nsys records no process group or "
                    "sequence number: collectives cannot be matched across ranks"))
    return out


def _file_diags(con, counts_in: dict, meta: dict) -> list:
    out = []
    for v, what in (("_napi", "CUDA API calls"), ("_nv", "NVTX events")):
        gcol = "globalTid"
        n = con.execute(f"SELECT count(*) FROM {v} WHERE {gcol} IS NULL OR {_gpid(gcol)} NOT IN "
                        f"(SELECT g FROM _nrank)").fetchall()[0][0]
        if n:
            out.append(("nsys", "rows_outside_gpu_processes", n, f"{what} of processes without GPU work were not stored"))
    bt = con.execute("""SELECT count(*) FROM _napi a JOIN _nenum ec ON ec.enum = 'ENUM_NSYS_EVENT_CLASS'
                        AND ec.id = a.eventClass WHERE ec.name LIKE '%CUDABACKTRACE%'""").fetchall()[0][0]
    if bt:
        out.append(("nsys", "cuda_backtrace_rows", bt, "CUDA API rows of event class 'CUDA backtrace' repeat a call "
                    "already recorded; not stored"))
    shift = str(meta.get("EXPORT_PARAM_TIME_SHIFT") or meta.get("EXPORT_CONFIG_TIME_SHIFT") or "0")
    if shift not in ("0", ""):
        out.append(("nsys", "export_time_shift", 1, f"exported with a time shift of {shift} ns"))
    return out
