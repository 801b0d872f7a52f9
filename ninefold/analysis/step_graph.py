"""The dependency graph of every step of a job, on the reference clock, and its compiled replay.

Nodes (times are aligned: a rank's own clock minus its offset in ``clock_offsets``):
  GS    a GPU op's start (kernels, copies, memsets; its end is start + duration)
  CE    a matched collective's end on one rank: no earlier than its own start and the group's last arrival, plus
        the transfer after that arrival (the node's lag)
  GA    a collective group's last arrival (the max of its members' starts): the edge that crosses ranks
  H     a host call on its thread: a launch (cudaLaunchKernel, cudaMemcpyAsync ...) or a synchronize's start
  HE    a synchronize's return: after its start and after the GPU work it waited for
  SINK  a rank's step end: the start of the next step's first GPU op (the last step: its last GPU op's end)
Edges: per-stream order; launch -> op (the rank's least launch latency); a launch waits on its thread's previous
host call (the host's own time, an edge offset); synchronize -> the GPU op that ended last before it returned;
an implicit sync: a launch that follows within XSTREAM_TOL_NS the end of a GPU op issued by the host's previous
call, the GPU busy at that call (a busy-poll or readback, no synchronize call), waits on that op;
an op that started later than its stream and its launch allow waited on the op of another stream that ended
last before it (within XSTREAM_TOL_NS: cudaStreamWaitEvent and the like, which the trace may not show); member
starts -> GA -> CE. A step's graph holds the ops that start in its window on each rank, plus the next window's
first op (the sink's predecessor); edges never cross steps.

Each node's time is max(pred time + edge offset) + its lag, the lag chosen so that replaying the unchanged graph
gives every measured time exactly (an edge the measurement contradicts is left out). Nodes with no predecessor
in the step keep their measured time. ninefold.analysis.whatif changes durations, lags and offsets and replays.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ninefold.analysis.intervals import i64 as _i64
from ninefold.analysis.intervals import union

XSTREAM_TOL_NS = 50_000
I64_MAX = np.iinfo(np.int64).max
I64_MIN = np.iinfo(np.int64).min
# node types
GS, CE, GA, H, HE, SINK = 0, 1, 2, 3, 4, 5
# edge kinds (in-edges are tried in this order: on a tie the first wins, GPU-side before host-side)
E_STREAM, E_XSTREAM, E_CE_OWN, E_SYNC_G, E_IMPLICIT, E_GA, E_MEMBER, E_LAUNCH, E_HOST, E_SYNC_H, E_SINK = range(11)
# the order of node types at one instant (an edge against it is left out: only zero-length cases)
_CLASS = {H: 0, HE: 1, GS: 2, GA: 3, CE: 4, SINK: 5}
SYNC_NAMES = "(name ILIKE '%synchronize%')"


def no_windows_reason(con, job: str) -> str:
    """Why JOB has no step windows to build on: not attributed, or no GPU work at all."""
    has = bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'gpu_ops'"
                           ).fetchall()[0][0])
    n = con.execute("SELECT count(*) FROM gpu_ops WHERE job = ?", [job]).fetchall()[0][0] if has else 0
    if has and not n and con.execute("SELECT count(*) FROM traces WHERE job = ?", [job]).fetchall()[0][0]:
        return f"job {job!r} has no GPU ops (a CPU-only trace): its steps have no GPU timeline to follow"
    return f"job {job!r} has no attributed step windows (run `ninefold attribute` first)"


def _q(con, sql, params):
    return con.execute(sql, params).fetchnumpy()


def read_job(con, job: str) -> dict:
    """The columns the graph is built from (numpy arrays), times still in each rank's own clock."""
    ops = _q(con, """
        WITH cm AS (SELECT rank, start_ns, end_ns, min(gid) AS gid, bool_or(p2p) AS p2p FROM collective_matches
                    WHERE job = ? AND matched GROUP BY rank, start_ns, end_ns),
             la AS (SELECT rank, correlation, min(start_ns) AS a, arg_min((hash(pid, tid) >> 1)::BIGINT, start_ns) AS th
                    FROM host_ops WHERE job = ? AND cat IN ('cuda_runtime', 'cuda_driver')
                    AND correlation IS NOT NULL GROUP BY rank, correlation)
        SELECT g.rank, coalesce(g.stream, -1) AS stream, g.start_ns, greatest(g.end_ns, g.start_ns) AS end_ns,
               coalesce(g.name, '') AS name, coalesce(kc.family, CASE WHEN g.kind = 'kernel' THEN 'compute'
               ELSE 'copy' END) AS family, coalesce(kc.kclass, '') AS kclass,
               coalesce(cm.gid, -1) AS gid, coalesce(cm.p2p, false) AS p2p,
               coalesce(la.a, -9223372036854775808) AS launch_ns, coalesce(la.th, 0) AS th, la.a IS NOT NULL AS hl
        FROM gpu_ops g
        LEFT JOIN kernel_classes kc ON kc.job = g.job AND kc.name = g.name
        LEFT JOIN cm ON cm.rank = g.rank AND cm.start_ns = g.start_ns AND cm.end_ns = g.end_ns
                        AND kc.family = 'comm'
        LEFT JOIN la ON la.rank = g.rank AND la.correlation = g.correlation
        WHERE g.job = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
        ORDER BY g.rank, g.start_ns, g.end_ns""", [job, job, job])
    syncs = _q(con, f"""SELECT rank, (hash(pid, tid) >> 1)::BIGINT AS th, start_ns, end_ns FROM host_ops
                        WHERE job = ? AND cat IN ('cuda_runtime', 'cuda_driver') AND {SYNC_NAMES}
                        ORDER BY rank, th, start_ns""", [job])
    win = _q(con, "SELECT rank, step, start_ns, end_ns FROM step_windows WHERE job = ? ORDER BY rank, start_ns",
             [job])
    co = con.execute("SELECT rank, offset_ns, coalesce(residual_ns, 0), coalesce(estimate_ns, offset_ns) "
                     "FROM clock_offsets WHERE job = ?", [job]).fetchall()
    off = {r: o for r, o, _, _ in co}
    # how far apart two ranks' aligned clocks may still be: the estimates not applied and the residuals
    tol = max([50_000] + [2 * max(abs(int(e or 0) - int(o or 0)), int(res or 0)) for _, o, res, e in co])
    return {"ops": ops, "syncs": syncs, "win": win, "offsets": off, "clock_tol": tol}


