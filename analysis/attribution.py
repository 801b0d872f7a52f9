"""Charge every nanosecond of every rank's step windows to exactly one of the nine ledgers.

Precedence (LEDGERS contract): compute/recompute > communication (straggler | bubble | exposed_comm) >
memcpy > the idle gap's cause (io > bubble > host > idle). The sweep is vectorised with numpy: every rank of
the job is laid on one shared time axis, cut at every interval boundary and step-window bound into elementary
segments, each labelled by running sums over boundary marks (_sweep). Collectives are matched across ranks
by (process group, sequence), else by order, and per-rank clock offsets come from their completions (_align).
"""
from __future__ import annotations

import numpy as np

from analysis.classify import classify_kernel
from analysis.intervals import covered, union
from analysis.ledgers import LEDGER_ID, LEDGERS

DDL = {
    # drill-down keys: the GPU op that the interval is charged to (for an idle/host/io/bubble gap, the op
    # that ends the gap), and for communication the collective's process group and sequence number
    "ledger_intervals": """job VARCHAR, rank INTEGER, step INTEGER, ledger VARCHAR, start_ns BIGINT, end_ns BIGINT,
                           op_name VARCHAR, pg_name VARCHAR, seq BIGINT""",
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
# algorithm, protocol and channels.
def drilldown_sql(nccl: bool = True) -> str:
    """The SELECT behind ledger_drilldown (queries embed it, so a store written by an older version, whose view
    lacks a column, still answers). NCCL=False leaves out the NCCL log columns (as NULL)."""
    sql = """
    SELECT li.*, kc.kclass, c.coll, c.bytes, c.group_size, pa.axis, nl.algorithm, nl.protocol, nl.n_channels,
           CASE WHEN li.op_name LIKE 'Memcpy %' THEN nullif(regexp_extract(li.op_name, 'Memcpy (\\w+)', 1), '')
           END AS copy_kind
    FROM ledger_intervals li
    LEFT JOIN kernel_classes kc ON kc.job = li.job AND kc.name = li.op_name
    LEFT JOIN (SELECT job, rank, pg_name, seq, min(lower(coll)) AS coll, max(bytes) AS bytes,
                      max(group_size) AS group_size
               FROM collectives WHERE seq IS NOT NULL GROUP BY ALL) c
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
P2P_COLLS = ("send", "recv", "sendrecv", "batch_isend_irecv")


def _ensure_tables(con):
    for t, cols in DDL.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({cols})")
    for col, typ in (("op_name", "VARCHAR"), ("pg_name", "VARCHAR"), ("seq", "BIGINT")):
        con.execute(f"ALTER TABLE ledger_intervals ADD COLUMN IF NOT EXISTS {col} {typ}")
    for col, typ in (("estimate_ns", "BIGINT"), ("applied", "BOOLEAN"), ("reason", "VARCHAR")):
        con.execute(f"ALTER TABLE clock_offsets ADD COLUMN IF NOT EXISTS {col} {typ}")
    con.execute(DRILLDOWN_VIEW)


def _store_keys(con, job: str, knames: list, rules: list) -> None:
    """kernel_classes and pg_axes rows of JOB (small: one per distinct kernel name and process group)."""
    from analysis.classify import RULES_VERSION
    from analysis.cost_model.infer import process_groups

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


def _cover_index(fs, fe):
    """For ops sorted by start (fs, fe): (running max end, index of the op holding it)."""
    if fs.size == 0:
        return fe, np.zeros(0, dtype=np.int64)
    runmax = np.maximum.accumulate(fe)
    holder = np.maximum.accumulate(np.where(fe >= runmax, np.arange(fe.size), 0))
    return runmax, holder


I64_MAX = np.iinfo(np.int64).max
I64_MIN = np.iinfo(np.int64).min
GUARD_NS = 1_000_000  # empty stretch of the shared time axis between two ranks: no interval bridges it


def _i64(a):
    return np.asarray(a, dtype=np.int64)


def _sweep(allops, hosts, steps, waits, matched_keys) -> dict:
    """One vectorised pass over every rank and every step window of a job.

    Each rank's events are shifted onto one shared time axis, rank after rank with a guard gap, so that
    the per-rank interval algebra (unions, coverage lookups, next-op searches) runs as single numpy calls
    over the whole job. Times return to each rank's own clock on output.
    """
    op_rank = _i64(allops["rank"])
    fam = np.asarray(allops["fam"], dtype=np.int8)
    p2p = np.asarray(allops["p2p"], dtype=bool)
    s, e, launch = _i64(allops["start_ns"]), _i64(allops["end_ns"]), _i64(allops["launch_ns"])
    kid = np.asarray(allops["kid"], dtype=np.int32)
    pgid = np.asarray(allops["pgid"], dtype=np.int32)
    oseq = _i64(allops["seq"])
    res = {"unmatched": 0, "win_rank": np.zeros(0, np.int32), "lab": np.zeros(0, np.int8)}
    if s.size == 0:
        return res
    new_rank = np.concatenate(([True], op_rank[1:] != op_rank[:-1]))  # ops come sorted by rank
    uniq = op_rank[new_rank]  # ranks with GPU ops; the others have no window
    R = uniq.size
    op_ri = np.cumsum(new_rank) - 1

    def rank_index(r):
        r = _i64(r)
        i = np.minimum(np.searchsorted(uniq, r), R - 1)
        return i, uniq[i] == r

    # everything that lives on a rank's timeline: (rank index, starts, ends)
    parts = {}
    for key in ("io",):
        hr, hs, he = hosts[key]
        i, ok = rank_index(hr)
        parts[key] = (i[ok], hs[ok], he[ok])
    for kind in ("straggler", "bubble"):
        wr, ws, we = waits[kind]
        i, ok = rank_index(wr)
        parts[kind] = (i[ok], _i64(ws)[ok], _i64(we)[ok])
    i, ok = rank_index(steps["rank"])
    parts["steps"] = (i[ok], _i64(steps["start_ns"])[ok], _i64(steps["end_ns"])[ok])
    st_step = _i64(steps["step"])[ok]
    mr, ms = _i64(matched_keys[0]), _i64(matched_keys[1])
    i, ok = rank_index(mr)
    mri, ms = i[ok], ms[ok]

    lo = np.full(R, I64_MAX, dtype=np.int64)
    hi = np.full(R, I64_MIN, dtype=np.int64)
    np.minimum.at(lo, op_ri, np.minimum(s, launch))
    np.maximum.at(hi, op_ri, np.maximum(e, launch))
    for ri, a, b in parts.values():
        np.minimum.at(lo, ri, np.minimum(a, b))
        np.maximum.at(hi, ri, np.maximum(a, b))
    span = hi - lo + GUARD_NS
    if R > 1 and sum(int(x) for x in span) >= 1 << 62:
        # the ranks' spans do not fit one int64 axis (e.g. a stray near-zero timestamp beside epoch ones):
        # sweep them in smaller groups
        return _sweep_parts(allops, hosts, steps, waits, matched_keys, halve=True)
    shift = np.concatenate(([0], np.cumsum(span)[:-1])) - lo  # own clock + shift = shared axis
    vs, ve, vl = s + shift[op_ri], e + shift[op_ri], launch + shift[op_ri]
    V = {k: (a + shift[ri], b + shift[ri]) for k, (ri, a, b) in parts.items()}

    io = union(*V["io"])
    comp, comm, copy = fam == 0, fam == 1, fam == 2
    is_re = comp & np.asarray(allops["re"], dtype=bool)
    mk = np.sort(ms + shift[mri])
    x = vs[comm]
    at = np.minimum(np.searchsorted(mk, x), max(mk.size - 1, 0))
    res["unmatched"] = int(x.size if mk.size == 0 else (mk[at] != x).sum())

    # step windows: a step runs from the first GPU start of the work launched in it to the first start of
    # the next step's work (the last step: to its last GPU end); a rank without steps is one window
    vst_s, vst_e = V["steps"]
    st_ri = parts["steps"][0]
    o = np.argsort(vst_s, kind="stable")
    vst_s, vst_e, st_ri, st_step = vst_s[o], vst_e[o], st_ri[o], st_step[o]
    step_of = np.searchsorted(vst_s, vl, side="right") - 1
    inside = (step_of >= 0) & (vl < vst_e[np.maximum(step_of, 0)] if vst_s.size else False)
    first = np.full(vst_s.size, I64_MAX, dtype=np.int64)
    last = np.full(vst_s.size, I64_MIN, dtype=np.int64)
    np.minimum.at(first, step_of[inside], vs[inside])
    np.maximum.at(last, step_of[inside], ve[inside])
    present = np.flatnonzero(last > I64_MIN)
    w_ri = st_ri[present]
    w0 = first[present]
    w1 = last[present].copy()
    same = w_ri[:-1] == w_ri[1:]
    w1[:-1][same] = w0[1:][same]
    w_step = st_step[present]
    has_steps = np.zeros(R, dtype=bool)
    has_steps[st_ri] = True
    bare = np.flatnonzero(~has_steps)
    if bare.size:
        block = np.searchsorted(op_ri, np.arange(R))
        w_ri = np.concatenate([w_ri, bare])
        w0 = np.concatenate([w0, vs[block[bare]]])  # ops are sorted by start within a rank
        w1 = np.concatenate([w1, np.maximum.reduceat(ve, block)[bare]])
        w_step = np.concatenate([w_step, np.full(bare.size, -1, dtype=np.int64)])
        o = np.argsort(w_ri, kind="stable")
        w_ri, w0, w1, w_step = w_ri[o], w0[o], w1[o], w_step[o]
    keep = w1 > w0
    w_ri, w0, w1, w_step = w_ri[keep], w0[keep], w1[keep], w_step[keep]
    nw = w0.size
    if nw == 0:
        return res

    Cn = union(vs[comp & ~is_re], ve[comp & ~is_re])
    Cr = union(vs[is_re], ve[is_re])
    K = union(vs[comm], ve[comm])
    P = union(vs[copy], ve[copy])
    Ws = union(*V["straggler"])
    Wb = union(*V["bubble"])
    bs, be = union(vs, ve)
    # elementary segments: the axis cut at every boundary of every set and every window bound (each set's
    # union is already sorted, so the stable sort only merges sorted runs; the busy union's boundaries are
    # among the four families' own)
    pts = np.sort(np.concatenate([w0, w1, *Cn, *Cr, *K, *P, *Ws, *Wb, *io]), kind="stable")
    pts = pts[np.concatenate(([True], pts[1:] != pts[:-1]))]
    # every set boundary is one of pts, so coverage of the M elementary segments [pts[k], pts[k+1]) is a
    # running sum of +1/-1 marks at the set's boundary positions: linear passes, no search per segment
    M = pts.size - 1

    def cover(u):
        d = np.zeros(M + 1, dtype=np.int8)
        d[np.searchsorted(pts, u[0])] = 1  # a union's intervals never touch: the marks never collide
        d[np.searchsorted(pts, u[1])] = -1
        return np.cumsum(d[:-1], dtype=np.int8).view(bool)

    lab = np.full(M, LEDGER_ID["idle"], dtype=np.int8)
    inCn = cover(Cn)
    inCr = cover(Cr) & ~inCn
    inK = cover(K) & ~inCn & ~inCr
    inP = cover(P) & ~inCn & ~inCr & ~inK
    gap = ~(inCn | inCr | inK | inP)
    lab[inCn] = LEDGER_ID["compute"]
    lab[inCr] = LEDGER_ID["recompute"]
    lab[inK] = LEDGER_ID["exposed_comm"]
    lab[inK & cover(Ws)] = LEDGER_ID["straggler"]
    lab[inK & cover(Wb)] = LEDGER_ID["bubble"]
    lab[inP] = LEDGER_ID["memcpy"]
    ss, se = pts[:-1], pts[1:]
    # idle gaps: the gap after each busy interval ends at the next op's start; that op's launch time tells
    # whether the host was late, and a p2p op that waited for a matched peer makes the gap a bubble
    nxt = np.searchsorted(vs, be, side="left")
    valid = nxt < vs.size
    gap_start, nxt = be[valid], nxt[valid]
    gap_end, gap_launch = vs[nxt], vl[nxt]
    gap_p2p = p2p[nxt] & covered(gap_end, *Wb)
    if gap_start.size:
        d = np.zeros(M, dtype=np.int32)
        gpos = np.searchsorted(pts, gap_start)
        d[gpos[gpos < M]] = 1
        gi = np.cumsum(d) - 1  # the last gap that began at or before each segment
        gic = np.maximum(gi, 0)
        in_gap = gap & (gi >= 0) & (ss < gap_end[gic])
        lab[in_gap & (gap_launch[gic] > gap_start[gic])] = LEDGER_ID["host"]
        lab[in_gap & gap_p2p[gic]] = LEDGER_ID["bubble"]
    lab[gap & cover(io)] = LEDGER_ID["io"]

    # drill-down key: the op each segment is charged to (gaps: the op that ends the gap)
    op = np.full(M, -1, dtype=np.int64)
    for fmask, fsel in ((comp & ~is_re, inCn), (is_re, inCr), (comm, inK), (copy, inP)):
        if fsel.any():
            idx = np.flatnonzero(fmask)  # ops are in start order
            rm, hold = _cover_index(vs[idx], ve[idx])
            # the last op of the family starting at or before each segment's start
            pos = np.searchsorted(pts, vs[idx], side="left")
            lastmark = np.full(M + 1, -1, dtype=np.int64)
            run_end = np.append(pos[1:] != pos[:-1], True)
            lastmark[pos[run_end]] = np.flatnonzero(run_end)
            i = np.maximum.accumulate(lastmark[:M])
            ic = np.maximum(i, 0)
            ok = fsel & (i >= 0) & (rm[ic] > ss)
            op[ok] = idx[hold[ic[ok]]]
    if gap.any():
        # the first op starting at or after each segment's end
        t = np.searchsorted(pts, vs, side="right") - 1
        firstmark = np.full(M + 1, vs.size, dtype=np.int64)
        run_start = np.concatenate(([True], t[1:] != t[:-1]))
        firstmark[t[run_start]] = np.flatnonzero(run_start)
        nx = np.minimum.accumulate(firstmark[::-1])[::-1][1:]
        op[gap] = np.where(nx[gap] < vs.size, nx[gap], -1)

    # the segments of each window (windows may share segments when steps overlap on the GPU)
    a = np.searchsorted(pts, w0)
    n_seg = np.searchsorted(pts, w1) - a
    total_seg = int(n_seg.sum())
    win_of = np.repeat(np.arange(nw), n_seg)
    seg = np.arange(total_seg) - np.repeat(np.cumsum(n_seg) - n_seg - a, n_seg)
    lab, op, ss, se = lab[seg], op[seg], ss[seg], se[seg]

    nl = len(LEDGERS)
    tot = np.zeros(nw * nl, dtype=np.int64)
    np.add.at(tot, win_of * nl + lab, se - ss)  # integer sums: exact for any window length
    tot = tot.reshape(nw, nl)
    assert np.array_equal(tot.sum(axis=1), w1 - w0)
    # merge adjacent segments of one window and ledger charged to the same op
    change = np.flatnonzero((np.diff(lab) != 0) | (np.diff(op) != 0) | (np.diff(win_of) != 0)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [total_seg]])
    o = op[starts]
    oc = np.maximum(o, 0)
    wi = win_of[starts]
    ri = w_ri[wi]
    res.update({
        "win_rank": uniq[w_ri].astype(np.int32), "win_step": w_step.astype(np.int32),
        "w0": w0 - shift[w_ri], "w1": w1 - shift[w_ri], "totals": tot,
        "rank": uniq[ri].astype(np.int32), "step": w_step[wi].astype(np.int32), "lab": lab[starts],
        "start": ss[starts] - shift[ri], "end": se[ends - 1] - shift[ri],
        "kid": np.where(o >= 0, kid[oc], -1), "pgid": np.where(o >= 0, pgid[oc], -1),
        "seq": np.where(o >= 0, oseq[oc], -1)})
    return res


GROUP_MAX_OPS = 2_000_000  # ops swept at once: bounds the sweep's working memory (~0.8 kB per op)


def _sweep_parts(allops, hosts, steps, waits, matched_keys, parts=2, min_ops=200_000,
                 max_ops=GROUP_MAX_OPS, halve=False) -> dict:
    """_sweep over groups of whole ranks, PARTS at a time in threads (ranks are independent once aligned; numpy
    releases the GIL in its array loops), no group over MAX_OPS ops unless one rank alone is; HALVE: two groups
    of half the ranks each. Results joined in rank order."""
    op_rank = _i64(allops["rank"])
    n = op_rank.size
    small = (n < min_ops or parts < 2) and n <= max_ops
    if n == 0 or op_rank[0] == op_rank[-1] or (small and not halve):
        return _sweep(allops, hosts, steps, waits, matched_keys)
    first = np.flatnonzero(np.concatenate(([True], op_rank[1:] != op_rank[:-1])))  # each rank's first op
    if halve:
        cut = [0, first.size // 2]
    else:
        target = min(max_ops, -(-n // max(parts, 2)))
        cut = [0]
        for k in range(1, first.size):
            if first[k] - first[cut[-1]] >= target:
                cut.append(k)
    uniq = op_rank[first]
    bounds = [uniq[c] for c in cut] + [uniq[-1] + 1]
    jobs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        a, b = np.searchsorted(op_rank, [lo, hi])

        def sel(r, lo=lo, hi=hi):
            r = _i64(r)
            return (r >= lo) & (r < hi)
        h = {k: tuple(x[sel(v[0])] for x in v) for k, v in hosts.items()}
        m = sel(steps["rank"])
        st = {k: np.asarray(v)[m] for k, v in steps.items()}
        w = {k: tuple(_i64(x)[sel(v[0])] for x in v) for k, v in waits.items()}
        mk = sel(matched_keys[0])
        jobs.append(({k: np.asarray(v)[a:b] for k, v in allops.items()}, h, st, w,
                     (_i64(matched_keys[0])[mk], _i64(matched_keys[1])[mk])))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, parts)) as ex:
        outs = list(ex.map(lambda j: _sweep(*j), jobs))
    res = {"unmatched": sum(o["unmatched"] for o in outs)}
    outs = [o for o in outs if o["win_rank"].size]
    if not outs:
        res.update({"win_rank": np.zeros(0, np.int32), "lab": np.zeros(0, np.int8)})
        return res
    for k in outs[0]:
        if k != "unmatched":
            res[k] = np.concatenate([o[k] for o in outs])
    return res


def _group_median(g, v, n_groups):
    """Median of v within each group id g (0..n_groups-1, float; NaN where a group is empty)."""
    if n_groups <= 256:  # few big groups (ranks): one partition per group beats a full two-key sort
        o = np.argsort(g, kind="stable")
        cnt = np.bincount(g, minlength=n_groups)
        edges = np.concatenate(([0], np.cumsum(cnt)))
        vs = v[o]
        return np.array([np.median(vs[edges[k]:edges[k + 1]]) if cnt[k] else np.nan for k in range(n_groups)])
    o = np.lexsort((v, g))
    gs, vs = g[o], v[o]
    cnt = np.bincount(gs, minlength=n_groups)
    first = np.cumsum(cnt) - cnt
    lo = first + (cnt - 1) // 2
    hi = first + cnt // 2
    med = np.full(n_groups, np.nan)
    ok = cnt > 0
    med[ok] = (vs[lo[ok]].astype(np.float64) + vs[hi[ok]]) / 2
    return med


ORDER_MATCH_TOL_NS = 1_000_000  # members of one collective complete within this of each other (aligned clocks)
SKEW_NS = 10_000  # completion skew of one collective across members: offsets below it are not evidence


def _estimate_offsets(gm, rm_, em, G, R):
    """Per-rank clock offset (relative to rank index 0), residual and count from matched completions: offset_r
    = median over its collectives of (end_r − median end of the collective), refined once."""
    off = np.zeros(R, dtype=np.int64)
    for _ in range(2):  # refine once with the offsets found
        adj = em - off[rm_]
        dev = adj - _group_median(gm, adj, G)[gm]
        d = _group_median(rm_, dev, R)
        has = ~np.isnan(d)
        off[has] += np.trunc(d[has]).astype(np.int64)
        off -= off[0]
    adj = em - off[rm_]
    ad = np.abs(adj - _group_median(gm, adj, G)[gm])
    n_m = np.bincount(rm_, minlength=R)
    med = _group_median(rm_, ad, R)
    resid = np.where(np.isnan(med), 0, np.trunc(np.nan_to_num(med))).astype(np.int64)
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
    import pyarrow as pa

    seq, ordn = cols["seq"], cols["ord"]
    t = {k: v for k, v in cols.items()}
    t["seq"] = pa.array(seq, mask=seq < 0)
    t["ord"] = pa.array(ordn, mask=ordn < 0)
    t["pg_name"] = pa.array([x or None for x in cols["pg_name"]], pa.string())
    t["coll"] = pa.array([x or None for x in cols["coll"]], pa.string())
    con.register("_cm", pa.table(t))
    con.execute("INSERT INTO collective_matches SELECT ?, * FROM _cm", [job])
    con.unregister("_cm")


def _align(con, job, ranks, host_codes=None):
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
    by_seq = con.execute(f"""
        SELECT rank, start_ns, end_ns, coalesce(group_size, 0) AS gsz, lower(coll) IN {P2P_COLLS} AS p2p,
               dense_rank() OVER (ORDER BY pg_name, seq, lower(coll) IN {P2P_COLLS}) - 1 AS gid,
               pg_name, coalesce(lower(coll), '') AS coll, seq, -1::BIGINT AS ord
        FROM collectives WHERE job = ? AND source = 'kernel' AND seq IS NOT NULL AND pg_name IS NOT NULL""",
                         [job]).fetchnumpy()
    by_order = con.execute(f"""
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
               coalesce(pg_name, '') AS pg_name, coalesce(coll, '') AS coll, -1::BIGINT AS seq, ord
        FROM o""", [job, job]).fetchnumpy()
    g0 = int(np.max(by_seq["gid"])) + 1 if len(by_seq["gid"]) else 0
    c = {k: np.concatenate([np.asarray(by_seq[k]), np.asarray(by_order[k]) + g0 if k == "gid"
                            else np.asarray(by_order[k])])
         for k in ("rank", "start_ns", "end_ns", "gsz", "p2p", "gid", "pg_name", "coll", "seq", "ord")}
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
        pair = np.sort(gid * R + ri)
        pair = pair[np.concatenate(([True], pair[1:] != pair[:-1]))]
        present = np.bincount(pair // R, minlength=G)
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
            hi_ = np.full(G, np.iinfo(np.int64).min, dtype=np.int64)
            lo_ = np.full(G, np.iinfo(np.int64).max, dtype=np.int64)
            np.maximum.at(hi_, gid, adj)
            np.minimum.at(lo_, gid, adj)
            ok = (present >= 2) & (hi_ - lo_ <= ORDER_MATCH_TOL_NS)
        rejected = int(((present >= 2) & ~ok)[gid].sum())
        p2p = np.asarray(c["p2p"], dtype=bool)
        gp2p = np.zeros(G, dtype=bool)
        gp2p[gid] = p2p
        need = np.zeros(G, dtype=np.int64)
        np.maximum.at(need, gid, _i64(c["gsz"]))
        need = np.where(gp2p, 2, np.maximum(need, 2))
        acc = ((present >= need) & ok)[gid]
        last = np.full(G, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(last, gid, sr - off[ri])
        w_end = np.minimum(er, last[gid] + off[ri]) + t0
        w = acc & (w_end > s)
        for kind, sel in (("straggler", w & ~p2p), ("bubble", w & p2p)):
            waits[kind] = (ranks_a[ri[sel]], s[sel], w_end[sel])
        matched_keys = (ranks_a[ri[acc]], s[acc])
        dur = e - s
        mind = np.full(G, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(mind, gid, np.where(acc, dur, np.iinfo(np.int64).max))
        _store_matches(con, job, {
            "rank": ranks_a[ri].astype(np.int32), "gid": gid, "pg_name": np.asarray(c["pg_name"], dtype=object),
            "coll": np.asarray(c["coll"], dtype=object), "seq": _i64(c["seq"]), "ord": _i64(c["ord"]),
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


def _recomputed(con, job, allops, pattern=None):
    """Per op: launched (on its launching thread) inside a recompute region. Regions: non-reentrant recompute_fn
    frames, whole; a reentrant CheckpointFunctionBackward (or a region of the user's pattern) up to the start of
    the first autograd node nested in it on the same thread (its inner backward)."""
    extra = " OR regexp_matches(name, ?)" if pattern is not None else ""
    reg = con.execute(f"""
        WITH rc AS (
            -- a user's region is read like a reentrant checkpoint: up to the autograd node nested in it
            SELECT rank, pid, tid, start_ns, end_ns, NOT ({RECOMPUTE_HOST}) AS reentrant FROM host_ops
            WHERE job = ? AND ({RECOMPUTE_HOST} OR {REENTRANT_HOST}{extra})
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
        ORDER BY 1, 2""", [job] + ([pattern] if pattern is not None else []) + [job]).fetchnumpy()
    op_rank = _i64(allops["rank"])
    out = np.zeros(op_rank.size, dtype=bool)
    if len(reg["rank"]) == 0 or op_rank.size == 0:
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


def check_pattern(what: str, pat: str | None) -> None:
    """ValueError naming WHAT when PAT (a user's host-op name pattern) is not a regular expression."""
    import re

    if pat is not None:
        try:
            re.compile(pat)
        except re.error as e:
            raise ValueError(f"{what} {pat!r} is not a regular expression: {e}") from None


def attribute_job(con, job: str, recompute_pattern: str | None = None, io_pattern: str | None = None) -> dict:
    """Charge every step window of JOB to the nine ledgers (tables in DDL). RECOMPUTE_PATTERN / IO_PATTERN: a
    regular expression on host op names (annotations, cpu ops, python frames) marking recomputation or
    data-loading / storage regions, beside the built-in rules."""
    check_pattern("recompute pattern", recompute_pattern)
    check_pattern("io pattern", io_pattern)
    _ensure_tables(con)
    for t in DDL:
        if t != "clock_offsets":
            con.execute(f"DELETE FROM {t} WHERE job = ?", [job])
    con.execute("DELETE FROM diagnostics WHERE job = ? AND source = 'attribution'", [job])
    import time

    t0 = time.perf_counter()
    ranks = [r[0] for r in con.execute("SELECT rank FROM traces WHERE job = ? ORDER BY rank", [job]).fetchall()]
    # kernel-name rules applied once per distinct name: family code 0 compute, 1 comm (2 = copy, by kind)
    import pyarrow as pa

    knames = [r[0] for r in con.execute("SELECT DISTINCT name FROM gpu_ops WHERE job = ? "
                                        "AND name IS NOT NULL ORDER BY name", [job]).fetchall()]
    rules = [classify_kernel(n) for n in knames]
    con.register("_kclass", pa.table({"kid": pa.array(range(len(knames)), pa.int32()),
                                      "name": pa.array(knames, pa.string()),
                                      "fam": pa.array([1 if r[0] == "comm" else 0 for r in rules], pa.int8()),
                                      "p2p": pa.array([r[1] == "sendrecv" for r in rules], pa.bool_()),
                                      "cls": pa.array([r[1] for r in rules], pa.string())}))
    _store_keys(con, job, knames, rules)
    hn = dict(con.execute("SELECT rank, host_name FROM traces WHERE job = ?", [job]).fetchall())
    codes = {h: k for k, h in enumerate(sorted({h for h in hn.values() if h}))}
    offsets, waits, matched_keys = _align(con, job, ranks, [codes.get(hn.get(r), -1) for r in ranks])
    t_align = time.perf_counter()
    world = con.execute("SELECT max(world_size) FROM traces WHERE job = ?", [job]).fetchone()[0] or 1
    pg_names = [r[0] for r in con.execute("SELECT DISTINCT pg_name FROM collectives WHERE job = ? "
                                          "AND pg_name IS NOT NULL ORDER BY 1", [job]).fetchall()]
    con.register("_pgs", pa.table({"pgid": pa.array(range(len(pg_names)), pa.int32()),
                                   "pg_name": pa.array(pg_names, pa.string())}))
    allops = con.execute(f"""
        WITH launch AS (
            SELECT rank, correlation, min(start_ns) AS launch_ns,
                   arg_min(hash(pid, tid) >> 1, start_ns)::BIGINT AS lth FROM host_ops
            WHERE job = ? AND cat IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL
            GROUP BY rank, correlation
        )
        , ck AS (  -- one collective key per comm kernel (rank, start, kernel name): a batched send/recv
                   -- kernel carries several; the drill-down names the one of lowest (seq, group)
            SELECT k.rank, k.start_ns, k.kernel_name, arg_min(p.pgid, [k.seq, p.pgid]) AS pgid,
                   min(k.seq) AS seq, bool_and(lower(k.coll) IN {P2P_COLLS}) AS p2p
            FROM collectives k LEFT JOIN _pgs p ON p.pg_name = k.pg_name
            WHERE k.job = ? AND k.source = 'kernel' GROUP BY ALL
        )
        SELECT g.rank, CASE WHEN g.kind = 'kernel' THEN coalesce(c.fam, 0) ELSE 2 END AS fam,
               -- a send/recv kernel is point-to-point unless the collective it carries is not (all-to-all)
               coalesce(ck.p2p, c.p2p, false) AND g.kind = 'kernel' AS p2p,
               g.start_ns, g.end_ns, coalesce(l.launch_ns, g.start_ns) AS launch_ns,
               coalesce(c.kid, -1) AS kid, coalesce(ck.pgid, -1) AS pgid, coalesce(ck.seq, -1) AS seq,
               coalesce(l.lth, -1) AS lth
        FROM gpu_ops g LEFT JOIN launch l ON l.correlation = g.correlation AND l.rank = g.rank
        LEFT JOIN _kclass c ON c.name = g.name
        LEFT JOIN ck ON ck.rank = g.rank AND ck.start_ns = g.start_ns AND ck.kernel_name = g.name
        WHERE g.job = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
        ORDER BY g.rank, g.start_ns, coalesce(l.launch_ns, g.start_ns), g.end_ns, fam, kid, g.stream, pgid, seq""", [job, job, job]).fetchnumpy()
    allops["re"] = _recomputed(con, job, allops, recompute_pattern)
    del allops["lth"]
    hosts = {}
    for key, where, pat in (("io", IO_HOST, io_pattern),):
        extra = " OR regexp_matches(name, ?)" if pat is not None else ""
        h = con.execute(f"SELECT rank, start_ns, end_ns FROM host_ops WHERE job = ? AND ({where}{extra}) "
                        "ORDER BY rank", [job] + ([pat] if pat is not None else [])).fetchnumpy()
        hosts[key] = (np.asarray(h["rank"], dtype=np.int64), np.asarray(h["start_ns"], dtype=np.int64),
                      np.asarray(h["end_ns"], dtype=np.int64))
    all_steps = con.execute("SELECT rank, step, start_ns, end_ns FROM steps WHERE job = ? ORDER BY rank, step",
                            [job]).fetchnumpy()
    t_read = time.perf_counter()
    # as many sweep threads as the connection lets DuckDB use (a batch worker runs with one), at most two
    threads = int(con.execute("SELECT current_setting('threads')").fetchall()[0][0])
    out = _sweep_parts(allops, hosts, all_steps, waits, matched_keys, parts=max(1, min(2, threads)))
    t_sweep = time.perf_counter()
    unmatched_total = out["unmatched"]
    nw = out["win_rank"].size
    n_intervals = int(out["lab"].size)
    if nw:
        con.register("_sw", pa.table({"job": pa.array([job] * nw, pa.string()), "rank": out["win_rank"],
                                      "step": out["win_step"], "start_ns": out["w0"], "end_ns": out["w1"]}))
        con.execute("INSERT INTO step_windows SELECT * FROM _sw")
        con.unregister("_sw")

        def named(codes, names):
            # -1 = no name; dictionary-encoded, so no join and no per-row string is built here
            codes = np.asarray(codes, dtype=np.int32)
            return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), pa.array(names, pa.string()))

        seq = out["seq"]
        con.register("_li", pa.table({
            "rank": out["rank"], "step": out["step"], "ledger": named(out["lab"], list(LEDGERS)),
            "start_ns": out["start"], "end_ns": out["end"], "op_name": named(out["kid"], knames),
            "pg_name": named(out["pgid"], pg_names), "seq": pa.array(seq, mask=seq < 0)}))
        # produced rank by rank, window by window, in time order: already sorted for range scans
        con.execute("""INSERT INTO ledger_intervals (job, rank, step, ledger, start_ns, end_ns, op_name, pg_name, seq)
            SELECT ?, * FROM _li""", [job])
        con.unregister("_li")
        nl = len(LEDGERS)
        con.register("_lt", pa.table({
            "job": pa.array([job] * (nw * nl), pa.string()), "rank": np.repeat(out["win_rank"], nl),
            "step": np.repeat(out["win_step"], nl),
            "ledger": named(np.tile(np.arange(nl, dtype=np.int32), nw), list(LEDGERS)),
            "ns": out["totals"].reshape(-1)}))
        con.execute("INSERT INTO ledger_totals SELECT * FROM _lt")
        con.unregister("_lt")
    con.unregister("_kclass")
    con.unregister("_pgs")
    if unmatched_total:
        con.execute("INSERT INTO diagnostics VALUES (?, NULL, 'attribution', 'unmatched_comm', ?, ?)",
                    [job, unmatched_total, f"comm kernels with no peer trace (world {world}); charged to exposed_comm"])
    t_end = time.perf_counter()
    return {"intervals": n_intervals, "totals": nw * len(LEDGERS), "offsets": offsets,
            "seconds": {"align": t_align - t0, "read": t_read - t_align, "sweep": t_sweep - t_read,
                        "write": t_end - t_sweep}}
