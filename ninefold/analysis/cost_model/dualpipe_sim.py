"""An event simulation of DualPipe (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437, §3.2.1,
Fig. 4 and 5; the per-rank order of the reference implementation, github.com/deepseek-ai/DualPipe): bidirectional
pipelining over p ranks (p even) with chunk pairs whose expert-parallel all-to-all runs under the paired chunk's
compute.

Micro-batches come in from both ends: m/2 in direction 0 (rank 0 → rank p−1) and m/2 in direction 1 (rank p−1 →
rank 0); m ≥ 2p. Rank r holds position r of direction 0 and position p−1−r of direction 1 (two chunks, the
parameters twice). Tasks are (kind, direction, position, micro-batch), kind F, B (input gradient) or W (weight
gradient). Dependencies: F(d, k, i) after F(d, k−1, i); B(d, k, i) after B(d, k+1, i), the last position's B
after its own F; a hop of t_p2p between ranks.

Each rank runs a fixed order in eight steps (h = p/2, hr = min(r, p−1−r), "phase 0" the direction the rank
sits early in): 2(h−hr−1) F0; (hr+1)·[F0 F1]; (h−hr−1)·[B1 W1 F1]; (m/2 − p + hr + 1)·[F0&B1, F1&B0];
(h−hr−1)·[B1, F1&B0]; (hr+1)·[B1 B0] (the second half with W split off); (h−hr−1)·[W B0]; (hr+1)·W. The two
middle ranks run their first F0&B1 as two lone chunks. A pair X&Y runs a forward and a whole backward (B and W)
together: the compute stream runs c_f + c_b + c_w while the communication stream runs both chunks' all-to-all
(a_f + a_b), so it lasts max(c_f + c_b + c_w, a_f + a_b) and only the excess of communication is exposed. A
lone chunk waits for its own all-to-all: F takes c_f + a_f, B c_b + a_b (+ c_w when W is not split off), W c_w.
"""
from __future__ import annotations

from dataclasses import dataclass, field

EPS = 1e-12


@dataclass
class DualPipeResult:
    p: int
    m: int
    makespan: float
    busy: list[float]          # per rank: compute (F, B, W)
    exposed: list[float]       # per rank: all-to-all time not hidden under compute
    idle: list[float]          # per rank: makespan − busy − exposed (the bubble)
    start: dict = field(repr=False)    # task -> start
    end: dict = field(repr=False)      # task -> end
    order: list = field(repr=False)    # per rank: what it ran, a pair as ((F task), (B task))


def position(p: int, rank: int, d: int) -> int:
    return rank if d == 0 else p - 1 - rank


def rank_of(p: int, k: int, d: int) -> int:
    return k if d == 0 else p - 1 - k


def rank_order(p: int, m: int, r: int) -> list:
    """Rank r's items: ("F", d) | ("B", d, split_w) | ("W",) | ("FB", d_f, d_b), micro-batches in order."""
    h, half = p // 2, m // 2
    hr = min(r, p - 1 - r)
    second = r >= h
    middle = r in (h - 1, h)

    def ph(x):              # phase -> direction
        return x ^ int(second)

    o: list = []
    o += [("F", ph(0))] * (2 * (h - hr - 1))
    o += [("F", ph(0)), ("F", ph(1))] * (hr + 1)
    o += [("B", ph(1), True), ("W",), ("F", ph(1))] * (h - hr - 1)
    for i in range(half - p + hr + 1):
        if i == 0 and middle:
            o += [("F", ph(0)), ("B", ph(1), False)]
        else:
            o.append(("FB", ph(0), ph(1)))
        o.append(("FB", ph(1), ph(0)))
    o += [("B", ph(1), False), ("FB", ph(1), ph(0))] * (h - hr - 1)
    zb = False
    n6 = hr + 1
    for i in range(n6):
        if i == n6 // 2 and hr % 2 == 1:
            zb = True
        o.append(("B", ph(1), zb))
        if i == n6 // 2 and hr % 2 == 0:
            zb = True
        o.append(("B", ph(0), zb))
    o += [("W",), ("B", ph(0), True)] * (h - hr - 1)
    o += [("W",)] * (hr + 1)
    return o


def simulate_dualpipe(p: int, m: int, *, c_f: float, c_b: float, c_w: float, a_f: float = 0.0, a_b: float = 0.0,
                      t_p2p: float = 0.0) -> DualPipeResult:
    if p < 2 or p % 2:
        raise ValueError(f"DualPipe needs an even number of ranks ≥ 2 (p={p})")
    if m % 2 or m < 2 * p:
        raise ValueError(f"DualPipe feeds m/2 micro-batches from each end and needs m ≥ 2p, m even (m={m}, p={p})")
    orders = [rank_order(p, m, r) for r in range(p)]
    start, end = {}, {}
    free = [0.0] * p
    pos = [0] * p
    nf = [[0, 0] for _ in range(p)]
    nb = [[0, 0] for _ in range(p)]
    wq: list = [[] for _ in range(p)]
    busy, exposed = [0.0] * p, [0.0] * p
    ran: list = [[] for _ in range(p)]

    def arrival(task):
        kind, d, k, i = task
        if kind == "F":
            dep = ("F", d, k - 1, i) if k > 0 else None
            hop = t_p2p
        else:
            dep, hop = (("B", d, k + 1, i), t_p2p) if k < p - 1 else (("F", d, k, i), 0.0)
        if dep is None:
            return 0.0
        return end[dep] + hop if dep in end else None

    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                item = orders[r][pos[r]]
                if item[0] == "W":
                    tasks, comp, comm = [wq[r][0]], c_w, 0.0
                elif item[0] == "F":
                    d = item[1]
                    tasks, comp, comm = [("F", d, position(p, r, d), nf[r][d])], c_f, a_f
                elif item[0] == "B":
                    d = item[1]
                    b = ("B", d, position(p, r, d), nb[r][d])
                    tasks = [b] if item[2] else [b, ("W",) + b[1:]]
                    comp, comm = (c_b if item[2] else c_b + c_w), a_b
                else:
                    df, db = item[1], item[2]
                    b = ("B", db, position(p, r, db), nb[r][db])
                    tasks = [("F", df, position(p, r, df), nf[r][df]), b, ("W",) + b[1:]]
                    comp, comm = c_f + c_b + c_w, a_f + a_b
                arr = [arrival(t) for t in tasks if t[0] != "W"]
                if any(a is None for a in arr):
                    break
                t0 = max([free[r]] + arr)
                dur = max(comp, comm) if item[0] == "FB" else comp + comm
                for t in tasks:
                    start[t], end[t] = t0, t0 + dur
                for t in tasks:
                    if t[0] == "F":
                        nf[r][t[1]] += 1
                    elif t[0] == "B":
                        nb[r][t[1]] += 1
                if item[0] == "W":
                    wq[r].pop(0)
                elif item[0] == "B" and item[2]:
                    wq[r].append(("W",) + tasks[0][1:])
                busy[r] += comp
                exposed[r] += dur - comp
                ran[r].append(tuple(tasks) if len(tasks) > 1 else tasks[0])
                free[r] = t0 + dur
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError("DualPipe schedule deadlocked")
    makespan = max(end.values())
    idle = [makespan - busy[r] - exposed[r] for r in range(p)]
    return DualPipeResult(p, m, makespan, busy, exposed, idle, start, end, ran)