class _Builder:
    def __init__(self):
        self.n = 0
        self.cols = {k: [] for k in ("typ", "rank", "step", "T", "dur", "op", "grp")}
        self.e = {k: [] for k in ("src", "dst", "off", "fe", "kind")}

    def nodes(self, typ, rank, step, T, dur=0, op=-1, grp=-1):
        T = _i64(T)
        k = T.size
        ids = np.arange(self.n, self.n + k)
        self.n += k
        for name, v in (("typ", typ), ("rank", rank), ("step", step), ("T", T), ("dur", dur), ("op", op),
                        ("grp", grp)):
            self.cols[name].append(np.broadcast_to(np.asarray(v, dtype=np.int64), (k,)).copy())
        return ids

    def edges(self, src, dst, off, fe, kind):
        src = _i64(src)
        k = src.size
        for name, v in (("src", src), ("dst", dst), ("off", off), ("fe", fe), ("kind", kind)):
            self.e[name].append(np.broadcast_to(np.asarray(v, dtype=np.int64), (k,)).copy())

    def done(self):
        cat = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in self.cols.items()}
        ecat = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in self.e.items()}
        return cat, ecat


def _window_graph(b, r, step, w1, rows, S, E, stream, coll, hl, la, th, sink, ys, ye, yth, lat):
    """Nodes and edges of one rank's window. ROWS/S/E/...: its ops (aligned times, by start), the last one the
    next window's first op when SINK; YS/YE/YTH: the rank's synchronize calls."""
    n = S.size
    k = n - 1 if sink else n  # the window's own ops
    is_sink = np.zeros(n, bool)
    is_sink[k:] = True
    icoll = np.where(is_sink, -1, coll)
    gs = b.nodes(GS, r, step, S, E - S, op=rows)
    # where an op's end is read: its CE node for a matched collective, else its GS (+ duration)
    end_node, end_fe = gs.copy(), np.ones(n, np.int64)
    cm = np.flatnonzero(icoll >= 0)
    if cm.size:
        ce = b.nodes(CE, r, step, E[cm], op=rows[cm])
        end_node[cm], end_fe[cm] = ce, 0
        b.edges(gs[cm], ce, 0, 0, E_CE_OWN)
        b.ce.append((ce, icoll[cm], gs[cm], np.full(cm.size, step)))
    o = np.lexsort((E, S, stream))
    same = stream[o][1:] == stream[o][:-1]
    b.edges(end_node[o][:-1][same], gs[o][1:][same], 0, end_fe[o][:-1][same], E_STREAM)
    prev_e = np.full(n, I64_MIN)
    prev_e[o[1:][same]] = E[o[:-1][same]]
    # the op of another stream that ended last before a start, where that explains more than stream and launch
    eo = np.argsort(E[:k], kind="stable")
    Es = E[:k][eo]
    j = np.searchsorted(Es, S, side="right") - 1
    ready_l = np.where(hl, la + lat, I64_MIN)
    cand = np.flatnonzero(j >= 0)
    if cand.size:
        src = eo[j[cand]]
        ok = ((stream[src] != stream[cand]) & (Es[j[cand]] > np.maximum(prev_e[cand], ready_l[cand]))
              & (S[cand] - Es[j[cand]] <= XSTREAM_TOL_NS))
        b.edges(end_node[src[ok]], gs[cand[ok]], 0, end_fe[src[ok]], E_XSTREAM)
    # host calls per thread, in time order: launches, and synchronizes inside the window's launches
    hi_ = np.flatnonzero(hl)
    if hi_.size:
        a = la[hi_]
        hn = b.nodes(H, r, step, a, op=rows[hi_])
        b.edges(hn, gs[hi_], np.minimum(lat, np.maximum(S[hi_] - a, 0)), 0, E_LAUNCH)
        b.launch.append((hn, icoll[hi_], gs[hi_], S[hi_] - a))
        gpu = (S[:k], E[:k], np.where(hl, la, S)[:k], Es, eo, end_node, end_fe)
        for t in np.unique(th[hi_]):
            m = th[hi_] == t
            _thread_calls(b, r, step, a[m], hn[m], (yth == t) & (ys >= a[m].min()) & (ys <= a[m].max()), ys, ye,
                          gpu)
    sk = b.nodes(SINK, r, step, np.array([w1]))
    if sink:
        b.edges(gs[-1:], sk, 0, 0, E_SINK)
    elif k:
        li = int(np.argmax(E[:k]))
        b.edges(end_node[li:li + 1], sk, 0, end_fe[li], E_SINK)


