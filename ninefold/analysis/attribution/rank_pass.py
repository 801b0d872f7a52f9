"""The per-rank phase of attribution: read a group of ranks' ops as plain column scans, join and sort each rank
(ninefold.analysis.attribution.core.prepare_rank), mark recomputation, and sweep each rank's windows (ninefold.analysis.attribution.core.sweep_rank),
ranks in parallel threads. Cross-rank facts (waits, matched collectives) come in from ninefold.analysis.attribution.alignment.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numba as nb
import numpy as np
import pyarrow as pa

from ninefold.analysis.attribution.alignment import P2P_COLLS
from ninefold.analysis.attribution.core import NL, collective_keys, prepare_rank, sweep_rank
from ninefold.analysis.intervals import covered, i64 as _i64, union
from ninefold.store.arrays import batch, filled, to_numpy, values

GROUP_OPS = 1_000_000  # ops read and swept at once: bounds the working memory (~200 B per op of the group)
# ledger_segments' columns after job, as sweep_group hands them over
INTERVAL_SCHEMA = pa.schema([("rank", pa.int32()), ("step", pa.int32()), ("ledger_code", pa.uint8()),
                             ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("op_code", pa.int32()),
                             ("pg_code", pa.int32()), ("seq", pa.int64())])

# Recompute = the forward re-run inside backward, decided by where a kernel was launched (same thread): inside a
# non-reentrant checkpoint's recompute_fn frame, or inside a reentrant CheckpointFunctionBackward before its inner
# backward starts. ('CheckpointFunction' itself is the original forward, not a recomputation.)
RECOMPUTE_HOST = "name LIKE '%recompute_fn%'"
REENTRANT_HOST = "name LIKE '%CheckpointFunctionBackward%'"
IO_HOST = ("name LIKE 'enumerate(DataLoader)%' OR name LIKE '%DataLoader%__next__%' OR name IN "
           "('torch.load', 'torch.save', 'aten::save', 'aten::load') OR name LIKE '%checkpoint_save%' "
           "OR name LIKE '%save_checkpoint%'")
# autograd nodes; inside a reentrant checkpoint node, a nested one is the layer's real backward, not recompute
NESTED_BACKWARD = ("name LIKE 'autograd::engine::evaluate_function:%' "
                   "AND name NOT LIKE '%CheckpointFunctionBackward%'")


def rank_groups(con, job: str, max_ops: int = GROUP_OPS) -> list[tuple[int, int]]:
    """Consecutive ranks [lo, hi] of JOB's GPU ops, no group over MAX_OPS ops unless one rank alone is."""
    counts = con.execute("SELECT rank, count(*) FROM gpu_ops WHERE job = ? AND kind IN ('kernel', 'memcpy', "
                         "'memset') GROUP BY rank ORDER BY rank", [job]).fetchall()
    groups, lo, n, prev = [], None, 0, None
    for r, c in counts:
        if lo is not None and n + c > max_ops:
            groups.append((lo, prev))
            lo, n = None, 0
        if lo is None:
            lo = r
        n += c
        prev = r
    if lo is not None:
        groups.append((lo, prev))
    return groups


def _bounds(rank, ranks):
    """rank sorted; the [a, b) slice of each of RANKS."""
    return np.searchsorted(rank, ranks, side="left"), np.searchsorted(rank, ranks, side="right")


def _by_rank(rank):
    """The stable order of RANK (None when already in order: no sort) and RANK in it; a radix sort on 16 bits."""
    rank = _i64(rank)
    if rank.size < 2 or bool(np.all(rank[1:] >= rank[:-1])):
        return None, rank
    lo = int(rank.min())
    key = rank - lo if int(rank.max()) - lo < 65536 else rank
    o = np.argsort(key.astype(np.uint16) if key is not rank else key, kind="stable")
    return o, rank[o]


def _runs(sorted_ranks):
    """The distinct values of a sorted array (np.unique without its sort)."""
    a = np.asarray(sorted_ranks)
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if a.size else a


def _take(a, order):
    """A in ORDER (_by_rank's); A itself, uncopied, where ORDER is None (rows already in rank order)."""
    a = np.asarray(a)
    return a if order is None else a[order]


def _fetch(con, sql, params) -> dict:
    """The columns of SQL's result as numpy arrays, through Arrow (no masked arrays; a NULL-free column is not
    copied again)."""
    t = con.sql(sql, params=params).to_arrow_table()
    return {k: values(t.column(k)) for k in t.column_names}


