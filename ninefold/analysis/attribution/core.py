"""The compiled attribution core: one pass per rank, ranks independent once the collectives are aligned.

prepare_rank joins a rank's GPU ops to their launches and collective keys and sorts them; sweep_rank cuts the
rank's step windows into elementary segments and labels them by the LEDGERS precedence: compute/recompute >
communication (straggler | bubble | exposed_comm) > memcpy > the idle gap's cause (io > bubble > host > idle).
Both are numba functions that release the GIL, so ranks run in parallel threads.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ninefold.analysis.attribution.align_kernels import group_order
from ninefold.analysis.ledgers import LEDGER_ID

I64_MAX = np.iinfo(np.int64).max
I64_MIN = np.iinfo(np.int64).min
COMPUTE, RECOMPUTE, HOST = LEDGER_ID["compute"], LEDGER_ID["recompute"], LEDGER_ID["host"]
EXPOSED, MEMCPY, IO = LEDGER_ID["exposed_comm"], LEDGER_ID["memcpy"], LEDGER_ID["io"]
BUBBLE, STRAGGLER, IDLE = LEDGER_ID["bubble"], LEDGER_ID["straggler"], LEDGER_ID["idle"]
NL = 9

_jit = nb.njit(cache=True, nogil=True)


@_jit
def _stable_order(a):
    """np.argsort(a, kind="mergesort"), without the sort when A is already in order (the common case)."""
    for i in range(1, a.size):
        if a[i] < a[i - 1]:
            return np.argsort(a, kind="mergesort")
    return np.arange(a.size)


@_jit
def _less(a0, a1, a2, a3, a4, a5, a6, b0, b1, b2, b3, b4, b5, b6):
    if a0 != b0:
        return a0 < b0
    if a1 != b1:
        return a1 < b1
    if a2 != b2:
        return a2 < b2
    if a3 != b3:
        return a3 < b3
    if a4 != b4:
        return a4 < b4
    if a5 != b5:
        return a5 < b5
    return a6 < b6


@_jit
def _key_order(rank, start, kid):
    """An order of the rows by (rank, start, kid), ties in any order: a counting sort by rank, then each rank's
    rows by start where they are not in order already (the common case), then each run of one start by kid."""
    n = rank.size
    o = np.arange(n)
    if n == 0:
        return o
    lo, hi = rank.min(), rank.max()
    if hi - lo >= 4 * n + 1024:  # sparse rank numbers: a plain sort
        o = np.argsort(rank, kind="mergesort")
    else:
        o = group_order(rank - lo, hi - lo + 1)[0]
    a = 0
    while a < n:
        b = a + 1
        ordered = True
        while b < n and rank[o[b]] == rank[o[a]]:
            if start[o[b]] < start[o[b - 1]]:
                ordered = False
            b += 1
        if not ordered:
            seg = o[a:b].copy()
            o[a:b] = seg[np.argsort(start[seg], kind="mergesort")]
        for x in range(a + 1, b):  # runs of one start are short: insertion by kid
            v = o[x]
            y = x - 1
            while y >= a and start[o[y]] == start[v] and kid[o[y]] > kid[v]:
                o[y + 1] = o[y]
                y -= 1
            o[y + 1] = v
        a = b
    return o


@_jit
def collective_keys(rank, start, kid, pgid, seq, seq_ok, p2p):
    """One key per comm kernel (rank, start, kernel id) from its collective rows (any order), sorted by those:
    the process group of the row of lowest (seq, pg) (a missing seq last; rows without a group skipped; -1 =
    none), the lowest seq (-1 = none), p2p 1 when every row that names its type is point-to-point, 0 when one
    is not, -1 when none names it. pgid -1 = no group; p2p per row 1 / 0 / -1 (no type)."""
    n = rank.size
    o = _key_order(rank, start, kid)
    k_rank = np.empty(n, np.int64)
    k_start = np.empty(n, np.int64)
    k_kid = np.empty(n, np.int64)
    k_pg = np.empty(n, np.int64)
    k_seq = np.empty(n, np.int64)
    k_p2p = np.empty(n, np.int8)
    q = -1
    b_seq = 0   # the (seq missing?, seq, pg) of the run's lowest row with a group
    b_miss = True
    seen_seq = False
    for x in range(n):
        i = o[x]
        if q < 0 or rank[i] != k_rank[q] or start[i] != k_start[q] or kid[i] != k_kid[q]:
            q += 1
            k_rank[q], k_start[q], k_kid[q] = rank[i], start[i], kid[i]
            k_pg[q], k_seq[q], k_p2p[q] = -1, -1, -1
            seen_seq = False
        if seq_ok[i] and (not seen_seq or seq[i] < k_seq[q]):
            k_seq[q] = seq[i]
            seen_seq = True
        if p2p[i] >= 0:
            k_p2p[q] = p2p[i] if k_p2p[q] < 0 else min(k_p2p[q], p2p[i])
        if pgid[i] >= 0:
            miss = not seq_ok[i]
            sq = seq[i] if seq_ok[i] else 0
            if k_pg[q] < 0 or (miss, sq, pgid[i]) < (b_miss, b_seq, k_pg[q]):
                k_pg[q], b_seq, b_miss = pgid[i], sq, miss
    q += 1
    return k_rank[:q], k_start[:q], k_kid[:q], k_pg[:q], k_seq[:q], k_p2p[:q]


@_jit
def prepare_rank(start, end, corr, has_corr, stream, kind, kid, fam_of, p2p_of,
                 h_corr, h_start, h_th, c_start, c_kid, c_pgid, c_seq, c_p2p, out):
    """One rank's ops (any order) -> the order (start, launch, end, family, kernel id, stream, pg, seq), and the
    per-op columns in it written into OUT's arrays (start, end, kid, launch, launching thread, family, p2p, pg,
    seq: views of the group's columns, one slot per op). kind: 0 kernel, 1 memcpy, 2 memset. h_*: the rank's
    launch calls (correlation, start, thread); an op's launch is the earliest call of its correlation. c_*: the
    rank's collective keys per (start, kernel id), sorted by them; c_p2p -1 = unknown."""
    n = start.size
    # launches: earliest call per correlation
    ho = _stable_order(h_corr)
    hc = h_corr[ho]
    m = hc.size
    uc = np.empty(m, np.int64)
    ul = np.empty(m, np.int64)
    ut = np.empty(m, np.int64)
    k = -1
    for j in range(m):
        i = ho[j]
        if k < 0 or hc[j] != uc[k]:
            k += 1
            uc[k] = hc[j]
            ul[k] = h_start[i]
            ut[k] = h_th[i]
        elif h_start[i] < ul[k]:
            ul[k] = h_start[i]
            ut[k] = h_th[i]
    nu = k + 1
    uc = uc[:nu]
    launch = start.copy()
    lth = np.full(n, -1, np.int64)
    fam = np.empty(n, np.int8)
    p2p = np.zeros(n, np.bool_)
    pgid = np.full(n, -1, np.int64)
    seq = np.full(n, -1, np.int64)
    nc = c_start.size
    for i in range(n):
        if has_corr[i] and nu:
            j = np.searchsorted(uc, corr[i])
            if j < nu and uc[j] == corr[i]:
                launch[i] = ul[j]
                lth[i] = ut[j]
        kd = kid[i]
        if kind[i] == 0:
            fam[i] = fam_of[kd] if kd >= 0 else 0
        else:
            fam[i] = 2
        pp = -1
        if kd >= 0 and nc:
            # binary search of (start, kid) among the collective keys
            lo, hi = 0, nc
            while lo < hi:
                mid = (lo + hi) // 2
                if c_start[mid] < start[i] or (c_start[mid] == start[i] and c_kid[mid] < kd):
                    lo = mid + 1
                else:
                    hi = mid
            if lo < nc and c_start[lo] == start[i] and c_kid[lo] == kd:
                pgid[i] = c_pgid[lo]
                seq[i] = c_seq[lo]
                pp = c_p2p[lo]
        if pp < 0:
            pp = 1 if (kd >= 0 and p2p_of[kd]) else 0
        p2p[i] = pp == 1 and kind[i] == 0
    # order: stable by start, then each run of equal starts by the remaining keys (runs are short)
    o = _stable_order(start)
    a = 0
    while a < n:
        b = a + 1
        while b < n and start[o[b]] == start[o[a]]:
            b += 1
        for x in range(a + 1, b):
            v = o[x]
            y = x - 1
            while y >= a:
                u = o[y]
                if _less(launch[v], end[v], fam[v], kid[v], stream[v], pgid[v], seq[v],
                         launch[u], end[u], fam[u], kid[u], stream[u], pgid[u], seq[u]):
                    o[y + 1] = u
                    y -= 1
                else:
                    break
            o[y + 1] = v
        a = b
    o_start, o_end, o_kid, o_launch, o_lth, o_fam, o_p2p, o_pgid, o_seq = out
    for x in range(n):
        v = o[x]
        o_start[x] = start[v]
        o_end[x] = end[v]
        o_kid[x] = kid[v]
        o_launch[x] = launch[v]
        o_lth[x] = lth[v]
        o_fam[x] = fam[v]
        o_p2p[x] = p2p[v]
        o_pgid[x] = pgid[v]
        o_seq[x] = seq[v]


