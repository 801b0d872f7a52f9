"""Waits at collectives, per collective and rank, and how each wait was charged.

For every collective kernel that attribution matched across ranks (``collective_matches``): its aligned
arrival, the last member's arrival, the wait (last arrival − own arrival), how that wait was charged in the
ledgers (straggler, bubble, or hidden under compute/recompute), and the transfer time after the last arrival.
Beside it, TraceLens's per-rank wait for the same kernel — its duration minus the shortest duration of the same
collective across ranks, overlap with compute not removed — so the two verdicts can be compared line by line.
Also the comm–compute overlap per rank: the share of communication kernel time that compute kernels hide (as HTA
reports it), over the step windows.
"""
from __future__ import annotations

import numpy as np

from analysis.intervals import union

CHARGED = ("straggler", "bubble", "hidden")


def _cum(starts, ends):
    """For disjoint intervals sorted by start: F(t) = time of the intervals before t."""
    cum = np.concatenate(([0], np.cumsum(ends - starts)))

    def F(t):
        i = np.searchsorted(starts, t, side="right")
        over = np.where(i > 0, np.maximum(ends[np.maximum(i - 1, 0)] - t, 0), 0)
        return cum[i] - over
    return F


def waits(con, job: str) -> dict:
    """{"rows": per collective and rank, "ranks": per-rank summary}; times in ns (arrivals aligned to rank 0's
    clock, relative to the job's first matched arrival)."""
    m = con.execute("""SELECT rank, gid, coalesce(pg_name, '') AS pg, coll, coalesce(seq, -1) AS seq,
                              coalesce(ord, -1) AS ord, start_ns, end_ns, arrival_ns, last_arrival_ns, n_members,
                              min_member_ns
                       FROM collective_matches WHERE job = ? AND matched
                       ORDER BY rank, start_ns, gid""", [job]).fetchnumpy()
    n = len(m["rank"])
    rows: list[dict] = []
    if n == 0:
        return {"rows": rows, "ranks": []}
    rank = np.asarray(m["rank"], dtype=np.int64)
    s, e = np.asarray(m["start_ns"], np.int64), np.asarray(m["end_ns"], np.int64)
    arr, last = np.asarray(m["arrival_ns"], np.int64), np.asarray(m["last_arrival_ns"], np.int64)
    wait = np.maximum(last - arr, 0)
    w_end = np.minimum(s + wait, e)  # the wait in the rank's own clock: [start, w_end)
    charged = {k: np.zeros(n, dtype=np.int64) for k in CHARGED}
    li = con.execute("""SELECT rank, ledger, start_ns, end_ns FROM ledger_intervals WHERE job = ?
                        AND ledger IN ('straggler', 'bubble', 'compute', 'recompute') ORDER BY rank, start_ns""",
                     [job]).fetchnumpy()
    lr = np.asarray(li["rank"], np.int64)
    led = np.asarray(li["ledger"], dtype=object)
    ls, le = np.asarray(li["start_ns"], np.int64), np.asarray(li["end_ns"], np.int64)
    for r in np.unique(rank):
        sel = np.flatnonzero(rank == r)
        a, b = np.searchsorted(lr, [r, r + 1])
        for key, names in (("straggler", ("straggler",)), ("bubble", ("bubble",)),
                           ("hidden", ("compute", "recompute"))):
            k = np.flatnonzero(np.isin(led[a:b], names)) + a
            if k.size:
                us, ue = union(ls[k], le[k])
                F = _cum(us, ue)
                charged[key][sel] = F(w_end[sel]) - F(s[sel])
    t0 = int(arr.min())
    transfer = np.maximum(e - w_end, 0)
    tl = (e - s) - np.asarray(m["min_member_ns"], np.int64)
    for i in range(n):
        seq = int(m["seq"][i])
        rows.append({
            "rank": int(rank[i]), "pg": m["pg"][i] or None, "coll": m["coll"][i],
            "seq": seq if seq >= 0 else None, "ord": int(m["ord"][i]) if int(m["ord"][i]) >= 0 else None,
            "members": int(m["n_members"][i]), "arrival_ns": int(arr[i] - t0), "last_arrival_ns": int(last[i] - t0),
            "wait_ns": int(wait[i]), **{f"{k}_ns": int(charged[k][i]) for k in CHARGED},
            "transfer_ns": int(transfer[i]), "tracelens_wait_ns": int(tl[i])})
    ranks = []
    for r in np.unique(rank):
        sel = rank == r
        ranks.append({"rank": int(r), "collectives": int(sel.sum()), "wait_ns": int(wait[sel].sum()),
                      **{f"{k}_ns": int(charged[k][sel].sum()) for k in CHARGED},
                      "transfer_ns": int(transfer[sel].sum()), "tracelens_wait_ns": int(tl[sel].sum())})
    return {"rows": rows, "ranks": ranks}


def comm_compute_overlap(con, job: str) -> list[dict]:
    """Per rank: communication kernel time inside the step windows, the part of it that compute kernels overlap,
    and their ratio (HTA's comm-comp overlap)."""
    k = con.execute("""SELECT g.rank, kc.family = 'comm' AS comm, g.start_ns, g.end_ns
                       FROM gpu_ops g JOIN kernel_classes kc ON kc.job = g.job AND kc.name = g.name
                       WHERE g.job = ? AND g.kind = 'kernel' AND kc.family <> 'copy'""", [job]).fetchnumpy()
    w = con.execute("SELECT rank, start_ns, end_ns FROM step_windows WHERE job = ?", [job]).fetchnumpy()
    kr, comm = np.asarray(k["rank"], np.int64), np.asarray(k["comm"], dtype=bool)
    ks, ke = np.asarray(k["start_ns"], np.int64), np.asarray(k["end_ns"], np.int64)
    wr = np.asarray(w["rank"], np.int64)
    ws, we = np.asarray(w["start_ns"], np.int64), np.asarray(w["end_ns"], np.int64)
    out = []
    for r in np.unique(wr):
        W = union(ws[wr == r], we[wr == r])
        cw = _inter(*union(ks[(kr == r) & comm], ke[(kr == r) & comm]), *W)
        comp = union(ks[(kr == r) & ~comm], ke[(kr == r) & ~comm])
        comm_ns, hidden = _len(*cw), _len(*_inter(*cw, *comp))
        out.append({"rank": int(r), "comm_ns": comm_ns, "hidden_ns": hidden,
                    "overlap": (hidden / comm_ns) if comm_ns else None})
    return out


def _len(s, e):
    return int((e - s).sum()) if len(s) else 0


def _inter(as_, ae, bs, be):
    """Intersection of two disjoint sorted unions, as a disjoint sorted union."""
    pts = np.concatenate([as_, ae, bs, be])
    delta = np.concatenate([np.ones(as_.size), -np.ones(ae.size), np.ones(bs.size), -np.ones(be.size)])
    o = np.lexsort((delta, pts))  # at a shared instant, ends (-1) before starts: touching is not overlap
    pts, depth = pts[o], np.cumsum(delta[o])
    st = np.flatnonzero(depth == 2)
    return pts[st], pts[st + 1]