def _buffer(bufs, key, n, dtype):
    """N slots of BUFS[KEY], an array kept from one group of ranks to the next (grown when a group is larger):
    fresh memory for every group costs its page faults again, as much as the sort that fills it."""
    if bufs is None:
        return np.empty(n, dtype)
    a = bufs.get(key)
    if a is None or a.size < n:
        a = bufs[key] = np.empty(n, dtype)
    return a[:n]


def read_group(con, job, lo, hi, fam_of, p2p_of, threads, bufs=None):
    """The ops of ranks LO..HI as one sorted table (rank, then prepare_rank's order): rank, fam, p2p, start_ns,
    end_ns, launch_ns, kid, pgid, seq, lth. BUFS (a dict, kept by the caller over its groups) holds the sorted
    columns: they are views into it, valid until the next read_group with the same BUFS."""
    g = _fetch(con, """
        SELECT g.rank, g.start_ns, g.end_ns, coalesce(g.correlation, 0) AS corr, g.correlation IS NOT NULL AS hc,
               coalesce(g.stream, 9223372036854775807) AS stream,
               (CASE g.kind WHEN 'kernel' THEN 0 WHEN 'memcpy' THEN 1 ELSE 2 END)::TINYINT AS kind,
               coalesce(c.kid, -1)::BIGINT AS kid
        FROM gpu_ops g LEFT JOIN _kclass c ON c.name = g.name
        WHERE g.job = ? AND g.rank BETWEEN ? AND ? AND g.kind IN ('kernel', 'memcpy', 'memset')""",
                    [job, lo, hi])
    h = _fetch(con, """
        SELECT rank, correlation, start_ns, (hash(pid, tid) >> 1)::BIGINT AS th FROM host_ops
        WHERE job = ? AND rank BETWEEN ? AND ? AND cat IN ('cuda_runtime', 'cuda_driver')
              AND correlation IS NOT NULL""", [job, lo, hi])
    # one collective key per comm kernel (rank, start, kernel): a batched send/recv kernel carries several; the
    # drill-down names the one of lowest (seq, group); p2p unless the collective it carries is not (all-to-all)
    ck = con.sql(f"""
        SELECT k.rank, k.start_ns, c.kid::BIGINT AS kid, coalesce(p.pgid, -1)::BIGINT AS pgid, k.seq,
               coalesce((lower(k.coll) IN {P2P_COLLS})::TINYINT, -1)::TINYINT AS p2p
        FROM collectives k JOIN _kclass c ON c.name = k.kernel_name LEFT JOIN _pgs p ON p.pg_name = k.pg_name
        WHERE k.job = ? AND k.rank BETWEEN ? AND ? AND k.source = 'kernel'""", params=[job, lo, hi]).to_arrow_table()
    seq = ck.column("seq")
    crank, *ccols = collective_keys(_i64(values(ck.column("rank"))), _i64(values(ck.column("start_ns"))),
                                    _i64(values(ck.column("kid"))), _i64(values(ck.column("pgid"))),
                                    _i64(filled(seq)), ~to_numpy(seq.is_null()),
                                    values(ck.column("p2p")))
    go, grank = _by_rank(g["rank"])
    ranks = _runs(grank)
    cols = {k: _take(g[k], go) for k in ("start_ns", "end_ns", "corr", "hc", "stream", "kind", "kid")}
    ho, hrank = _by_rank(h["rank"])
    hcols = [_take(np.asarray(h[k], dtype=np.int64), ho) for k in ("correlation", "start_ns", "th")]
    ga, gb = _bounds(grank, ranks)
    ha, hb = _bounds(hrank, ranks)
    ca, cb = _bounds(crank, ranks)
    start, end = _i64(cols["start_ns"]), _i64(cols["end_ns"])
    corr, hc = _i64(cols["corr"]), np.asarray(cols["hc"], dtype=bool)
    stream, kind, kid = _i64(cols["stream"]), np.asarray(cols["kind"], dtype=np.int8), _i64(cols["kid"])
    n = start.size
    res = {"rank": grank.astype(np.int32)}
    for k, dt in (("start_ns", np.int64), ("end_ns", np.int64), ("kid", np.int64), ("launch_ns", np.int64),
                  ("lth", np.int64), ("fam", np.int8), ("p2p", np.bool_), ("pgid", np.int64), ("seq", np.int64)):
        res[k] = _buffer(bufs, k, n, dt)
    outs = [res[k] for k in ("start_ns", "end_ns", "kid", "launch_ns", "lth", "fam", "p2p", "pgid", "seq")]

    def one(i):
        a, b = ga[i], gb[i]
        x, y = ha[i], hb[i]
        u, v = ca[i], cb[i]
        prepare_rank(start[a:b], end[a:b], corr[a:b], hc[a:b], stream[a:b], kind[a:b], kid[a:b], fam_of, p2p_of,
                     *(c[x:y] for c in hcols), *(c[u:v] for c in ccols), tuple(c[a:b] for c in outs))

    _map(one, range(ranks.size), threads)
    return res