def _thread_calls(b, r, step, am, nm, ysel, ys, ye, gpu):
    """One host thread's calls in a window, in time order: its launches (times AM, nodes NM) and its synchronizes
    (YSEL of YS/YE), each waiting on the previous one (the host's own time), a synchronize's return on the GPU op
    that ended last before it, a launch after a quiet host on the op it waited for (_implicit_syncs). GPU: the
    window's ops (starts, ends, issued) and their ends sorted (Es, eo), and where each op's end is read."""
    S, E, issued, Es, eo, end_node, end_fe = gpu
    yi = np.flatnonzero(ysel)
    first = np.concatenate([nm, np.zeros(yi.size, np.int64)])
    last = first.copy()
    starts = np.concatenate([am, ys[yi]])
    ends = np.concatenate([am, ye[yi]])
    kinds = np.concatenate([np.zeros(am.size, np.int64), np.ones(yi.size, np.int64)])
    if yi.size:
        hs = b.nodes(H, r, step, ys[yi])
        he = b.nodes(HE, r, step, ye[yi])
        first[am.size:], last[am.size:] = hs, he
        # a sync returns after its own call and after the GPU op that ended last before it returned,
        # with the same wake-up time on both edges: max(start, that end) + wake = its measured return
        w = np.searchsorted(Es, ye[yi], side="right") - 1
        dep_end = np.where(w >= 0, Es[np.maximum(w, 0)], I64_MIN)
        wake = ye[yi] - np.maximum(ys[yi], dep_end)
        b.edges(hs, he, wake, 0, E_SYNC_H)
        ok = w >= 0
        dep = eo[w[ok]]
        b.edges(end_node[dep], he[ok], wake[ok], end_fe[dep], E_SYNC_G)
    so = np.lexsort((kinds, starts))
    pf, pl, pk = first[so][:-1], last[so][:-1], kinds[so][:-1]
    ps, pe, nx, ns = starts[so][:-1], ends[so][:-1], first[so][1:], starts[so][1:]
    ret = (pk == 1) & (ns >= pe)  # after a sync, from its return
    pt = np.where(ret, pe, ps)
    b.edges(np.where(ret, pl, pf), nx, ns - pt, 0, E_HOST)
    nl = kinds[so][1:] == 0
    _implicit_syncs(b, nx[nl], ns[nl], pt[nl], S, E, issued, Es, eo, end_node, end_fe)


