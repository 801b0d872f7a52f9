"""The cross-rank critical path of every step: the longest chain of the step graph (ninefold.analysis.step_graph) from the
step's start (the earliest rank's window start, aligned) to its end (the latest rank's window end).

Walking back from the latest sink along each node's binding in-edge gives pieces: a GPU op running, the wait
before an op (its lag), a collective's transfer after the last arrival, a launch's latency, the host's own time
between two calls on a thread, a synchronize's wake-up, and before the path's first node a gap. Where a
collective's last arrival binds, the path leaves the rank for the rank that arrived last. Each piece is split by
its rank's ledger partition of that step (ledger_intervals, aligned) and carries the ledger the partition holds
there, so the path never charges a rank's ledger more than the rank's own step does. Host-side pieces keep io,
idle, bubble and host where the GPU waited; where the GPU was busy the host was waiting on it (a busy-poll, an
implicit sync) or running ahead, and the piece is the GPU op running there. Time outside the rank's own step
window (before it began the step, after it ended it) is a gap on the rank whose window holds it. Stored in
``critical_path``; pieces are contiguous in aligned time and cover the step exactly.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ninefold.analysis.intervals import i64 as _i64
from ninefold.analysis.intervals import union
from ninefold.analysis.ledgers import LEDGER_ID, LEDGERS
from ninefold.analysis import step_graph as sg
from ninefold.store.connection import append_arrow
from ninefold.store.connection import has_table

DDL = {"critical_path": """job VARCHAR, step INTEGER, seq INTEGER, rank INTEGER, kind VARCHAR, op_name VARCHAR,
                           start_ns BIGINT, end_ns BIGINT, aligned_start_ns BIGINT, aligned_end_ns BIGINT,
                           ledger VARCHAR"""}
KINDS = ("op", "transfer", "wait", "launch", "host", "sync", "gap")
K_OP, K_TRANSFER, K_WAIT, K_LAUNCH, K_HOST, K_SYNC, K_GAP = range(7)
# the piece a node's lag is, by node type (GS CE GA H HE SINK), and an edge's offset, by edge kind
LAG_KIND = np.array([K_WAIT, K_TRANSFER, K_WAIT, K_HOST, K_SYNC, K_WAIT], np.int64)
OFF_KIND = np.full(sg.E_SINK + 1, K_WAIT, np.int64)
OFF_KIND[[sg.E_LAUNCH, sg.E_HOST, sg.E_SYNC_H, sg.E_SYNC_G, sg.E_IMPLICIT]] = [K_LAUNCH, K_HOST, K_SYNC, K_SYNC, K_SYNC]
# ledgers where the GPU is running an op, and the pieces that are the host's (or nobody's) time
BUSY = np.array([LEDGER_ID[x] for x in ("compute", "recompute", "exposed_comm", "memcpy", "straggler")])
HOST_SIDE = np.array([K_LAUNCH, K_HOST, K_SYNC, K_GAP])


class CriticalPathError(Exception):
    pass


def ensure_tables(con):
    for t, cols in DDL.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({cols})")


@nb.njit(cache=True, nogil=True)
def walk(sink, t0, t, best, src, fe, off, kind, dur, lag, typ, rank, lag_kind, off_kind):
    """Pieces (rank, kind, node, start, end) of the path ending at SINK, latest first, clipped to [T0, t[sink]]
    and to each other (contiguous, never overlapping)."""
    cap = 64
    out = np.empty((cap, 5), np.int64)
    k = 0
    v = sink
    cur = t[sink]
    for _ in range(4 * t.size + 4):
        if cur <= t0:
            break
        for piece in range(3):
            if piece == 0:
                pr, pk, pn, a, b = rank[v], lag_kind[typ[v]], v, t[v] - lag[v], t[v]
            else:
                e = best[v]
                if e < 0:
                    break
                u = src[e]
                base = t[u] + (dur[u] if fe[e] else 0)
                if piece == 1:
                    pr, pk, pn, a, b = rank[v], off_kind[kind[e]], v, base, base + off[e]
                else:
                    if not fe[e]:
                        break
                    pr, pk, pn, a, b = rank[u], 0, u, t[u], base
            b = min(b, cur)
            a = max(a, t0)
            if b > a and pr >= 0:
                if k == cap:
                    cap *= 2
                    nw = np.empty((cap, 5), np.int64)
                    nw[:k] = out[:k]
                    out = nw
                out[k, 0], out[k, 1], out[k, 2], out[k, 3], out[k, 4] = pr, pk, pn, a, b
                k += 1
                cur = a
        e = best[v]
        if e == -1:
            break
        v = src[e] if e >= 0 else -2 - e
    if cur > t0:  # before the path's first node
        r = rank[v] if rank[v] >= 0 else 0
        if k == cap:
            nw = np.empty((cap + 1, 5), np.int64)
            nw[:k] = out[:k]
            out = nw
        out[k, 0], out[k, 1], out[k, 2], out[k, 3], out[k, 4] = r, 6, v, t0, cur
        k += 1
    return out[:k]


@nb.njit(cache=True, nogil=True)
def split(pr, pa, pb, rptr, ls, le):
    """Each piece [pa, pb) on rank pr cut by that rank's ledger intervals (rows rptr[r]..rptr[r+1] of ls/le,
    sorted, disjoint). Returns (piece index, interval row or -1 where none holds the time, start, end)."""
    n = pr.size
    cap = 2 * n + 16
    out = np.empty((cap, 4), np.int64)
    k = 0
    for i in range(n):
        r = pr[i]
        lo, hi = rptr[r], rptr[r + 1]
        # first interval ending after pa
        a, b = lo, hi
        while a < b:
            m = (a + b) // 2
            if le[m] <= pa[i]:
                a = m + 1
            else:
                b = m
        x = pa[i]
        j = a
        while x < pb[i]:
            if j < hi and ls[j] <= x:
                y = min(le[j], pb[i])
                row = j
                j += 1
            else:
                y = pb[i] if j >= hi else min(ls[j], pb[i])
                row = -1
            if y > x:
                if k == cap:
                    cap *= 2
                    nw = np.empty((cap, 4), np.int64)
                    nw[:k] = out[:k]
                    out = nw
                out[k, 0], out[k, 1], out[k, 2], out[k, 3] = i, row, x, y
                k += 1
            x = y
    return out[:k]


def _ledger_intervals(con, job, offsets):
    """{step: (rptr by rank, starts, ends, ledger ids, op names)} of JOB's ledger intervals, aligned, and
    {step: {rank: (window start, window end)}} of its step windows, aligned."""
    li = con.execute("SELECT step, rank, ledger, start_ns, end_ns, op_name FROM ledger_intervals WHERE job = ? "
                     "ORDER BY step, rank, start_ns", [job]).fetchnumpy()
    ws = con.execute("SELECT step, rank, start_ns, end_ns FROM step_windows WHERE job = ?", [job]).fetchall()
    off = {int(r): int(o or 0) for r, o in offsets.items()}
    wins: dict = {}
    for st, r, a, b in ws:
        wins.setdefault(int(st), {})[int(r)] = (int(a) - off.get(int(r), 0), int(b) - off.get(int(r), 0))
    lst, lr = _i64(li["step"]), _i64(li["rank"])
    shift = np.array([off.get(int(r), 0) for r in lr], np.int64) if lr.size else np.zeros(0, np.int64)
    lab = np.array([LEDGER_ID[x] for x in li["ledger"]], np.int64) if lr.size else np.zeros(0, np.int64)
    ls, le = _i64(li["start_ns"]) - shift, _i64(li["end_ns"]) - shift
    names = np.asarray(li["op_name"], dtype=object)
    rmax = max([int(lr.max()) if lr.size else 0] + [max(w) for w in wins.values() if w]) + 1
    out = {}
    for st in np.unique(lst):
        a, b = np.searchsorted(lst, [st, st + 1])
        rptr = a + np.searchsorted(lr[a:b], np.arange(rmax + 1))
        out[int(st)] = (rptr, ls, le, lab, names)
    return out, wins


def _place(p, wins):
    """Pieces (rank, kind, node, start, end) with the time outside their rank's step window moved to the ranks
    whose window holds it: before the rank's window to the rank that opened the step first, after it to the rank
    that closed it last (as gaps: the path's rank had not begun the step, or had ended it). The partition of a
    rank's step charges only that rank's window, so no rank is charged the path's time outside its own step."""
    if not wins:
        return p
    w0 = np.array([wins.get(int(r), (0, 0))[0] for r in p[:, 0]], np.int64)
    w1 = np.array([wins.get(int(r), (0, 0))[1] for r in p[:, 0]], np.int64)
    inside = (p[:, 3] >= w0) & (p[:, 4] <= w1) & np.isin(p[:, 0], list(wins))
    if inside.all():
        return p
    openers = sorted(wins, key=lambda r: (wins[r][0], r))
    closers = sorted(wins, key=lambda r: (-wins[r][1], r))
    out = []
    for i in range(p.shape[0]):
        r, k, v, a, b = (int(x) for x in p[i])
        if inside[i]:
            out.append((r, k, v, a, b))
            continue
        lo, hi = wins.get(r, (b, b))
        parts = [(max(a, lo), min(b, hi), True)] if r in wins else []
        parts += [(a, min(b, lo), False), (max(a, hi), b, False)]
        for x, y, own in sorted(parts):
            if y <= x:
                continue
            if own:
                out.append((r, k, v, x, y))
                continue
            while x < y:
                cands = openers if x < lo else closers
                q = next((q for q in cands if wins[q][0] <= x < wins[q][1]), None)
                if q is None:  # no rank's window holds it: left on the path's rank, uncharged
                    nxt = min([wins[q][0] for q in wins if wins[q][0] > x] + [y])
                    out.append((r, K_GAP, -1, x, nxt))
                    x = nxt
                else:
                    e = min(y, wins[q][1])
                    out.append((q, K_GAP, -1, x, e))
                    x = e
    return np.array(out, np.int64).reshape(-1, 5)


def paths(g, t, best, lag, dur, off, steps=None):
    """{step: pieces array (rank, kind, node, start, end), earliest first} of the replayed graph G (times T,
    bindings BEST, the lags/durations/offsets the replay used)."""
    nodes = g["nodes"]
    sinks = np.flatnonzero(nodes["typ"] == sg.SINK)
    out = {}
    for st in sorted(g["step_start"]):
        if steps is not None and st not in steps:
            continue
        sk = sinks[nodes["step"][sinks] == st]
        if not sk.size:
            continue
        end = sk[np.argmax(t[sk])]
        p = walk(int(end), int(g["step_start"][st]), t, best, g["src"], g["fe"], off, g["kind"], dur, lag,
                 nodes["typ"], nodes["rank"], LAG_KIND, OFF_KIND)
        out[st] = p[::-1]
    return out


def on_gpu_kinds(g, t, dur, pieces):
    """The kinds of PIECES (a path of the graph G replayed to times T with durations DUR) with every host-side
    part over a GPU op of its rank in that replay counted as that op: the projected timeline has no ledger
    partition, so its GPU ops' union is the busy time (the measured path, critical_path, uses the partition).
    Returns (kind, start, end) rows, pieces cut where that changes."""
    n = g["nodes"]
    gs = np.flatnonzero(n["typ"] == sg.GS)
    gr, a, b = n["rank"][gs], t[gs], t[gs] + dur[gs]
    o = np.lexsort((a, gr))
    gr, a, b = gr[o], a[o], b[o]
    rmax = int(max(gr.max() if gr.size else 0, pieces[:, 0].max() if pieces.size else 0)) + 1
    us, ue, ur = [], [], []
    for r in np.unique(gr):
        m = gr == r
        s_, e_ = union(a[m], b[m])
        us.append(s_)
        ue.append(e_)
        ur.append(np.full(s_.size, r, np.int64))
    us, ue, ur = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (us, ue, ur))
    rptr = np.searchsorted(ur, np.arange(rmax + 1))
    cut = split(pieces[:, 0], pieces[:, 3], pieces[:, 4], rptr, _i64(us), _i64(ue))
    kind = pieces[cut[:, 0], 1].copy()
    kind[np.isin(kind, HOST_SIDE) & (cut[:, 1] >= 0)] = K_OP
    return np.stack([kind, cut[:, 2], cut[:, 3]], axis=1) if cut.size else np.zeros((0, 3), np.int64)


