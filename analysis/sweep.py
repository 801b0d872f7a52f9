"""The attribution sweep: every rank and step window of a job cut into elementary segments and labelled.

Each rank's events are laid on one shared int64 time axis, rank after rank with a guard gap, so unions,
coverage and next-op lookups are single numpy calls per job; segment labels come from running sums of +1/-1
marks at set boundaries. Precedence (LEDGERS contract): compute/recompute > communication (straggler | bubble |
exposed_comm) > memcpy > the idle gap's cause (io > bubble > host > idle).
"""
from __future__ import annotations

import numpy as np

from analysis.intervals import covered, i64 as _i64, union
from analysis.ledgers import LEDGER_ID, LEDGERS


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
        return sweep_parts(allops, hosts, steps, waits, matched_keys, halve=True)
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


def sweep_parts(allops, hosts, steps, waits, matched_keys, parts=2, min_ops=200_000,
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