def _map(f, items, threads):
    items = list(items)
    if threads < 2 or len(items) < 2:
        return [f(i) for i in items]
    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(f, items))


def recomputed(con, job, allops, pattern=None):
    """Per op: launched (on its launching thread) inside a recompute region. Regions: non-reentrant recompute_fn
    frames, whole; a reentrant CheckpointFunctionBackward (or a region of the user's pattern) up to the start of
    the first autograd node nested in it on the same thread (its inner backward)."""
    op_rank = _i64(allops["rank"])
    out = np.zeros(op_rank.size, dtype=bool)
    if op_rank.size == 0:
        return out
    extra = " OR regexp_matches(name, ?)" if pattern is not None else ""
    lo, hi = int(op_rank[0]), int(op_rank[-1])
    reg = con.execute(f"""
        WITH rc AS (
            -- a user's region is read like a reentrant checkpoint: up to the autograd node nested in it
            SELECT rank, pid, tid, start_ns, end_ns, NOT ({RECOMPUTE_HOST}) AS reentrant FROM host_ops
            WHERE job = ? AND rank BETWEEN ? AND ? AND ({RECOMPUTE_HOST} OR {REENTRANT_HOST}{extra})
        ), nb AS (
            SELECT rank, pid, tid, start_ns FROM host_ops WHERE job = ? AND {NESTED_BACKWARD}
                AND (rank, pid, tid) IN (SELECT (rank, pid, tid) FROM rc WHERE reentrant)
        )
        SELECT rc.rank, (hash(rc.pid, rc.tid) >> 1)::BIGINT AS th, rc.start_ns,
               CASE WHEN rc.reentrant THEN least(rc.end_ns, coalesce(min(nb.start_ns), rc.end_ns))
                    ELSE rc.end_ns END AS end_ns
        FROM rc LEFT JOIN nb ON rc.reentrant AND nb.rank = rc.rank AND nb.pid = rc.pid AND nb.tid = rc.tid
                            AND nb.start_ns > rc.start_ns AND nb.start_ns < rc.end_ns
        GROUP BY rc.rank, rc.pid, rc.tid, rc.start_ns, rc.end_ns, rc.reentrant
        ORDER BY 1, 2""", [job, lo, hi] + ([pattern] if pattern is not None else []) + [job]).fetchnumpy()
    if len(reg["rank"]) == 0:
        return out
    rr, rth = _i64(reg["rank"]), _i64(reg["th"])
    rs, re_ = _i64(reg["start_ns"]), _i64(reg["end_ns"])
    lth, vl = _i64(allops["lth"]), _i64(allops["launch_ns"])
    key = np.concatenate(([True], (rr[1:] != rr[:-1]) | (rth[1:] != rth[:-1])))
    bounds = np.append(np.flatnonzero(key), rr.size)
    for a, b in zip(bounds[:-1], bounds[1:]):  # one pass per (rank, thread) that has regions
        lo, hi = np.searchsorted(op_rank, [rr[a], rr[a] + 1])
        sel = np.flatnonzero(lth[lo:hi] == rth[a]) + lo
        if sel.size:
            out[sel] = covered(vl[sel], *union(rs[a:b], re_[a:b]))
    return out


def io_regions(con, job, lo, hi, pattern=None):
    """(rank, start, end) of the host's data-loading / storage regions of ranks LO..HI, sorted by rank."""
    extra = " OR regexp_matches(name, ?)" if pattern is not None else ""
    h = con.execute(f"SELECT rank, start_ns, end_ns FROM host_ops WHERE job = ? AND rank BETWEEN ? AND ? "
                    f"AND ({IO_HOST}{extra}) ORDER BY rank",
                    [job, lo, hi] + ([pattern] if pattern is not None else [])).fetchnumpy()
    return _i64(h["rank"]), _i64(h["start_ns"]), _i64(h["end_ns"])


