"""Collectives matched across ranks, and the clocks aligned by their completions.

A collective is keyed by (process group, sequence) where the trace has both; else by its order on the rank
within (process group, collective type). A collective ends at nearly the same instant on every member, so
per-rank clock offsets come from the completions; they are applied only across hosts or where they beat the
completion skew. Each member's wait is [own start, last member's aligned arrival).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ninefold.analysis.attribution.align_kernels import dense_rank_rows, distinct_members, group_max, group_min, group_order, group_spread
from ninefold.analysis.attribution.align_kernels import string_ranks
from ninefold.analysis.intervals import i64 as _i64
from ninefold.store.arrays import filled, from_numpy, strings, table, to_numpy
from ninefold.store.connection import append_arrow

P2P_COLLS = ("send", "recv", "sendrecv", "batch_isend_irecv")


@nb.njit(cache=True, nogil=True)
def _select(buf, k):
    """Reorder BUF so that buf[k] is its k-th smallest value, with nothing greater before it and nothing smaller
    after it (np.partition's contract for one k). Quickselect on a three-way split around the median of three, so
    runs of equal values cost no more than distinct ones; short ranges by insertion. A few plain loops: numba
    compiles them in a fraction of a second, where np.partition takes several."""
    lo, hi = 0, buf.size - 1
    while hi - lo > 16:
        a, b, c = buf[lo], buf[(lo + hi) // 2], buf[hi]
        p = max(min(a, b), min(max(a, b), c))
        lt, i, gt = lo, lo, hi
        while i <= gt:
            x = buf[i]
            if x < p:
                buf[i] = buf[lt]
                buf[lt] = x
                lt += 1
                i += 1
            elif x > p:
                buf[i] = buf[gt]
                buf[gt] = x
                gt -= 1
            else:
                i += 1
        if k < lt:
            hi = lt - 1
        elif k > gt:
            lo = gt + 1
        else:
            return
    for i in range(lo + 1, hi + 1):
        x = buf[i]
        j = i - 1
        while j >= lo and buf[j] > x:
            buf[j + 1] = buf[j]
            j -= 1
        buf[j + 1] = x


@nb.njit(cache=True, nogil=True)
def _group_medians(o, edges, v):
    """The median of v (float64) within each group of a group order (o, edges): the middle value, or the mean of
    the two middle values for an even count (np.median's); NaN where a group is empty."""
    out = np.full(edges.size - 1, np.nan)
    big = 0
    for k in range(edges.size - 1):
        big = max(big, edges[k + 1] - edges[k])
    buf = np.empty(big, np.float64)
    for k in range(edges.size - 1):
        a, n = edges[k], edges[k + 1] - edges[k]
        if n == 0:
            continue
        b = buf[:n]
        for j in range(n):
            b[j] = v[o[a + j]]
        m = n // 2
        _select(b, m)
        hi = b[m]
        lo = hi
        if n % 2 == 0:      # the largest of the lower half
            lo = b[0]
            for j in range(1, m):
                lo = max(lo, b[j])
        out[k] = (lo + hi) / 2
    return out


ORDER_MATCH_TOL_NS = 1_000_000  # members of one collective complete within this of each other (aligned clocks)
SKEW_NS = 10_000  # completion skew of one collective across members: offsets below it are not evidence


@nb.njit(cache=True, nogil=True)
def _estimate_offsets(gm, rm_, em, G, R):
    """Per-rank clock offset (relative to rank index 0), residual and count from matched completions: offset_r
    = median over its collectives of (end_r − median end of the collective), refined once; the residual is the
    median |deviation| after removal. gm: collective index, rm_: rank index, em: end of each member."""
    oc, _, ec = group_order(gm, G)
    orr, n_m, er_ = group_order(rm_, R)
    off = np.zeros(R, np.int64)
    n = em.size
    # in float64 (exact below 2^53 ns, times being relative to the first collective end; beyond, each median is
    # that of the rounded values, which is the rounded median: rounding keeps the order)
    adj = np.empty(n, np.float64)
    dev = np.empty(n, np.float64)
    for _ in range(2):  # refine once with the offsets found
        for i in range(n):
            adj[i] = em[i] - off[rm_[i]]
        mc = _group_medians(oc, ec, adj)
        for i in range(n):
            dev[i] = adj[i] - mc[gm[i]]
        d = _group_medians(orr, er_, dev)
        for r in range(R):
            if not np.isnan(d[r]):
                off[r] += np.int64(np.trunc(d[r]))
        off -= off[0]
    for i in range(n):
        adj[i] = em[i] - off[rm_[i]]
    mc = _group_medians(oc, ec, adj)
    for i in range(n):
        dev[i] = np.abs(adj[i] - mc[gm[i]])
    med = _group_medians(orr, er_, dev)
    resid = np.zeros(R, np.int64)
    for r in range(R):
        if not np.isnan(med[r]):
            resid[r] = np.int64(np.trunc(med[r]))
    return off, resid, n_m


def _decide_offsets(est, resid, n_m, hosts, ranks_a):
    """Which estimated offsets to apply, and why. Ranks on one host share a clock (offset 0); elsewhere an
    offset is applied only when it beats the completion skew and the residual (3x)."""
    R = est.size
    off = np.zeros(R, dtype=np.int64)
    applied = np.zeros(R, dtype=bool)
    reasons = []
    for i in range(R):
        if i == 0:
            reasons.append("reference clock")
        elif hosts[i] >= 0 and hosts[i] == hosts[0]:
            reasons.append(f"same host as rank {int(ranks_a[0])}: one clock")
        elif n_m[i] == 0:
            reasons.append("no matched collective")
        elif abs(int(est[i])) <= max(3 * int(resid[i]), SKEW_NS):
            reasons.append(f"estimate {int(est[i])} ns within the completion skew (residual {int(resid[i])} ns, "
                           f"{int(n_m[i])} matched)")
        else:
            applied[i] = True
            off[i] = est[i]
            where = "another host" if hosts[i] >= 0 else "host unknown"
            reasons.append(f"{where}; estimate beats the residual {int(resid[i])} ns ({int(n_m[i])} matched)")
    return off, applied, reasons


def _store_matches(con, job, cols):
    """collective_matches rows; pg_name and coll come as Arrow string arrays (NULL = none), never as objects."""
    seq, ordn = cols["seq"], cols["ord"]
    t = dict(cols)
    t["seq"] = from_numpy(seq, mask=seq < 0)
    t["ord"] = from_numpy(ordn, mask=ordn < 0)
    append_arrow(con, "collective_matches", table(t), job)


def align(con, job, ranks, host_codes=None):
    """Per-rank clock offsets from matched collective completions, and per-collective arrival info.

    A collective ends at nearly the same instant on every member, so offset_r = median over matched
    collectives of (end_r − median end of that collective), refined once. Residual = median |deviation|
    after removal. Times are taken relative to the job's first collective end so the medians are exact.
    Returns offsets {rank: ns}, wait intervals {"straggler"|"bubble": (rank, start, end)} in each rank's own
    clock ([own start, last member's arrival)), and (rank, start) of every collective kernel with its peers.
    """
    # A collective is keyed by (process group, sequence) where the trace has both; else by its order on the
    # rank within (process group, collective type) — also for comm kernels no collective row describes (traces
    # without record_param_comms), typed by their kernel name. Send/recv is never paired by order: a stage's
    # n-th transfer is not its neighbours' n-th.
    by_seq = con.sql(f"""
        SELECT rank, start_ns, end_ns, coalesce(group_size, 0) AS gsz, lower(coll) IN {P2P_COLLS} AS p2p,
               nullif(pg_name, '') AS pg_name, nullif(lower(coll), '') AS coll, seq, -1::BIGINT AS ord
        FROM collectives WHERE job = ? AND source = 'kernel' AND seq IS NOT NULL AND pg_name IS NOT NULL""",
                     params=[job]).to_arrow_table()
    by_order = con.sql(f"""
        WITH u AS (
            SELECT rank, start_ns, end_ns, coalesce(group_size, 0) AS gsz, pg_name, lower(coll) AS coll, false AS p2p
            FROM collectives WHERE job = ? AND source = 'kernel' AND (seq IS NULL OR pg_name IS NULL)
                AND lower(coll) NOT IN {P2P_COLLS}
            UNION ALL
            SELECT g.rank, g.start_ns, g.end_ns, 0, NULL, k.cls, false
            FROM gpu_ops g JOIN _kclass k ON k.name = g.name AND k.fam = 1 AND NOT k.p2p
            WHERE g.job = ? AND g.kind = 'kernel' AND NOT EXISTS (
                SELECT 1 FROM collectives x WHERE x.job = g.job AND x.rank = g.rank AND x.start_ns = g.start_ns
                AND x.source = 'kernel')
        ), o AS (
            SELECT *, row_number() OVER (PARTITION BY rank, coalesce(pg_name, ''), coll ORDER BY start_ns, end_ns)
                AS ord FROM u
        )
        SELECT rank, start_ns, end_ns, gsz, p2p, dense_rank() OVER (ORDER BY coalesce(pg_name, ''), coll, ord) - 1 AS gid,
               nullif(pg_name, '') AS pg_name, nullif(coll, '') AS coll, -1::BIGINT AS seq, ord
        FROM o""", params=[job, job]).to_arrow_table()
    import pyarrow as pa

    def col(t, k):  # a NULL reads as 0 / false
        return filled(t.column(k))

    # gid = dense_rank() OVER (ORDER BY pg_name, seq, p2p) − 1: pg_name in byte order ('' for the NULL of
    # nullif), p2p false < true < NULL (no coll)
    p2p_a = by_seq.column("p2p")
    p2p3 = np.where(to_numpy(p2p_a.is_null()), 2, col(by_seq, "p2p").astype(np.int64))
    seq_gid = dense_rank_rows([string_ranks(by_seq.column("pg_name")), col(by_seq, "seq"), p2p3])
    g0 = int(seq_gid.max()) + 1 if by_seq.num_rows else 0
    c = {k: np.concatenate([seq_gid if k == "gid" else col(by_seq, k),
                            col(by_order, k) + g0 if k == "gid" else col(by_order, k)])
         for k in ("rank", "start_ns", "end_ns", "gsz", "p2p", "gid", "seq", "ord")}
    strs = {k: pa.concat_arrays([a for t in (by_seq, by_order) for a in t.column(k).cast(pa.string()).chunks] or
                                [strings([])]) for k in ("pg_name", "coll")}
    ranks_a = _i64(ranks)
    R = ranks_a.size
    off = np.zeros(R, dtype=np.int64)
    resid = np.zeros(R, dtype=np.int64)
    n_m = np.zeros(R, dtype=np.int64)
    ri = np.searchsorted(ranks_a, _i64(c["rank"]))
    s, e = _i64(c["start_ns"]), _i64(c["end_ns"])
    gid = _i64(c["gid"])
    G = int(gid.max()) + 1 if gid.size else 0
    waits = {k: (empty, empty, empty) for k in ("straggler", "bubble") for empty in [np.zeros(0, np.int64)]}
    matched_keys = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    est = np.zeros(R, dtype=np.int64)
    applied = np.zeros(R, dtype=bool)
    reasons = ["no matched collective"] * R
    rejected = 0
    if G:
        t0 = int(e.min())
        er, sr = e - t0, s - t0
        # distinct member ranks per collective
        go, _, gedges = group_order(gid, G)
        present = distinct_members(go, gedges, ri, R)
        ok = present >= 2  # matched: at least two ranks saw it
        hosts = _i64(host_codes) if host_codes is not None else np.full(R, -1, dtype=np.int64)
        for _ in range(2):
            # offsets from the collectives whose members agree; then drop order matches whose members' ends
            # disagree by more than any completion skew (a peer missing from the trace shifts the order)
            m = ok[gid]
            est[:] = 0
            resid[:] = 0
            n_m[:] = 0
            if m.any():
                est, resid, n_m = _estimate_offsets(gid[m], ri[m], er[m], G, R)
            off, applied, reasons = _decide_offsets(est, resid, n_m, hosts, ranks_a)
            adj = er - off[ri]
            hi_, lo_ = group_spread(gid, adj, G)
            agree = (present >= 2) & (hi_ - lo_ <= ORDER_MATCH_TOL_NS)
            if np.array_equal(agree, ok):  # nothing dropped: a second round would repeat this one
                break
            ok = agree
        rejected = int(((present >= 2) & ~ok)[gid].sum())
        p2p = np.asarray(c["p2p"], dtype=bool)
        gp2p = np.zeros(G, dtype=bool)
        gp2p[gid] = p2p
        need = group_max(gid, _i64(c["gsz"]), G, 0)
        need = np.where(gp2p, 2, np.maximum(need, 2))
        acc = ((present >= need) & ok)[gid]
        last = group_max(gid, sr - off[ri], G, np.iinfo(np.int64).min)
        w_end = np.minimum(er, last[gid] + off[ri]) + t0
        w = acc & (w_end > s)
        for kind, sel in (("straggler", w & ~p2p), ("bubble", w & p2p)):
            waits[kind] = (ranks_a[ri[sel]], s[sel], w_end[sel])
        matched_keys = (ranks_a[ri[acc]], s[acc])
        dur = e - s
        mind = group_min(gid, np.where(acc, dur, np.iinfo(np.int64).max), G, np.iinfo(np.int64).max)
        _store_matches(con, job, {
            "rank": ranks_a[ri].astype(np.int32), "gid": gid, "pg_name": strs["pg_name"],
            "coll": strs["coll"], "seq": _i64(c["seq"]), "ord": _i64(c["ord"]),
            "start_ns": s, "end_ns": e, "arrival_ns": s - off[ri], "last_arrival_ns": last[gid] + t0,
            "n_members": present[gid].astype(np.int32), "p2p": p2p, "matched": acc,
            "min_member_ns": np.where(acc, mind[gid], dur)})
    con.execute("DELETE FROM clock_offsets WHERE job = ?", [job])
    con.execute("INSERT INTO clock_offsets (job, rank, offset_ns, residual_ns, n_matched, estimate_ns, applied, "
                "reason) SELECT ?, unnest(?::INTEGER[]), unnest(?::BIGINT[]), unnest(?::BIGINT[]), "
                "unnest(?::INTEGER[]), unnest(?::BIGINT[]), unnest(?::BOOLEAN[]), unnest(?::VARCHAR[])",
                [job, ranks_a.tolist(), off.tolist(), resid.tolist(), n_m.tolist(), est.tolist(),
                 applied.tolist(), reasons])
    if rejected:
        con.execute("INSERT INTO diagnostics VALUES (?, NULL, 'attribution', 'order_match_rejected', ?, ?)",
                    [job, rejected, "collectives without sequence numbers matched by order whose members' ends "
                     f"disagree by more than {ORDER_MATCH_TOL_NS // 1000} us (a peer is missing from the trace); "
                     "left unmatched"])
    return {int(r): int(o) for r, o in zip(ranks_a, off)}, waits, matched_keys