def _names(g, pieces):
    ops, nodes = g["ops"], g["nodes"]
    nd = pieces[:, 2]
    opn = np.where(nd >= 0, nodes["op"][np.maximum(nd, 0)], -1)
    names = np.asarray(ops["name"], dtype=object)
    typ = np.where(nd >= 0, nodes["typ"][np.maximum(nd, 0)], -1)
    res = np.where(opn >= 0, names[np.maximum(opn, 0)] if names.size else "", None)
    res = np.where((opn < 0) & (typ == sg.HE), "synchronize", res)
    res = np.where((opn < 0) & (typ == sg.H), "synchronize", res)
    return res


def critical_path(con, job: str, steps=None, store: bool = True) -> dict:
    """The critical path of each step of JOB (all, or STEPS): rows (stored in ``critical_path`` when STORE) and
    per step its window, length per ledger and per rank. Needs an attributed job."""
    n_win = con.execute("SELECT count(*) FROM step_windows WHERE job = ?", [job]).fetchall()[0][0] \
        if has_table(con, "step_windows") else 0
    if not n_win:
        raise CriticalPathError(sg.no_windows_reason(con, job))
    g = sg.build(con, job)
    n = g["nodes"]
    on = np.ones(g["src"].size, bool)
    gs_grp = np.full(n["T"].size, -1, np.int64)
    t, best = sg.replay(g["order"], g["ptr"], g["src"], g["off"], g["fe"], on, n["T"], g["lag"], n["dur"],
                        g["source"], gs_grp, gs_grp, np.zeros_like(gs_grp), False)
    ps = paths(g, t, best, g["lag"], n["dur"], g["off"], steps)
    if steps is not None and not ps:
        raise CriticalPathError(f"job {job!r} has no step {', '.join(map(str, sorted(steps)))}")
    ivs, wins = _ledger_intervals(con, job, g["offsets"])
    rows, summary = [], []
    for st, p in ps.items():
        step_rows = _charge(g, _place(p, wins.get(st, {})), ivs.get(st))
        step_rows["step"] = st
        rows.append(step_rows)
        summary.append(_summary(st, step_rows, g["step_start"][st], int(t[_sink_end(g, t, st)])))
    if store:
        _store(con, job, rows, steps)
    return {"steps": summary, "rows": rows}