@nb.njit(cache=True, nogil=True)
def _op_keys(o_op, base, kid, pgid, seq):
    """The kernel (int32), process group (int32) and sequence of each interval's op (index O_OP within the rank,
    whose ops start at BASE; -1 = none), -1 where it has no op (and for a sequence below -1)."""
    n = o_op.size
    k, p, q = np.full(n, -1, np.int32), np.full(n, -1, np.int32), np.full(n, -1, np.int64)
    for j in range(n):
        if o_op[j] >= 0:
            g = o_op[j] + base
            k[j], p[j], q[j] = kid[g], pgid[g], max(seq[g], -1)
    return k, p, q


def sweep_group(allops, io, steps, waits, matched_keys, threads):
    """sweep_rank over every rank of ALLOPS (sorted by rank as read_group leaves it); results joined in rank
    order: windows (win_rank, win_step, w0, w1, totals [window, ledger]), the coalesced intervals as an Arrow
    table of INTERVAL_SCHEMA (one batch per rank; -1 = none) and the count of comm kernels with no peer."""
    op_rank = _i64(allops["rank"])
    ranks = _runs(op_rank)  # sorted by rank, as read_group leaves it
    oa, ob = _bounds(op_rank, ranks)
    s, e, launch = allops["start_ns"], allops["end_ns"], allops["launch_ns"]
    fam, re_, p2p = allops["fam"], allops["re"], allops["p2p"]

    def per_rank(rank_arr, *cols):
        o, r = _by_rank(rank_arr)
        a, b = _bounds(r, ranks)
        return a, b, [_take(_i64(c), o) for c in cols]
    ia, ib, (io_s, io_e) = per_rank(io[0], io[1], io[2])
    sa, sb, (st_s, st_e, st_id) = per_rank(steps["rank"], steps["start_ns"], steps["end_ns"], steps["step"])
    wsa, wsb, (ws_s, ws_e) = per_rank(waits["straggler"][0], waits["straggler"][1], waits["straggler"][2])
    wba, wbb, (wb_s, wb_e) = per_rank(waits["bubble"][0], waits["bubble"][1], waits["bubble"][2])
    mo = np.lexsort((_i64(matched_keys[1]), _i64(matched_keys[0])))
    mr, ms = _i64(matched_keys[0])[mo], _i64(matched_keys[1])[mo]
    ma, mb = _bounds(mr, ranks)

    def one(i):
        a, b = oa[i], ob[i]
        return sweep_rank(s[a:b], e[a:b], launch[a:b], fam[a:b], re_[a:b], p2p[a:b],
                          io_s[ia[i]:ib[i]], io_e[ia[i]:ib[i]], ws_s[wsa[i]:wsb[i]], ws_e[wsa[i]:wsb[i]],
                          wb_s[wba[i]:wbb[i]], wb_e[wba[i]:wbb[i]], st_s[sa[i]:sb[i]], st_e[sa[i]:sb[i]],
                          st_id[sa[i]:sb[i]], ms[ma[i]:mb[i]])

    outs = _map(one, range(ranks.size), threads)
    kid, pgid, seq = allops["kid"], allops["pgid"], allops["seq"]
    win = {k: [] for k in ("win_rank", "win_step", "w0", "w1", "totals")}
    batches = []  # one Arrow batch per rank over the sweep's own arrays: no copy into one long column
    unmatched = 0
    for i, (w0, w1, wid, tot, o_s, o_e, o_l, o_op, o_w, unm) in enumerate(outs):
        unmatched += unm
        r = int(ranks[i])
        win["win_rank"].append(np.full(w0.size, r, np.int32))
        win["win_step"].append(wid.astype(np.int32))
        win["w0"].append(w0)
        win["w1"].append(w1)
        win["totals"].append(tot)
        k, p, q = _op_keys(o_op, oa[i], kid, pgid, seq)
        batches.append(batch([np.full(o_s.size, r, np.int32), wid[o_w].astype(np.int32),
                              o_l.view(np.uint8), o_s, o_e, k, p, q], INTERVAL_SCHEMA))
    dt = {"win_rank": np.int32, "win_step": np.int32}
    res = {"unmatched": unmatched, "intervals": pa.Table.from_batches(batches, schema=INTERVAL_SCHEMA)}
    for k, v in win.items():
        res[k] = np.concatenate(v) if v else np.zeros((0, NL) if k == "totals" else 0, dt.get(k, np.int64))
    return res
