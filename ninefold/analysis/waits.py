"""Waits at collectives, per collective and rank, and how each wait was charged.

For every collective kernel that attribution stored in ``collective_matches`` (matched across ranks by process
group and sequence, or by order): its aligned arrival, the last member's arrival, the wait (last arrival − own
arrival; none for a kernel no peer matched), how that wait was charged in the ledgers (straggler, bubble, or hidden
under compute/recompute), and the transfer time after the last arrival. Beside it, TraceLens's per-rank wait for
the same kernel — its duration minus the shortest duration of the same collective across ranks, overlap with
compute not removed — so the two verdicts can be compared line by line. ``collective_frame`` is the one table of
these facts that ``waits``, the Stragglers and MoE views and the consistency checks read.
Also the comm–compute overlap per rank: the share of communication kernel time that compute kernels hide (as HTA
reports it), over the step windows.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from ninefold.analysis.intervals import union
from ninefold.analysis.process_groups import canonical
from ninefold.store.connection import has_table

CHARGED = ("straggler", "bubble", "hidden")


def is_all_to_all(coll: str | None) -> bool:
    """Whether a stored collective type (``collective_matches.coll``: the recorded or host-op name, else the
    kernel's class) is an all-to-all."""
    return canonical(coll) == "alltoall"


def _cum(starts, ends):
    """For disjoint intervals sorted by start: F(t) = time of the intervals before t."""
    cum = np.concatenate(([0], np.cumsum(ends - starts)))

    def F(t):
        i = np.searchsorted(starts, t, side="right")
        over = np.where(i > 0, np.maximum(ends[np.maximum(i - 1, 0)] - t, 0), 0)
        return cum[i] - over
    return F


FRAME_SCHEMA = {"rank": pl.Int32, "gid": pl.Int64, "pg": pl.Utf8, "coll": pl.Utf8, "seq": pl.Int64,
                "ord": pl.Int64, "p2p": pl.Boolean, "matched": pl.Boolean, "members": pl.Int32,
                "start_ns": pl.Int64, "end_ns": pl.Int64, "arrival_ns": pl.Int64, "last_arrival_ns": pl.Int64,
                "bytes": pl.Int64, "out_bytes": pl.Int64, "wait_ns": pl.Int64, "straggler_ns": pl.Int64,
                "bubble_ns": pl.Int64, "hidden_ns": pl.Int64, "transfer_ns": pl.Int64,
                "tracelens_wait_ns": pl.Int64}


def collective_frame(con, job: str) -> pl.DataFrame:
    """Every collective kernel of JOB that attribution stored, one row per kernel and rank (FRAME_SCHEMA), in
    (rank, start) order: the match key (gid; pg with seq, or ord for an order match), type (coll), whether it
    was matched, its own-clock start/end, aligned arrival and the last member's, bytes sent and received (from
    the collective's record), the wait and its charge, the transfer after the last arrival and TraceLens's
    wait. An unmatched kernel has no wait: its whole span is transfer. Empty when the job is not attributed."""
    if not has_table(con, "collective_matches"):
        return pl.DataFrame(schema=FRAME_SCHEMA)
    m = pl.from_arrow(con.sql("""
        WITH c AS (SELECT rank, start_ns, coalesce(pg_name, '') AS pg, coalesce(seq, -1) AS sq,
                          max(bytes) AS bytes,
                          max(CASE WHEN in_nelems > 0 THEN bytes // in_nelems * out_nelems END) AS out_bytes
                   FROM collectives WHERE job = $job AND source = 'kernel' GROUP BY ALL)
        SELECT m.rank::INTEGER AS rank, m.gid, nullif(m.pg_name, '') AS pg, m.coll, m.seq, m.ord,
               coalesce(m.p2p, false) AS p2p, coalesce(m.matched, false) AS matched,
               m.n_members::INTEGER AS members, m.start_ns, m.end_ns, m.arrival_ns, m.last_arrival_ns,
               c.bytes::BIGINT AS bytes, c.out_bytes::BIGINT AS out_bytes, m.min_member_ns
        FROM collective_matches m
        LEFT JOIN c ON c.rank = m.rank AND c.start_ns = m.start_ns AND c.pg = coalesce(m.pg_name, '')
                   AND c.sq = coalesce(m.seq, -1)
        WHERE m.job = $job ORDER BY m.rank, m.start_ns, m.gid""", params={"job": job}).to_arrow_table())
    if m.height == 0:
        return pl.DataFrame(schema=FRAME_SCHEMA)
    rank = m["rank"].to_numpy().astype(np.int64)
    s, e = m["start_ns"].to_numpy().astype(np.int64), m["end_ns"].to_numpy().astype(np.int64)
    ok = m["matched"].to_numpy().astype(bool)
    arr, last = m["arrival_ns"].to_numpy().astype(np.int64), m["last_arrival_ns"].to_numpy().astype(np.int64)
    wait = np.where(ok, np.maximum(last - arr, 0), 0)
    w_end = np.minimum(s + wait, e)  # the wait in the rank's own clock: [start, w_end)
    charged = _charged(con, job, rank, s, w_end)
    mind = m["min_member_ns"].to_numpy().astype(np.int64)
    return m.drop("min_member_ns").with_columns(
        pl.Series("wait_ns", wait), *[pl.Series(f"{k}_ns", charged[k]) for k in CHARGED],
        pl.Series("transfer_ns", np.maximum(e - w_end, 0)),
        pl.Series("tracelens_wait_ns", (e - s) - mind)).select(list(FRAME_SCHEMA)).cast(FRAME_SCHEMA)


def _charged(con, job, rank, s, w_end) -> dict:
    """Per kernel: how much of its wait [s, w_end) (own clock) the ledgers charged to straggler, to bubble, and
    to compute/recompute (hidden)."""
    n = rank.size
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
    return charged


def waits(con, job: str) -> dict:
    """{"rows": per matched collective and rank, "ranks": per-rank summary}; times in ns (arrivals aligned to
    rank 0's clock, relative to the job's first matched arrival; dur_ns the kernel's own duration)."""
    f = collective_frame(con, job).filter(pl.col("matched"))
    if f.height == 0:
        return {"rows": [], "ranks": []}
    t0 = int(f["arrival_ns"].min())
    keys = ["wait_ns"] + [f"{k}_ns" for k in CHARGED] + ["transfer_ns", "tracelens_wait_ns"]
    rows = [{"rank": r["rank"], "pg": r["pg"], "coll": r["coll"], "seq": r["seq"], "ord": r["ord"],
             "members": r["members"], "arrival_ns": r["arrival_ns"] - t0,
             "last_arrival_ns": r["last_arrival_ns"] - t0, "dur_ns": r["end_ns"] - r["start_ns"],
             **{k: r[k] for k in keys}}
            for r in f.iter_rows(named=True)]
    per = f.group_by("rank").agg(pl.len().alias("collectives"), *[pl.col(k).sum() for k in keys]).sort("rank")
    ranks = [{"rank": r["rank"], "collectives": r["collectives"], **{k: int(r[k]) for k in keys}}
             for r in per.iter_rows(named=True)]
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