def _charge(g, p, iv):
    """The rows of one step's pieces P cut by their rank's ledger intervals IV of that step: each part carries the
    ledger the rank's partition holds there (none, NULL, where no rank's step window holds the time). A host-side
    part (the host's own time, a launch, a synchronize's wake-up, a gap) over GPU work (a busy ledger) is the GPU
    op running there, with its name: the host was waiting on it or running ahead of it, and the GPU, not the
    host, set the time."""
    if iv is None:
        rptr, ls, le = np.zeros(int(p[:, 0].max()) + 2 if p.size else 1, np.int64), np.zeros(0, np.int64), \
            np.zeros(0, np.int64)
        lab, inames = np.zeros(0, np.int64), np.zeros(0, dtype=object)
    else:
        rptr, ls, le, lab, inames = iv
        if p.size and int(p[:, 0].max()) + 1 >= rptr.size:
            rptr = np.concatenate([rptr, np.full(int(p[:, 0].max()) + 2 - rptr.size, rptr[-1])])
    cut = split(p[:, 0], p[:, 3], p[:, 4], rptr, ls, le)
    pc = p[cut[:, 0]]
    row = cut[:, 1]
    led = np.where(row >= 0, lab[np.maximum(row, 0)] if lab.size else -1, -1)
    names = _names(g, pc)
    kind = pc[:, 1].copy()
    on_gpu = np.isin(kind, HOST_SIDE) & np.isin(led, BUSY) & (row >= 0)
    kind[on_gpu] = K_OP
    names[on_gpu] = inames[row[on_gpu]]
    rk = pc[:, 0]
    offv = np.array([int(g["offsets"].get(int(r), 0) or 0) for r in rk], np.int64)
    a, b = cut[:, 2], cut[:, 3]
    keep = _coalesce(rk, kind, led, names, a, b)
    starts = a[keep]
    ends = np.append(starts[1:], b[-1]) if keep.size else b[keep]
    return {"rank": rk[keep], "kind": [KINDS[k] for k in kind[keep]], "op_name": names[keep],
            "start_ns": starts + offv[keep], "end_ns": ends + offv[keep], "aligned_start_ns": starts,
            "aligned_end_ns": ends, "ledger": [LEDGERS[x] if x >= 0 else None for x in led[keep]]}