def _implicit_syncs(b, nx, ns, pt, S, E, issued, Es, eo, end_node, end_fe):
    """Launches NX at NS whose host had been quiet since PT (its thread's previous call), the rank's GPU running
    an op at PT, and that followed within XSTREAM_TOL_NS the end of an op issued by PT (ISSUED: its launch, else
    its start; S/E: the window's ops, Es/eo: their ends sorted): the host waited on that op without a synchronize
    call (a busy-poll on a flag the kernel writes, a readback such as DeepEP's notify_dispatch counts). Edge:
    that op's end -> the launch, the host's wake-up as offset (tried before the host's own time, so the path
    follows the GPU work the host waited for). Where the GPU was idle when the host went quiet, the host was not
    waiting on it (it was late: launch-bound), and an op issued after PT is not what the host waited for."""
    if not nx.size or not Es.size:
        return
    j = np.searchsorted(Es, ns, side="right") - 1
    jj = np.maximum(j, 0)
    dep = eo[jj]
    us, ue = union(S, E)
    u = np.searchsorted(us, pt, side="right") - 1
    busy = (u >= 0) & (ue[np.maximum(u, 0)] > pt)
    ok = (j >= 0) & busy & (issued[dep] <= pt) & (Es[jj] > pt) & (ns - Es[jj] <= XSTREAM_TOL_NS)
    if ok.any():
        b.edges(end_node[dep[ok]], nx[ok], ns[ok] - Es[jj][ok], end_fe[dep[ok]], E_IMPLICIT)


