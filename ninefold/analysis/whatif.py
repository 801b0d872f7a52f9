"""What if: each step of a job replayed on its dependency graph (ninefold.analysis.step_graph) with a ledger's time taken
away or a kernel class sped up, and the step time it projects.

Changes, each applied to the graph before the replay:
  straggler     every rank launches each collective no later than the group's earliest member arrived (the late
                arrivals go; a rank still cannot start before its own GPU is ready)
  bubble        the same for point-to-point transfers (a pipeline stage no longer waits on its peer's send)
  host, io, memcpy, exposed_comm, idle
                every delay of the graph (an edge's offset, a node's lag, a GPU op's duration) loses the part of it
                that the rank's ledger intervals charge to that ledger
  launch_gaps   a host gap after a synchronize returns (the host took long to launch the next work) loses the
                part that the host ledger charges (the GPU idle while the host had not launched): the host
                gaps closed, nothing else of the host's time
  scale KCLASS=F
                GPU ops of that kernel class (ninefold.analysis.classify: gemm, attention, elementwise, ...; gemm also
                takes the grouped GEMMs, gemm_grouped only them) take F times as long
Replaying the unchanged graph gives every measured time exactly, so a projection differs from the measurement
only by what was changed. The projected step time is the latest rank's step end minus the step's start.
"""
from __future__ import annotations

import numpy as np

from ninefold.analysis import step_graph as sg
from ninefold.analysis.classify import classes_of
from ninefold.analysis.intervals import i64 as _i64
from ninefold.analysis.ledgers import LEDGERS

CAP_REMOVALS = ("straggler", "bubble")
# not a ledger: the host's gaps after a synchronize returns, where the GPU sat idle, closed
LAUNCH_GAPS = "launch_gaps"
OVERLAP_REMOVALS = ("host", "io", "memcpy", "exposed_comm", "idle")
REMOVALS = CAP_REMOVALS + OVERLAP_REMOVALS


class WhatIfError(Exception):
    pass


def _ledger_cum(con, job, ledger, offsets):
    """Per rank: sorted aligned starts/ends of LEDGER's intervals and the prefix sums of their lengths."""
    li = con.execute("SELECT rank, start_ns, end_ns FROM ledger_intervals WHERE job = ? AND ledger = ? "
                     "ORDER BY rank, start_ns", [job, ledger]).fetchnumpy()
    out = {}
    r = _i64(li["rank"])
    for x in np.unique(r):
        m = r == x
        o = int(offsets.get(int(x), 0) or 0)
        s, e = _i64(li["start_ns"][m]) - o, _i64(li["end_ns"][m]) - o
        out[int(x)] = (s, e, np.concatenate(([0], np.cumsum(e - s))))
    return out


def _covered(iv, rank, a, b):
    """Length of [a, b) (arrays, one rank per element) covered by the intervals IV of that rank."""
    res = np.zeros(a.size, np.int64)
    for r, (s, e, cum) in iv.items():
        m = np.flatnonzero(rank == r)
        if not m.size:
            continue

        def upto(x):
            i = np.searchsorted(s, x, side="right")  # intervals starting at or before x
            full = cum[np.maximum(i - 1, 0)]
            part = np.where(i > 0, np.minimum(x, e[np.maximum(i - 1, 0)]) - s[np.maximum(i - 1, 0)], 0)
            return np.where(i > 0, full + np.maximum(part, 0), 0)

        lo, hi = a[m], np.maximum(b[m], a[m])
        res[m] = upto(hi) - upto(lo)
    return res