@_jit
def _union(s, e):
    """Sorted disjoint union of the intervals [s, e) (empty ones dropped; touching ones merged)."""
    keep = np.flatnonzero(e > s)
    ks = s[keep]
    ke = e[keep]
    o = _stable_order(ks)
    return _merge_sorted(ks[o], ke[o])


@_jit
def _merge_sorted(s, e):
    n = s.size
    us = np.empty(n, np.int64)
    ue = np.empty(n, np.int64)
    k = -1
    for i in range(n):
        if e[i] <= s[i]:
            continue
        if k >= 0 and s[i] <= ue[k]:
            if e[i] > ue[k]:
                ue[k] = e[i]
        else:
            k += 1
            us[k] = s[i]
            ue[k] = e[i]
    return us[:k + 1].copy(), ue[:k + 1].copy()


@_jit
def _family_union(s, e, sel):
    n = int(sel.sum())
    fs = np.empty(n, np.int64)
    fe = np.empty(n, np.int64)
    k = 0
    for i in range(s.size):
        if sel[i]:
            fs[k] = s[i]
            fe[k] = e[i]
            k += 1
    return _merge_sorted(fs, fe)


@_jit
def _bounds(us, ue):
    out = np.empty(2 * us.size, np.int64)
    for j in range(us.size):
        out[2 * j] = us[j]
        out[2 * j + 1] = ue[j]
    return out