def build(con, job: str) -> dict:
    """The graph of every step of JOB (module docstring): node and edge columns, in-edges by node (CSR), the
    replay order, measured lags, and per step its start (the earliest rank's window start, aligned)."""
    d = read_job(con, job)
    ops, ya_, win, offs = d["ops"], d["syncs"], d["win"], d["offsets"]
    orank, wr, yr = _i64(ops["rank"]), _i64(win["rank"]), _i64(ya_["rank"])
    b = _Builder()
    b.ce, b.launch = [], []
    step_start: dict[int, int] = {}
    for r in np.unique(wr):
        r = int(r)
        o = int(offs.get(r, 0) or 0)
        a0, a1 = np.searchsorted(orank, [r, r + 1])
        sl = slice(a0, a1)
        S, E = _i64(ops["start_ns"][sl]) - o, _i64(ops["end_ns"][sl]) - o
        hl = np.asarray(ops["hl"][sl], bool)
        la = np.where(hl, _i64(ops["launch_ns"][sl]) - o, I64_MIN)
        dl = S[hl] - la[hl]
        dl = dl[dl >= 0]
        lat = int(dl.min()) if dl.size else 0
        stream, coll, th = _i64(ops["stream"][sl]), _i64(ops["gid"][sl]), _i64(ops["th"][sl])
        y0, y1 = np.searchsorted(yr, [r, r + 1])
        ys, ye = _i64(ya_["start_ns"][y0:y1]) - o, _i64(ya_["end_ns"][y0:y1]) - o
        yth = _i64(ya_["th"][y0:y1])
        w0_, w1_ = np.searchsorted(wr, [r, r + 1])
        w0s, w1s = _i64(win["start_ns"][w0_:w1_]) - o, _i64(win["end_ns"][w0_:w1_]) - o
        wst = _i64(win["step"][w0_:w1_])
        lo, hi = np.searchsorted(S, w0s), np.searchsorted(S, w1s)
        for w in range(w0s.size):
            a_, b_ = int(lo[w]), int(hi[w])
            if b_ <= a_:
                continue
            sink = bool(b_ < S.size and S[b_] == w1s[w])
            idx = np.arange(a_, b_ + sink)
            st = int(wst[w])
            _window_graph(b, r, st, int(w1s[w]), idx + a0, S[idx], E[idx], stream[idx], coll[idx], hl[idx],
                          la[idx], th[idx], sink, ys, ye, yth, lat)
            step_start[st] = min(step_start.get(st, I64_MAX), int(w0s[w]))
    _groups(b)
    nodes, edges = b.done()
    g = _order(nodes, edges, d["clock_tol"])
    g["step_start"] = step_start
    g["ops"] = ops
    g["grp_of"] = b.grp_of
    g["launch"] = b.launch
    g["offsets"] = offs
    return g


def _groups(b):
    """GA nodes: per (collective, step) with two members or more, the last arrival; member GS -> GA -> CE."""
    if not b.ce:
        b.grp_of = {}
        return
    ce = np.concatenate([c[0] for c in b.ce])
    gid = np.concatenate([c[1] for c in b.ce])
    gs = np.concatenate([c[2] for c in b.ce])
    st = np.concatenate([c[3] for c in b.ce])
    T = np.concatenate(b.cols["T"])
    o = np.lexsort((gid, st))
    ce, gid, gs, st = ce[o], gid[o], gs[o], st[o]
    new = np.concatenate(([True], (gid[1:] != gid[:-1]) | (st[1:] != st[:-1])))
    grp = np.cumsum(new) - 1
    cnt = np.bincount(grp)
    keep = cnt[grp] >= 2
    ce, gs, grp, st = ce[keep], gs[keep], grp[keep], st[keep]
    if not grp.size:
        b.grp_of = {}
        return
    u, grp = np.unique(grp, return_inverse=True)
    last = np.full(u.size, I64_MIN)
    np.maximum.at(last, grp, T[gs])
    first_st = np.zeros(u.size, np.int64)
    first_st[grp] = st
    ga = b.nodes(GA, -1, first_st, last)
    b.edges(gs, ga[grp], 0, 0, E_MEMBER)
    b.edges(ga[grp], ce, 0, 0, E_GA)
    b.grp_of = dict(zip(gs.tolist(), ga[grp].tolist()))