class Graph:
    """A job's step graph with its measured replay, ready for projections."""

    def __init__(self, con, job: str):
        n_win = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'step_windows'"
                            ).fetchall()[0][0]
        if not n_win or not con.execute("SELECT count(*) FROM step_windows WHERE job = ?", [job]).fetchall()[0][0]:
            raise WhatIfError(sg.no_windows_reason(con, job))
        self.con, self.job = con, job
        self.g = g = sg.build(con, job)
        n = g["nodes"]
        self.n = n
        self.gs_grp, self.h_grp, self.h_lat = sg.cap_groups(g, g["grp_of"], g["launch"])
        # p2p groups: a GA node whose members are point-to-point transfers
        ops = g["ops"]
        p2p_op = np.asarray(ops["p2p"], bool)
        ga_p2p = np.zeros(n["T"].size, bool)
        for gs_node, ga in g["grp_of"].items():
            op = n["op"][gs_node]
            if op >= 0 and p2p_op[op]:
                ga_p2p[ga] = True
        self.ga_p2p = ga_p2p
        self.kclass = np.asarray(ops["kclass"], dtype=object)
        self.base = self.replay()

    def replay(self, lag=None, dur=None, off=None, cap=None):
        g, n = self.g, self.n
        lag = g["lag"] if lag is None else lag
        dur = n["dur"] if dur is None else dur
        off = g["off"] if off is None else off
        on = np.ones(g["src"].size, bool)
        h_grp = self.h_grp if cap is None else np.where(cap[np.maximum(self.h_grp, 0)], self.h_grp, -1)
        t, best = sg.replay(g["order"], g["ptr"], g["src"], off, g["fe"], on, n["T"], lag, dur, g["source"],
                            self.gs_grp, h_grp, self.h_lat, cap is not None)
        return t, best

    def step_times(self, t):
        """{step: (projected step time, {rank: that rank's step end - the step's start})}."""
        n = self.n
        sinks = np.flatnonzero(n["typ"] == sg.SINK)
        out = {}
        for st, t0 in sorted(self.g["step_start"].items()):
            sk = sinks[n["step"][sinks] == st]
            if not sk.size:
                continue
            per = {int(n["rank"][k]): int(t[k] - t0) for k in sk}
            out[st] = (max(per.values()), per)
        return out

    def changed(self, remove=(), scale=None):
        """(lag, dur, off, cap) of the graph with REMOVE (ledgers) taken away and SCALE {kclass: factor}."""
        g, n = self.g, self.n
        lag, dur, off = g["lag"].copy(), n["dur"].copy(), g["off"].copy()
        cap = None
        for what in remove:
            if what == LAUNCH_GAPS:
                iv = _ledger_cum(self.con, self.job, "host", g["offsets"])
                m = (g["kind"] == sg.E_HOST) & (n["typ"][g["src"]] == sg.HE)
                cut = _covered(iv, n["rank"][g["dst"]], g["out"], g["out"] + off) if iv else 0
                off = np.where(m, off - cut, off)
                continue
            if what not in REMOVALS:
                raise WhatIfError(f"cannot remove {what!r}: choose from {', '.join(REMOVALS + (LAUNCH_GAPS,))}")
            if what in CAP_REMOVALS:
                want = self.ga_p2p if what == "bubble" else ~self.ga_p2p
                cap = want if cap is None else (cap | want)
                continue
            iv = _ledger_cum(self.con, self.job, what, g["offsets"])
            if not iv:
                continue
            rank = n["rank"]
            # a node's lag occupies [T - lag, T); a GPU op's duration [T, T + dur); an edge's offset
            # [out, out + off) on the rank of its destination
            lag = lag - _covered(iv, rank, n["T"] - lag, n["T"])
            gpu = n["typ"] == sg.GS
            cut = _covered(iv, rank, n["T"], n["T"] + dur)
            dur = np.where(gpu, dur - cut, dur)
            dr = rank[g["dst"]]
            off = off - _covered(iv, dr, g["out"], g["out"] + off)
        for kc, f in (scale or {}).items():
            if f < 0:
                raise WhatIfError(f"--scale {kc}={f}: the factor must be >= 0")
            ops_kc = self.kclass[np.maximum(n["op"], 0)] if self.kclass.size else np.zeros(0, dtype=object)
            m = (n["typ"] == sg.GS) & (n["op"] >= 0) & np.isin(ops_kc, classes_of(kc))
            if not m.any():
                raise WhatIfError(f"job {self.job!r} has no GPU ops of kernel class {kc!r}")
            dur = np.where(m, np.round(dur * f).astype(np.int64), dur)
        return lag, dur, off, cap

    def project(self, remove=(), scale=None):
        lag, dur, off, cap = self.changed(remove, scale)
        t, best = self.replay(lag, dur, off, cap)
        return t, best, lag, dur, off