@_jit
def _covered(x, us, ue):
    i = np.searchsorted(us, x, side="right") - 1
    return i >= 0 and x < ue[i]


@_jit
def sweep_rank(s, e, launch, fam, re, p2p, io_s, io_e, ws_s, ws_e, wb_s, wb_e, st_s, st_e, st_id, matched):
    """One rank's ops sorted as prepare_rank leaves them (s, e, launch; fam 0 compute, 1 comm, 2 copy; re:
    recomputed; p2p), its io host regions, straggler and bubble waits, steps (start, end, id; in step order)
    and the sorted starts of its comm kernels that were matched with peers.

    Returns (windows: w0, w1, step id; totals [window, ledger] ns; intervals: start, end, ledger, op index (-1:
    none), window index; the count of comm kernels with no peer). Intervals are coalesced: adjacent segments of
    one window with the same ledger and op are one."""
    n = s.size
    unmatched = 0
    for i in range(n):
        if fam[i] == 1:
            j = np.searchsorted(matched, s[i])
            if j >= matched.size or matched[j] != s[i]:
                unmatched += 1
    # step windows: a step runs from the first GPU start of the work launched in it to the first start of the
    # next step's work (the last step: to its last GPU end); a rank without steps is one window
    ns_ = st_s.size
    if ns_:
        so = _stable_order(st_s)
        ss_ = st_s[so]
        se_ = st_e[so]
        first = np.full(ns_, I64_MAX, np.int64)
        last = np.full(ns_, I64_MIN, np.int64)
        for i in range(n):
            k = np.searchsorted(ss_, launch[i], side="right") - 1
            if k >= 0 and launch[i] < se_[k]:
                if s[i] < first[k]:
                    first[k] = s[i]
                if e[i] > last[k]:
                    last[k] = e[i]
        pres = np.flatnonzero(last > I64_MIN)
        w0 = first[pres]
        w1 = last[pres].copy()
        for k in range(pres.size - 1):
            w1[k] = w0[k + 1]
        wid = st_id[so][pres]
    else:
        w0 = np.empty(1, np.int64)
        w1 = np.empty(1, np.int64)
        wid = np.full(1, -1, np.int64)
        w0[0] = s[0] if n else 0
        w1[0] = e.max() if n else 0
    keepw = np.flatnonzero(w1 > w0)
    w0, w1, wid = w0[keepw], w1[keepw], wid[keepw]
    nw = w0.size
    empty = np.zeros(0, np.int64)
    if nw == 0 or n == 0:
        return (w0, w1, wid, np.zeros((0, NL), np.int64), empty, empty, np.zeros(0, np.int8), empty, empty,
                unmatched)

    cn = (fam == 0) & ~re
    cr = (fam == 0) & re
    b_s, b_e = _family_union(s, e, np.ones(n, np.bool_))
    Wb_s, Wb_e = _union(wb_s, wb_e)
    # every set as its boundaries in time order (start, end, start, ...): a time is inside the set when an odd
    # number of its boundaries are at or before it. Sets: 0 compute, 1 recompute, 2 comm, 3 copy, 4 straggler
    # waits, 5 bubble waits, 6 io, 7 the window bounds (no coverage).
    seqs = (_bounds(*_family_union(s, e, cn)), _bounds(*_family_union(s, e, cr)),
            _bounds(*_family_union(s, e, fam == 1)), _bounds(*_family_union(s, e, fam == 2)),
            _bounds(*_union(ws_s, ws_e)), _bounds(Wb_s, Wb_e), _bounds(*_union(io_s, io_e)),
            np.unique(np.concatenate((w0, w1))))
    off = np.zeros(9, np.int64)
    for j in range(8):
        off[j + 1] = off[j] + seqs[j].size
    flat = np.empty(off[8], np.int64)
    for j in range(8):
        flat[off[j]:off[j + 1]] = seqs[j]
    total = off[8]
    pts = np.empty(total, np.int64)
    bits = np.empty(total, np.int16)  # for segment k = [pts[k], pts[k+1]): bit j set = inside set j
    ptr = off[:8].copy()
    lim = off[1:].copy()
    m = 0
    while True:
        t = I64_MAX
        for j in range(8):
            if ptr[j] < lim[j] and flat[ptr[j]] < t:
                t = flat[ptr[j]]
        if t == I64_MAX:
            break
        bb = 0
        for j in range(8):
            if ptr[j] < lim[j] and flat[ptr[j]] == t:
                ptr[j] += 1
            if j < 7 and (ptr[j] - off[j]) & 1:
                bb |= 1 << j
        pts[m] = t
        bits[m] = bb
        m += 1
    pts = pts[:m]
    M = m - 1
    lab = np.full(M, IDLE, np.int8)
    gap = np.zeros(M, np.bool_)
    fseg = np.full(M, -1, np.int8)  # the family a segment is charged to: 0 compute, 1 recompute, 2 comm, 3 copy
    for k in range(M):
        bb = bits[k]
        if bb & 1:
            lab[k] = COMPUTE
            fseg[k] = 0
        elif bb & 2:
            lab[k] = RECOMPUTE
            fseg[k] = 1
        elif bb & 4:
            fseg[k] = 2
            if bb & 32:
                lab[k] = BUBBLE
            elif bb & 16:
                lab[k] = STRAGGLER
            else:
                lab[k] = EXPOSED
        elif bb & 8:
            lab[k] = MEMCPY
            fseg[k] = 3
        else:
            gap[k] = True
    # idle gaps: the gap after each busy interval ends at the next op's start; that op's launch time tells
    # whether the host was late, and a p2p op that waited for a matched peer makes the gap a bubble
    nb_ = b_s.size
    gi = -1
    g_start = I64_MIN
    g_end = I64_MIN
    g_host = False
    g_p2p = False
    j = 0  # busy intervals whose end is at or before the segment start
    for k in range(M):
        ss = pts[k]
        while j < nb_ and b_e[j] <= ss:
            nx = np.searchsorted(s, b_e[j])
            if nx < n:
                gi = j
                g_start = b_e[j]
                g_end = s[nx]
                g_host = launch[nx] > g_start
                g_p2p = p2p[nx] and Wb_s.size > 0 and _covered(g_end, Wb_s, Wb_e)
            j += 1
        if gap[k]:
            if gi >= 0 and ss < g_end:
                if g_p2p:
                    lab[k] = BUBBLE
                elif g_host:
                    lab[k] = HOST
            if bits[k] & 64:
                lab[k] = IO
    # drill-down key: the op each segment is charged to (family segments: the op of the family started at or
    # before the segment that holds the running max end, the latest on a tie; gaps: the first op starting at
    # or after the segment's end)
    op = np.full(M, -1, np.int64)
    best_end = np.full(4, I64_MIN, np.int64)
    holder = np.full(4, -1, np.int64)
    i = 0
    i2 = 0
    for k in range(M):
        ss = pts[k]
        while i < n and s[i] <= ss:
            ff = fam[i]
            code = (1 if re[i] else 0) if ff == 0 else ff + 1
            if e[i] >= best_end[code]:
                best_end[code] = e[i]
                holder[code] = i
            i += 1
        f = fseg[k]
        if f >= 0:
            if holder[f] >= 0 and best_end[f] > ss:
                op[k] = holder[f]
        else:
            se = pts[k + 1]
            while i2 < n and s[i2] < se:
                i2 += 1
            op[k] = i2 if i2 < n else -1
    # the segments of each window (windows may share segments when steps overlap on the GPU)
    tot = np.zeros((nw, NL), np.int64)
    a0 = np.searchsorted(pts, w0)
    a1 = np.searchsorted(pts, w1)
    cap = 0
    for w in range(nw):
        cap += a1[w] - a0[w]
    o_s = np.empty(cap, np.int64)
    o_e = np.empty(cap, np.int64)
    o_l = np.empty(cap, np.int8)
    o_op = np.empty(cap, np.int64)
    o_w = np.empty(cap, np.int64)
    q = -1
    for w in range(nw):
        for k in range(a0[w], a1[w]):
            tot[w, lab[k]] += pts[k + 1] - pts[k]
            if q >= 0 and o_w[q] == w and o_l[q] == lab[k] and o_op[q] == op[k]:
                o_e[q] = pts[k + 1]
            else:
                q += 1
                o_s[q] = pts[k]
                o_e[q] = pts[k + 1]
                o_l[q] = lab[k]
                o_op[q] = op[k]
                o_w[q] = w
    q += 1
    return w0, w1, wid, tot, o_s[:q], o_e[:q], o_l[:q], o_op[:q], o_w[:q], unmatched