def _sink_end(g, t, st):
    n = g["nodes"]
    sk = np.flatnonzero((n["typ"] == sg.SINK) & (n["step"] == st))
    return sk[np.argmax(t[sk])]


def _coalesce(rank, kind, lab, names, a, b):
    """Indices of the pieces that start a run of one rank, kind, ledger and op."""
    if not a.size:
        return np.zeros(0, np.int64)
    same = (rank[1:] == rank[:-1]) & (kind[1:] == kind[:-1]) & (lab[1:] == lab[:-1]) & \
        (names[1:] == names[:-1]) & (a[1:] == b[:-1])
    return np.flatnonzero(np.concatenate(([True], ~same)))


def _summary(st, r, t0, t1):
    d = r["aligned_end_ns"] - r["aligned_start_ns"]
    led, rk = np.asarray(r["ledger"], dtype=object), r["rank"]
    by_l = {x: int(d[led == x].sum()) for x in LEDGERS}
    by_r = {int(x): int(d[rk == x].sum()) for x in np.unique(rk)}
    items: dict = {}
    for i in range(d.size):
        what = r["op_name"][i] if r["kind"][i] in ("op", "transfer") else r["kind"][i]
        key = (int(rk[i]), r["ledger"][i] or "-", what)
        items[key] = items.get(key, 0) + int(d[i])
    top = sorted(items.items(), key=lambda kv: -kv[1])[:10]
    return {"step": st, "start_ns": t0, "end_ns": t1, "window_ns": t1 - t0, "length_ns": int(d.sum()),
            "pieces": int(d.size), "ledgers": by_l, "ranks": by_r,
            "top": [{"rank": k[0], "ledger": k[1], "what": k[2], "ns": v} for k, v in top]}