def whatif(con, job: str, remove=(), scale=None, steps=None) -> dict:
    """The step times of JOB measured and projected with REMOVE/SCALE, per step and rank, and the projected
    critical path's length by piece kind (the host's time over a running GPU op counted as that op, as in
    ninefold.analysis.critical_path) and rank."""
    from ninefold.analysis.critical_path import KINDS, on_gpu_kinds, paths

    G = Graph(con, job)
    base = G.step_times(G.base[0])
    t, best, lag, dur, off = G.project(remove, scale)
    proj = G.step_times(t)
    ps = paths(G.g, t, best, lag, dur, off, steps)
    rows = []
    for st, (m, per_m) in base.items():
        if steps is not None and st not in steps:
            continue
        p, per_p = proj[st]
        pc = ps.get(st)
        kinds, ranks = {}, {}
        if pc is not None and pc.size:
            kc = on_gpu_kinds(G.g, t, dur, pc)
            for k, x in zip(kc[:, 0], kc[:, 2] - kc[:, 1]):
                kinds[KINDS[k]] = kinds.get(KINDS[k], 0) + int(x)
            d = pc[:, 4] - pc[:, 3]
            for r, x in zip(pc[:, 0], d):
                ranks[int(r)] = ranks.get(int(r), 0) + int(x)
        rows.append({"step": st, "measured_ns": m, "projected_ns": p, "saved_ns": m - p,
                     "ranks": {r: {"measured_ns": per_m[r], "projected_ns": per_p.get(r)} for r in per_m},
                     "path_kinds": kinds, "path_ranks": ranks})
    if steps is not None and not rows:
        raise WhatIfError(f"job {job!r} has no step {', '.join(map(str, sorted(steps)))}")
    tm = sum(r["measured_ns"] for r in rows)
    tp = sum(r["projected_ns"] for r in rows)
    return {"job": job, "remove": list(remove), "scale": dict(scale or {}), "steps": rows,
            "measured_ns": tm, "projected_ns": tp, "saved_ns": tm - tp, "speedup": tm / tp if tp else None}


def rank_removals(con, job: str, steps=None) -> list[dict]:
    """Every single-ledger removal, ranked by the step time it saves over the job's steps."""
    G = Graph(con, job)
    base = G.step_times(G.base[0])
    keep = [s for s in base if steps is None or s in steps]
    tm = sum(base[s][0] for s in keep)
    present = {x for (x,) in con.execute("SELECT DISTINCT ledger FROM ledger_totals WHERE job = ? AND ns > 0",
                                         [job]).fetchall()}
    out = []
    for what in REMOVALS + (LAUNCH_GAPS,):
        if what not in present and not (what == LAUNCH_GAPS and "host" in present):
            continue
        t, *_ = G.project((what,))
        proj = G.step_times(t)
        tp = sum(proj[s][0] for s in keep)
        led = None if what == LAUNCH_GAPS else int(con.execute(
            "SELECT coalesce(sum(ns), 0) FROM ledger_totals WHERE job = ? AND ledger = ?", [job, what]).fetchall()[0][0])
        out.append({"remove": what, "measured_ns": tm, "projected_ns": tp, "saved_ns": tm - tp,
                    "speedup": tm / tp if tp else None, "ledger_ns": led})
    out.sort(key=lambda r: -r["saved_ns"])
    return out


assert set(REMOVALS) <= set(LEDGERS)