def _order(nodes, edges, clock_tol=0):
    """Replay order, kept edges, in-edges by node (CSR) and lags. An edge the measurement contradicts is left out,
    except a collective's last arrival -> its end on a rank by at most CLOCK_TOL (the clocks' uncertainty: a
    completion can only follow the last arrival, so the rank's lag there is negative and the path still crosses
    to the rank that arrived last). The order is by time, then by node class, raised along the edges so that
    every kept edge runs forward (an edge still against it after that, a zero-length cycle, is left out)."""
    n = nodes["T"].size
    T, typ = nodes["T"], nodes["typ"]
    cls = np.array([_CLASS[t] for t in range(6)], np.int64)[typ]
    src, dst, off, fe, kind = (edges[k] for k in ("src", "dst", "off", "fe", "kind"))
    out = T[src] + fe * nodes["dur"][src]
    ready = out + off
    cand = (ready <= T[dst]) | ((kind == E_GA) & (ready - T[dst] <= clock_tol))
    t0 = int(T.min()) if n else 0
    key = (T - t0) * 8 + cls
    # raise the keys along the candidate edges until each runs forward: at one instant a collective's end
    # precedes the op its stream (or another stream) starts then, though its own start precedes it
    us, ud = src[cand], dst[cand]
    for _ in range(64):
        need = key[us] >= key[ud]
        if not need.any():
            break
        np.maximum.at(key, ud[need], key[us[need]] + 1)
    order = np.lexsort((np.arange(n), key))
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    keep = cand & (pos[src] < pos[dst])
    src, dst, off, fe, kind, out, ready = (x[keep] for x in (src, dst, off, fe, kind, out, ready))
    eo = np.lexsort((kind, dst))
    src, dst, off, fe, kind, out, ready = (x[eo] for x in (src, dst, off, fe, kind, out, ready))
    best = np.full(n, I64_MIN)
    np.maximum.at(best, dst, ready)
    source = best == I64_MIN
    lag = np.where(source, 0, T - best)
    ptr = np.zeros(n + 1, np.int64)
    np.add.at(ptr, dst + 1, 1)
    ptr = np.cumsum(ptr)
    return {"nodes": nodes, "src": src, "dst": dst, "off": off, "fe": fe, "kind": kind, "out": out,
            "ptr": ptr, "order": order, "lag": lag, "source": source}


def cap_groups(g, grp_of, launch):
    """Per node: the GA node of the collective an H node launches (-1 otherwise) and its launch-to-start time;
    per GS node of a collective member, its GA node (-1 otherwise)."""
    n = g["nodes"]["T"].size
    gs_grp = np.full(n, -1, np.int64)
    if grp_of:
        k = np.fromiter(grp_of.keys(), np.int64)
        gs_grp[k] = np.fromiter(grp_of.values(), np.int64)
    h_grp = np.full(n, -1, np.int64)
    h_lat = np.zeros(n, np.int64)
    for hn, coll, gs, lat in launch:
        m = coll >= 0
        h_grp[hn[m]] = gs_grp[gs[m]]
        h_lat[hn[m]] = lat[m]
    return gs_grp, h_grp, h_lat


@nb.njit(cache=True, nogil=True)
def replay(order, ptr, src, off, fe, on, T, lag, dur, source, gs_grp, h_grp, h_lat, cap):
    """Node times: max over enabled in-edges of (pred time [+ pred duration] + offset) + lag, in ORDER; a node
    with no enabled in-edge keeps its measured time. CAP: a launch of a collective happens no later than the
    group's earliest member arrived so far (minus its launch-to-start time). Returns (times, binding edge: -1 none,
    -2 - node where a cap made the node follow that member's arrival)."""
    n = T.size
    t = np.empty(n, np.int64)
    best = np.full(n, -1, np.int64)
    gmin = np.full(n, I64_MAX, np.int64)
    gnode = np.full(n, -1, np.int64)
    for i in range(n):
        v = order[i]
        m = I64_MIN
        be = -1
        if not source[v]:
            for e in range(ptr[v], ptr[v + 1]):
                if not on[e]:
                    continue
                u = src[e]
                r = t[u] + off[e]
                if fe[e]:
                    r += dur[u]
                if r > m:
                    m = r
                    be = e
        if be < 0:
            t[v] = T[v]
        else:
            t[v] = m + lag[v]
            best[v] = be
        if cap and h_grp[v] >= 0:
            gm = gmin[h_grp[v]]
            if gm < I64_MAX and gm - h_lat[v] < t[v]:
                t[v] = gm - h_lat[v]
                best[v] = -2 - gnode[h_grp[v]]  # the path follows the earliest member
        if gs_grp[v] >= 0 and t[v] < gmin[gs_grp[v]]:
            gmin[gs_grp[v]] = t[v]
            gnode[gs_grp[v]] = v
    return t, best