def _store(con, job, rows, steps):
    import pyarrow as pa

    ensure_tables(con)
    if steps is None:
        con.execute("DELETE FROM critical_path WHERE job = ?", [job])
    else:
        con.execute("DELETE FROM critical_path WHERE job = ? AND list_contains(?::INTEGER[], step)",
                    [job, sorted(steps)])
    for r in rows:
        n = r["rank"].size
        tb = pa.table({"step": pa.array([r["step"]] * n, pa.int32()),
                       "seq": pa.array(np.arange(n), pa.int32()), "rank": pa.array(r["rank"], pa.int32()),
                       "kind": pa.array(r["kind"], pa.string()),
                       "op_name": pa.array(list(r["op_name"]), pa.string()),
                       "start_ns": r["start_ns"], "end_ns": r["end_ns"], "aligned_start_ns": r["aligned_start_ns"],
                       "aligned_end_ns": r["aligned_end_ns"], "ledger": pa.array(r["ledger"], pa.string())})
        append_arrow(con, "critical_path", tb, job)  # one per step: none is held until the caller's commit


def step_pieces(con, job: str, step: int | None):
    """The critical path of STEP as rows (rank, kind, op_name, start_ns, end_ns relative to the step's start,
    ledger): the stored rows, else computed without storing (a read-only caller); None when there is none."""
    if step is None:
        return None
    if has_table(con, "critical_path"):
        rows = con.execute("SELECT rank, kind, op_name, aligned_start_ns, aligned_end_ns, ledger FROM critical_path "
                           "WHERE job = ? AND step = ? ORDER BY seq", [job, step]).fetchall()
        if rows:
            t0 = rows[0][3]
            return [(r, k, op, s - t0, e - t0, led) for r, k, op, s, e, led in rows]
    try:
        res = critical_path(con, job, steps={step}, store=False)
    except CriticalPathError:
        return None
    if not res["rows"]:
        return None
    r = res["rows"][0]
    t0 = int(r["aligned_start_ns"][0])
    return list(zip(r["rank"].tolist(), r["kind"], list(r["op_name"]), (r["aligned_start_ns"] - t0).tolist(),
                    (r["aligned_end_ns"] - t0).tolist(), r["ledger"]))
