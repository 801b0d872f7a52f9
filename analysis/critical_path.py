"""The cross-rank critical path of every step: the longest chain of the step graph (analysis.step_graph) from the
step's start (the earliest rank's window start, aligned) to its end (the latest rank's window end).

Walking back from the latest sink along each node's binding in-edge gives pieces: a GPU op running, the wait
before an op (its lag), a collective's transfer after the last arrival, a launch's latency, the host's own time
between two calls on a thread, a synchronize's wake-up, and before the path's first node a gap. Where a
collective's last arrival binds, the path leaves the rank for the rank that arrived last. Each piece is split by
its rank's ledger partition (ledger_intervals, aligned); host pieces keep io, idle, bubble and host where the
GPU waited, and are host where the GPU was busy. Stored in ``critical_path``; pieces are contiguous in aligned
time and cover the step exactly.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from analysis.intervals import i64 as _i64
from analysis.ledgers import LEDGER_ID, LEDGERS
from analysis import step_graph as sg
from store.connection import append_arrow

DDL = {"critical_path": """job VARCHAR, step INTEGER, seq INTEGER, rank INTEGER, kind VARCHAR, op_name VARCHAR,
                           start_ns BIGINT, end_ns BIGINT, aligned_start_ns BIGINT, aligned_end_ns BIGINT,
                           ledger VARCHAR"""}
KINDS = ("op", "transfer", "wait", "launch", "host", "sync", "gap")
K_OP, K_TRANSFER, K_WAIT, K_LAUNCH, K_HOST, K_SYNC, K_GAP = range(7)
# the piece a node's lag is, by node type (GS CE GA H HE SINK), and an edge's offset, by edge kind
LAG_KIND = np.array([K_WAIT, K_TRANSFER, K_WAIT, K_HOST, K_SYNC, K_WAIT], np.int64)
OFF_KIND = np.full(10, K_WAIT, np.int64)
OFF_KIND[[sg.E_LAUNCH, sg.E_HOST, sg.E_SYNC_H, sg.E_SYNC_G]] = [K_LAUNCH, K_HOST, K_SYNC, K_SYNC]
BUSY = np.array([LEDGER_ID[x] for x in ("compute", "recompute", "exposed_comm", "memcpy", "straggler")])


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
def split(pr, pk, pa, pb, rptr, ls, le, ll, busy_to_host, host_id, idle_id, default):
    """Each piece [pa, pb) on rank pr cut by that rank's ledger intervals (rows rptr[r]..rptr[r+1] of ls/le/ll,
    sorted, disjoint); time outside them gets DEFAULT[kind]. Host-kind pieces over busy ledgers count as host.
    Returns (piece index, ledger, start, end)."""
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
                lab = ll[j]
                j += 1
            else:
                y = pb[i] if j >= hi else min(ls[j], pb[i])
                lab = default[pk[i]]
            if busy_to_host[pk[i]] and (lab == 0 or lab == 1 or lab == 3 or lab == 4 or lab == 7):
                lab = host_id
            if y > x:
                if k == cap:
                    cap *= 2
                    nw = np.empty((cap, 4), np.int64)
                    nw[:k] = out[:k]
                    out = nw
                out[k, 0], out[k, 1], out[k, 2], out[k, 3] = i, lab, x, y
                k += 1
            x = y
    return out[:k]


def _ledger_intervals(con, job, offsets, ranks):
    li = con.execute("SELECT rank, ledger, start_ns, end_ns FROM ledger_intervals WHERE job = ? "
                     "ORDER BY rank, start_ns", [job]).fetchnumpy()
    lr = _i64(li["rank"])
    off = np.array([int(offsets.get(int(r), 0) or 0) for r in lr], np.int64) if lr.size else np.zeros(0, np.int64)
    lab = np.array([LEDGER_ID[x] for x in li["ledger"]], np.int64) if lr.size else np.zeros(0, np.int64)
    rmax = max(int(ranks.max()) if ranks.size else 0, int(lr.max()) if lr.size else 0) + 1
    rptr = np.searchsorted(lr, np.arange(rmax + 1))
    return rptr, _i64(li["start_ns"]) - off, _i64(li["end_ns"]) - off, lab


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


def _names(g, pieces):
    ops, nodes = g["ops"], g["nodes"]
    opn = nodes["op"][pieces[:, 2]]
    names = np.asarray(ops["name"], dtype=object)
    typ = nodes["typ"][pieces[:, 2]]
    res = np.where(opn >= 0, names[np.maximum(opn, 0)] if names.size else "", None)
    res = np.where((opn < 0) & (typ == sg.HE), "synchronize", res)
    res = np.where((opn < 0) & (typ == sg.H), "synchronize", res)
    return res


def critical_path(con, job: str, steps=None, store: bool = True) -> dict:
    """The critical path of each step of JOB (all, or STEPS): rows (stored in ``critical_path`` when STORE) and
    per step its window, length per ledger and per rank. Needs an attributed job."""
    n_win = con.execute("SELECT count(*) FROM step_windows WHERE job = ?", [job]).fetchall()[0][0] \
        if _has(con, "step_windows") else 0
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
    rptr, ls, le, ll = _ledger_intervals(con, job, g["offsets"], np.unique(n["rank"]))
    default = np.array([LEDGER_ID[x] for x in ("compute", "exposed_comm", "idle", "host", "host", "host",
                                               "idle")], np.int64)
    to_host = np.array([0, 0, 0, 1, 1, 1, 0], np.bool_)
    rows, summary = [], []
    for st, p in ps.items():
        cut = split(p[:, 0], p[:, 1], p[:, 3], p[:, 4], rptr, ls, le, ll, to_host, LEDGER_ID["host"],
                    LEDGER_ID["idle"], default)
        pc = p[cut[:, 0]]
        names = _names(g, pc)
        rk = pc[:, 0]
        offv = np.array([int(g["offsets"].get(int(r), 0) or 0) for r in rk], np.int64)
        a, b = cut[:, 2], cut[:, 3]
        keep = _coalesce(rk, pc[:, 1], cut[:, 1], names, a, b)
        starts = a[keep]
        ends = np.append(starts[1:], b[-1]) if keep.size else b[keep]
        step_rows = {"step": st, "rank": rk[keep], "kind": [KINDS[k] for k in pc[keep, 1]], "op_name": names[keep],
                     "start_ns": starts + offv[keep], "end_ns": ends + offv[keep], "aligned_start_ns": starts,
                     "aligned_end_ns": ends, "ledger": [LEDGERS[x] for x in cut[keep, 1]]}
        rows.append(step_rows)
        summary.append(_summary(st, step_rows, g["step_start"][st], int(t[_sink_end(g, t, st)])))
    if store:
        _store(con, job, rows, steps)
    return {"steps": summary, "rows": rows}


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
        key = (int(rk[i]), r["ledger"][i], r["op_name"][i] if r["kind"][i] in ("op", "transfer") else r["kind"][i])
        items[key] = items.get(key, 0) + int(d[i])
    top = sorted(items.items(), key=lambda kv: -kv[1])[:10]
    return {"step": st, "start_ns": t0, "end_ns": t1, "window_ns": t1 - t0, "length_ns": int(d.sum()),
            "pieces": int(d.size), "ledgers": by_l, "ranks": by_r,
            "top": [{"rank": k[0], "ledger": k[1], "what": k[2], "ns": v} for k, v in top]}


def _has(con, table):
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                            [table]).fetchall()[0][0])


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
