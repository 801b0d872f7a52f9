"""The modelled step as a timeline of GPU activity per rank, and the ledger sweep over it.

One step program per rank: micro-batch blocks (forward: compute, then the EP all-to-all, then the TP
all-reduce; backward: recompute, compute, all-to-all, all-reduce), scheduled by the pipeline simulation when
pp > 1, then the data-parallel gradient sync (issued ``overlap.dp`` of its time before the last compute kernel
ends), the optimizer, and the ZeRO parameter all-gather. Point-to-point transfers run on their own streams;
a receive is posted as soon as its stream is free, so the wait for the producer is inside the recv kernel.

The sweep charges each instant by the LEDGERS precedence: compute/recompute, then communication (the part of
a collective before its last member arrived is straggler, of a send/recv bubble, the rest exposed_comm), then
an idle gap (bubble under pipelining, else idle). Rendering (``render.py``) writes exactly these events."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ninefold.analysis.intervals import covered, union
from ninefold.analysis.ledgers import LEDGER_ID, LEDGERS

P2P = ("send", "recv")
STREAM_COMPUTE, STREAM_DP, STREAM_TP, STREAM_EP = 7, 20, 25, 26
STREAM_RECV_F, STREAM_SEND_F, STREAM_RECV_B, STREAM_SEND_B = 21, 22, 23, 24


@dataclass
class Event:
    rank: int
    kind: str                 # compute | recompute | comm
    start: int
    end: int
    stream: int
    name: str = ""            # what it is (forward, backward, optimizer, dp_grad_sync ...)
    coll: str | None = None   # trace spelling: allreduce, reduce_scatter, all_gather, all_to_allv, send, recv
    pg: str | None = None
    seq: int | None = None
    nbytes: int = 0
    group: tuple = ()


@dataclass
class StepPlan:
    """Everything the timeline needs, integer ns per micro-batch and rank class."""
    dp: int
    tp: int
    pp: int
    ep: int
    cp: int
    schedule: str
    m: int
    fwd: list            # compute per micro-batch, per EP index
    bwd: list
    rec: list
    tp_fwd: int = 0      # TP comm per forward block
    tp_bwd: int = 0
    tp_bytes: int = 0
    a2a_fwd: int = 0     # EP all-to-all per block
    a2a_bwd: int = 0
    a2a_bytes: int = 0
    p2p: int = 0         # one point-to-point transfer
    p2p_bytes: int = 0
    grad_sync: int = 0   # DP gradient all-reduce / reduce-scatter per step
    grad_coll: str = "allreduce"
    grad_bytes: int = 0
    param_gather: int = 0
    param_bytes: int = 0
    z3_layers: int = 0   # ZeRO-3 / FSDP: layers of the stage, each gathered (and its gradient reduce-scattered)
    z3_gather: int = 0   # one layer's parameter all-gather
    z3_reduce: int = 0   # one layer's gradient reduce-scatter
    z3_bytes: int = 0    # one layer's parameters (bf16)
    z3_prefetch: int = 1  # gathers in flight ahead of the layer computing
    optimizer: int = 0
    overlap: dict = field(default_factory=dict)

    @property
    def world(self):
        return self.dp * self.tp * self.pp * self.cp


def coords(plan: StepPlan, rank: int) -> dict:
    """Megatron-LM rank order tp-cp-dp-pp (tp fastest)."""
    tp_i = rank % plan.tp
    cp_i = rank // plan.tp % plan.cp
    dp_i = rank // (plan.tp * plan.cp) % plan.dp
    pp_i = rank // (plan.tp * plan.cp * plan.dp)
    return {"tp": tp_i, "cp": cp_i, "dp": dp_i, "pp": pp_i, "ep": dp_i % plan.ep}


def rank_of(plan: StepPlan, tp=0, cp=0, dp=0, pp=0) -> int:
    return tp + plan.tp * (cp + plan.cp * (dp + plan.dp * pp))


def groups(plan: StepPlan) -> dict:
    """Process groups: name -> (axis, ranks), named like the axis and its first member."""
    out = {}
    for r in range(plan.world):
        c = coords(plan, r)
        if plan.tp > 1:
            g = tuple(rank_of(plan, t, c["cp"], c["dp"], c["pp"]) for t in range(plan.tp))
            out.setdefault(f"tp_{g[0]}", ("tp", g))
        if plan.dp > 1:
            g = tuple(rank_of(plan, c["tp"], c["cp"], d, c["pp"]) for d in range(plan.dp))
            out.setdefault(f"dp_{g[0]}", ("dp", g))
        if plan.ep > 1:
            base = c["dp"] - c["ep"]
            g = tuple(rank_of(plan, c["tp"], c["cp"], base + e, c["pp"]) for e in range(plan.ep))
            out.setdefault(f"ep_{g[0]}", ("ep", g))
        if plan.pp > 1 and c["pp"] < plan.pp - 1:
            g = (r, rank_of(plan, c["tp"], c["cp"], c["dp"], c["pp"] + 1))
            out.setdefault(f"pp_{g[0]}_{g[1]}", ("pp", g))
    return out


def _group_of(gs, axis, rank):
    for name, (ax, g) in gs.items():
        if ax == axis and rank in g and (axis != "pp"):
            return name, g
    return None, ()


def zero3_layers(n: int, cl, g: int, r: int, k: int, backward: bool, t0: int = 0):
    """ZeRO-3 / FSDP layer by layer on one stream of collectives: layer j computes (CL, or CL[j]) once its parameters
    are gathered (G) and layer j−1 is done; the gather of layer j+K is issued when layer j starts (K gathers in
    flight, FSDP's prefetch); in the backward each layer's gradient reduce-scatter (R) is issued when its
    compute ends, queued behind the gathers already issued. Returns (compute starts, gathers as (start, end),
    reduce-scatters as (start, end), the block's end: the last compute, or the last reduce-scatter)."""
    k = max(1, k)
    cls = list(cl) if isinstance(cl, (list, tuple)) else [cl] * n
    c_start, ag, rs = [0] * n, [None] * n, []
    free = t0
    for q in range(min(k, n)):
        ag[q] = (max(free, t0), max(free, t0) + g)
        free = ag[q][1]
    prev = t0
    for j in range(n):
        c_start[j] = max(prev, ag[j][1])
        prev = c_start[j] + cls[j]
        if j + k < n:
            a = max(free, c_start[j])
            ag[j + k] = (a, a + g)
            free = a + g
        if backward:
            a = max(free, prev)
            rs.append((a, a + r))
            free = a + r
    end = max(prev, rs[-1][1]) if backward and rs else prev
    return c_start, ag, rs, end


def _z3_block(kind, c, rc, plan, t0, cmax, rcmax):
    """The compute of one block layer by layer under ZeRO-3, paced by the stage's busiest rank (every member
    of a gather waits for the last): (events, this rank's last compute end, the busiest's, the block's end)."""
    n, bwd = plan.z3_layers, kind == "backward"
    slot = (cmax + rcmax) // n
    slots = [slot] * (n - 1) + [cmax + rcmax - slot * (n - 1)]
    starts, ag, rs, end = zero3_layers(n, slots, plan.z3_gather, plan.z3_reduce if bwd else 0, plan.z3_prefetch,
                                       bwd, t0)
    ev = []
    for j, (a, b) in enumerate(ag):
        ev.append(("comm", a, b, STREAM_DP, f"{kind}_z3_gather{j}", "all_gather"))
    for j, (a, b) in enumerate(rs):
        ev.append(("comm", a, b, STREAM_DP, f"{kind}_z3_reduce{j}", "reduce_scatter"))
    own_r, own_c = rc // n, c // n
    for j, t in enumerate(starts):
        rj = own_r + (rc - own_r * n if j == n - 1 else 0)
        cj = own_c + (c - own_c * n if j == n - 1 else 0)
        if rj:
            ev.append(("recompute", t, t + rj, STREAM_COMPUTE, f"{kind}_recompute{j}", None))
        ev.append(("compute", t + rj, t + rj + cj, STREAM_COMPUTE, f"{kind}{j}", None))
    last = starts[-1]
    own_end = last + (rc - own_r * (n - 1)) + (c - own_c * (n - 1))
    return ev, own_end, last + slots[-1], end


def _block(kind, c, rc, plan, e, t0, cmax, rcmax):
    """Events of one micro-batch block on an EP-index-e rank starting at t0, relative; returns (events, end,
    last compute end). Every rank of the stage ends the block at the same instant."""
    ev = []
    t = t0
    if plan.z3_layers:
        ev, c_end, busiest, z_end = _z3_block(kind, c, rc, plan, t0, cmax, rcmax)
        pad = busiest - c_end
    else:
        if rc:
            ev.append(("recompute", t, t + rc, STREAM_COMPUTE, f"{kind}_recompute", None))
            t += rc
        ev.append(("compute", t, t + c, STREAM_COMPUTE, kind, None))
        t += c
        c_end = z_end = t
        pad = (rcmax - rc) + (cmax - c)       # how much later the busiest rank's compute ends
    a2a = plan.a2a_fwd if kind == "forward" else plan.a2a_bwd
    tpc = plan.tp_fwd if kind == "forward" else plan.tp_bwd
    if a2a:
        o = min(int(round(plan.overlap.get("ep", 0.0) * a2a)), min(plan.fwd) if plan.fwd else 0)
        start = c_end - o
        end = c_end + pad - o + a2a
        ev.append(("comm", start, end, STREAM_EP, f"{kind}_a2a", "all_to_allv"))
        t = end
    if tpc:
        o = 0 if a2a else min(int(round(plan.overlap.get("tp", 0.0) * tpc)), c)
        start = t - o if not a2a else t
        if not a2a:
            start += pad
        ev.append(("comm", start, start + tpc, STREAM_TP, f"{kind}_tp", "allreduce"))
        t = start + tpc
    elif not a2a:
        t = c_end + pad
    return ev, max(t, z_end), c_end


def build_step(plan: StepPlan) -> tuple[dict, dict]:
    """(events per rank, (w0, w1) per rank) of one steady-state step, in ns from the step's start."""
    gs = groups(plan)
    cmax_f, cmax_b, rmax = max(plan.fwd), max(plan.bwd), max(plan.rec)
    # block durations are the same on every rank of a stage (the all-to-all waits for the busiest)
    _, d_f, _ = _block("forward", cmax_f, 0, plan, 0, 0, cmax_f, 0)
    _, d_b, _ = _block("backward", cmax_b, rmax, plan, 0, 0, cmax_b, rmax)
    p, m = plan.pp, plan.m
    if p > 1:
        from .pipeline import simulate

        progs, st, en = simulate(plan.schedule, p, m, d_f, d_b, plan.p2p)
    else:
        progs = [[(k, i) for i in range(m) for k in ("F", "B")]]
        st, en, t = {}, {}, 0
        for k, i in progs[0]:
            st[(k, 0, i)] = t
            t += d_f if k == "F" else d_b
            en[(k, 0, i)] = t
    seq: dict = {}

    def next_seq(pg):
        seq[pg] = seq.get(pg, 0) + 1
        return seq[pg]

    events = {r: [] for r in range(plan.world)}
    ends, blocks_end, last_cs = {}, {}, {}
    for r in range(plan.world):
        c = coords(plan, r)
        s, e = c["pp"], c["ep"]
        evs = events[r]
        last_c = 0
        for kind, i in progs[s]:
            k = "forward" if kind == "F" else "backward"
            comp = plan.fwd[e] if kind == "F" else plan.bwd[e]
            rc = 0 if kind == "F" else plan.rec[e]
            blk, _, c_end = _block(k, comp, rc, plan, e, st[(kind, s, i)], cmax_f if kind == "F" else cmax_b,
                                   0 if kind == "F" else rmax)
            last_c = max(last_c, c_end)
            for kk, a, b, stream, name, coll in blk:
                ax = ("ep" if coll == "all_to_allv" else "dp" if coll in ("all_gather", "reduce_scatter")
                      else "tp" if coll else None)
                pg, g = _group_of(gs, ax, r) if ax else (None, ())
                evs.append(Event(r, kk, a, b, stream, f"{name}#{i}", coll, pg, None,
                                 plan.a2a_bytes if ax == "ep" else plan.tp_bytes if ax == "tp" else
                                 plan.z3_bytes if ax == "dp" else 0, g))
        blocks_end[r] = max(en[(k, s, i)] for k, i in progs[s])
        last_cs[r] = last_c
    # the gradient sync is issued overlap.dp of its time before a rank's last compute kernel ends and, like
    # every collective, ends on all members together: the last arrival plus the transfer
    issue = {}
    for r in range(plan.world):
        if plan.grad_sync:
            o = min(int(round(plan.overlap.get("dp", 0.0) * plan.grad_sync)), plan.bwd[coords(plan, r)["ep"]])
            issue[r] = last_cs[r] - o
    for r in range(plan.world):
        evs = events[r]
        t = blocks_end[r]
        if plan.grad_sync:
            pg, g = _group_of(gs, "dp", r)
            a, b = issue[r], max(issue[x] for x in g) + plan.grad_sync
            evs.append(Event(r, "comm", a, b, STREAM_DP, "dp_grad_sync", plan.grad_coll, pg, None,
                             plan.grad_bytes, g))
            t = max(t, b)
        if plan.optimizer:
            evs.append(Event(r, "compute", t, t + plan.optimizer, STREAM_COMPUTE, "optimizer"))
            t += plan.optimizer
        if plan.param_gather:
            # every member reaches this point together (same stage, same gradient-sync end)
            o = min(int(round(plan.overlap.get("dp", 0.0) * plan.param_gather)), plan.optimizer)
            a = t - o
            pg, g = _group_of(gs, "dp", r)
            evs.append(Event(r, "comm", a, a + plan.param_gather, STREAM_DP, "dp_param_gather", "all_gather", pg,
                             None, plan.param_bytes, g))
            t = max(t, a + plan.param_gather)
        ends[r] = t
    period = max(ends.values())
    windows = {r: (ends[r] - period, ends[r]) for r in ends} if p > 1 else {r: (0, period) for r in ends}
    if p > 1:
        _p2p_events(plan, gs, progs, st, en, events, windows, d_f, d_b)
    # sequence numbers per process group in start order (both ends of a transfer share one)
    order = sorted((ev.start, ev.rank, j) for r, evs in events.items() for j, ev in enumerate(evs) if ev.pg)
    keyed: dict = {}
    for start, r, j in order:
        ev = events[r][j]
        key = (ev.pg, ev.name if ev.coll not in P2P else ev.name.split("@")[0])
        if key not in keyed:
            keyed[key] = next_seq(ev.pg)
        ev.seq = keyed[key]
    for r in events:
        events[r].sort(key=lambda x: (x.start, x.stream))
    return events, windows


def _p2p_events(plan, gs, progs, st, en, events, windows, d_f, d_b):
    p = plan.pp
    for r in range(plan.world):
        c = coords(plan, r)
        s = c["pp"]
        # a receive is posted on the first of its streams that is free; when every one is still busy at its
        # send's start (a transfer longer than a block), one more stream takes it, posted at the send's start
        pools = {STREAM_RECV_F: [windows[r][0]], STREAM_RECV_B: [windows[r][0]]}
        for kind, i in progs[s]:
            if kind == "F" and s < p - 1:
                peer = rank_of(plan, c["tp"], c["cp"], c["dp"], s + 1)
                a = en[("F", s, i)]
                events[r].append(Event(r, "comm", a, a + plan.p2p, STREAM_SEND_F, f"F{i}@send", "send",
                                       f"pp_{r}_{peer}", None, plan.p2p_bytes, (r, peer)))
            if kind == "B" and s > 0:
                peer = rank_of(plan, c["tp"], c["cp"], c["dp"], s - 1)
                a = en[("B", s, i)]
                events[r].append(Event(r, "comm", a, a + plan.p2p, STREAM_SEND_B, f"B{i}@send", "send",
                                       f"pp_{peer}_{r}", None, plan.p2p_bytes, (peer, r)))
        for kind, i in progs[s]:
            if kind == "F" and s > 0:
                peer = rank_of(plan, c["tp"], c["cp"], c["dp"], s - 1)
                arrive = en[("F", s - 1, i)] + plan.p2p
                base, pg = STREAM_RECV_F, f"pp_{peer}_{r}"
            elif kind == "B" and s < p - 1:
                peer = rank_of(plan, c["tp"], c["cp"], c["dp"], s + 1)
                arrive = en[("B", s + 1, i)] + plan.p2p
                base, pg = STREAM_RECV_B, f"pp_{r}_{peer}"
            else:
                continue
            pool = pools[base]
            send_start = arrive - plan.p2p
            j = min(range(len(pool)), key=lambda k: pool[k])
            if pool[j] <= send_start:
                a = pool[j]
            else:
                j, a = len(pool), send_start
                pool.append(a)
            stream = base + 100 * j
            events[r].append(Event(r, "comm", a, arrive, stream, f"{kind}{i}@recv", "recv", pg, None,
                                   plan.p2p_bytes, tuple(sorted((r, peer)))))
            pool[j] = arrive


def waits(events: dict) -> dict:
    """Per rank: (bubble starts, ends), (straggler starts, ends) — [own start, last member's start)."""
    by: dict = {}
    for r, evs in events.items():
        for ev in evs:
            if ev.pg is not None:
                by.setdefault((ev.pg, ev.seq, ev.coll in P2P), []).append(ev)
    out = {r: {"bubble": ([], []), "straggler": ([], [])} for r in events}
    for (pg, sq, p2p), mem in by.items():
        if len({e.rank for e in mem}) < 2:
            continue
        last = max(e.start for e in mem)
        for e in mem:
            w_end = min(e.end, last)
            if w_end > e.start:
                kind = "bubble" if p2p else "straggler"
                out[e.rank][kind][0].append(e.start)
                out[e.rank][kind][1].append(w_end)
    return out


def sweep(evs: list, w0: int, w1: int, wait: dict, gap_ledger: str = "idle") -> dict:
    """ns per ledger of one rank's window, by the LEDGERS precedence."""
    def u(sel):
        s = np.array([e.start for e in evs if sel(e)], dtype=np.int64)
        e = np.array([e.end for e in evs if sel(e)], dtype=np.int64)
        return union(s, e)

    Cn, Cr, K = u(lambda e: e.kind == "compute"), u(lambda e: e.kind == "recompute"), u(lambda e: e.kind == "comm")
    Wb, Ws = union(*wait["bubble"]), union(*wait["straggler"])
    pts = [np.array([w0, w1], dtype=np.int64)]
    for a, b in (Cn, Cr, K, Wb, Ws):
        pts += [np.clip(a, w0, w1), np.clip(b, w0, w1)]
    pts = np.unique(np.concatenate(pts))
    seg_s, seg_e = pts[:-1], pts[1:]
    lab = np.full(seg_s.size, LEDGER_ID[gap_ledger], dtype=np.int8)
    inC = covered(seg_s, *Cn)
    inR = covered(seg_s, *Cr) & ~inC
    inK = covered(seg_s, *K) & ~inC & ~inR
    lab[inC] = LEDGER_ID["compute"]
    lab[inR] = LEDGER_ID["recompute"]
    lab[inK] = LEDGER_ID["exposed_comm"]
    lab[inK & covered(seg_s, *Ws)] = LEDGER_ID["straggler"]
    lab[inK & covered(seg_s, *Wb)] = LEDGER_ID["bubble"]
    tot = np.bincount(lab, weights=(seg_e - seg_s), minlength=len(LEDGERS)).astype(np.int64)
    return {name: int(tot[i]) for i, name in enumerate(LEDGERS)}


def step_ledgers(plan: StepPlan) -> tuple[dict, dict, dict]:
    """(ledgers per rank, events per rank, windows per rank) of the modelled step."""
    events, windows = build_step(plan)
    w = waits(events)
    gap = "bubble" if plan.pp > 1 else "idle"
    led = {r: sweep(events[r], *windows[r], w[r], gap) for r in events}
    return led, events, windows
