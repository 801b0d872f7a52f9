"""A small event simulator of pipeline schedules, per stage and micro-batch.

Tasks are ('F'|'B'|'W', stage, chunk, micro-batch): the forward, the backward (for zero-bubble only its input-
gradient half B, the weight-gradient half being W) of one model chunk. Dependencies:

- F(s, c, i) after F of the previous virtual stage (s−1, c), or (p−1, c−1) at a chunk boundary;
- B(s, c, i) after B of the next virtual stage (s+1, c), or (0, c+1) at a chunk boundary; the very last
  virtual stage's B after its own F;
- W(s, c, i) after B(s, c, i);
- t_p2p is added to every dependency that crosses stages.

Each stage runs one task at a time. gpipe, 1f1b and interleaved (Megatron's order) run a fixed order per stage;
zero-bubble (ZB-H1, Qi et al. 2024) is a fixed order per stage too, like the paper's handcrafted schedule: the
order a greedy list scheduler gives without P2P latency — when a stage is free it runs a ready B, else a ready F if
fewer than p − s micro-batches are between their F and B (1F1B's activation memory), else a pending W, so the W
passes fill what would be 1F1B's bubbles — then run with the real t_p2p. Greedy on the real t_p2p would flip on
a tie (a B arriving t_p2p after its stage frees up loses to a W, which then delays it by a whole t_w), so the step
time would jump with an infinitesimal latency; a fixed order moves by at most the hops on its longest chain times
t_p2p. With m ≥ p and t_f = t_b = t_w this reaches Table 2's (p−1)(t_f + t_b − t_w); with m < p it stays above it
(no steady state). DualPipe is not simulated.

Times are per stage and micro-batch for the whole stage: with v chunks each chunk takes t_f / v and t_b / v.
Without t_w (gpipe, 1f1b, interleaved) the backward is t_b; with t_w it is t_b + t_w (same convention as
pipeline.py: t_b the activation gradient, t_w the weight gradient)."""
from __future__ import annotations

from dataclasses import dataclass, field

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero-bubble")

Task = tuple  # (kind, stage, chunk, micro-batch)


@dataclass
class SimResult:
    schedule: str
    p: int
    m: int
    v: int
    makespan: float
    busy: list[float]                 # per stage: compute time
    idle: list[float]                 # per stage: makespan − busy (the bubble inside the step)
    start: dict = field(repr=False)   # task -> start time
    end: dict = field(repr=False)     # task -> end time
    order: list[list[Task]] = field(repr=False)  # per stage, the tasks in the order run

    @property
    def bubble_fraction(self) -> list[float]:
        return [x / self.makespan if self.makespan > 0 else 0.0 for x in self.idle]


def dependencies(task: Task, p: int, v: int, split_w: bool, t_p2p: float) -> list[tuple[Task, float]]:
    """(producer, hop) pairs the task waits on: it may start at max(producer end + hop)."""
    kind, s, c, i = task

    def hop(s2):
        return t_p2p if s2 != s else 0.0

    if kind == "F":
        if s > 0:
            return [(("F", s - 1, c, i), hop(s - 1))]
        if c > 0:
            return [(("F", p - 1, c - 1, i), hop(p - 1))]
        return []
    if kind == "B":
        if s < p - 1:
            return [(("B", s + 1, c, i), hop(s + 1))]
        if c < v - 1:
            return [(("B", 0, c + 1, i), hop(0))]
        return [(("F", s, c, i), 0.0)]
    if kind == "W" and split_w:
        return [(("B", s, c, i), 0.0)]
    raise ValueError(f"unknown task {task!r}")


# ---------------------------------------------------------------- orders
def order_gpipe(p: int, m: int) -> list[list[Task]]:
    return [[("F", s, 0, i) for i in range(m)] + [("B", s, 0, i) for i in range(m)] for s in range(p)]


def order_1f1b(p: int, m: int) -> list[list[Task]]:
    """p − s − 1 warm-up forwards, then one forward / one backward, then the remaining backwards."""
    out = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [("F", s, 0, i) for i in range(warm)]
        for k in range(m - warm):
            ops += [("F", s, 0, warm + k), ("B", s, 0, k)]
        ops += [("B", s, 0, k) for k in range(m - warm, m)]
        out.append(ops)
    return out


def order_interleaved(p: int, m: int, v: int) -> list[list[Task]]:
    """Megatron-LM's interleaved 1F1B (forward_backward_pipelining_with_interleaving): micro-batches go in groups
    of p through chunk 0, 1, …, v−1; (p − s − 1)·2 + (v − 1)·p warm-up forwards (all of them when m = p), then
    one forward / one backward, then the remaining backwards (chunks in reverse). Needs m a multiple of p."""
    if m % p:
        raise ValueError(f"interleaved needs m a multiple of p (m={m}, p={p})")
    total = m * v

    def chunk_mb(k, forward):
        c = (k % (p * v)) // p
        return (c if forward else v - 1 - c), (k // (p * v)) * p + k % p

    out = []
    for s in range(p):
        warm = total if m == p else min((p - s - 1) * 2 + (v - 1) * p, total)
        ops = []
        for k in range(warm):
            c, i = chunk_mb(k, True)
            ops.append(("F", s, c, i))
        for k in range(total - warm):
            c, i = chunk_mb(warm + k, True)
            ops.append(("F", s, c, i))
            c, i = chunk_mb(k, False)
            ops.append(("B", s, c, i))
        for k in range(total - warm, total):
            c, i = chunk_mb(k, False)
            ops.append(("B", s, c, i))
        out.append(ops)
    return out


# ---------------------------------------------------------------- engines
def _run_fixed(orders, p, v, dur, t_p2p, split_w=False):
    """Run each stage's tasks in its order; a task starts when its stage is free and its inputs arrived."""
    start, end = {}, {}
    pos = [0] * p
    free = [0.0] * p
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                task = orders[s][pos[s]]
                deps = dependencies(task, p, v, split_w, t_p2p)
                if any(d not in end for d, _ in deps):
                    break
                st = max([free[s]] + [end[d] + h for d, h in deps])
                start[task], end[task] = st, st + dur[task[0]]
                free[s] = end[task]
                pos[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError("pipeline schedule deadlocked")
    return start, end, orders


def order_zb_h1(p, m, dur):
    """The per-stage order of ZB-H1: greedy list scheduling without P2P latency — each free stage takes a ready
    B, else a ready F while fewer than p − s micro-batches sit between their F and B, else a pending W; with
    nothing to run it waits for the next input."""
    start, end = {}, {}
    free = [0.0] * p
    nf, nb, nw = [0] * p, [0] * p, [0] * p    # next F / B / W micro-batch per stage (all in order)
    orders = [[] for _ in range(p)]
    total = 3 * m * p
    eps = 1e-12

    def ready_at(task):
        deps = dependencies(task, p, 1, True, 0.0)
        if any(d not in end for d, _ in deps):
            return None
        return max([0.0] + [end[d] + h for d, h in deps])

    while len(end) < total:
        # the stage that can start something earliest runs it; ties go to the lower stage
        best = None
        for s in range(p):
            cands = []
            if nb[s] < m:
                cands.append((0, ("B", s, 0, nb[s])))
            if nf[s] < m and nf[s] - nb[s] < p - s:
                cands.append((1, ("F", s, 0, nf[s])))
            if nw[s] < nb[s]:
                cands.append((2, ("W", s, 0, nw[s])))
            times = [(r, prio, t) for prio, t in cands if (r := ready_at(t)) is not None]
            if not times:
                continue
            t0 = max(free[s], min(r for r, _, _ in times))
            # among the tasks ready by t0, the highest priority
            prio, task = min((prio, t) for r, prio, t in times if r <= t0 + eps)
            if best is None or t0 < best[0] - eps:
                best = (t0, task)
        if best is None:
            raise RuntimeError("zero-bubble schedule deadlocked")
        t0, task = best
        kind, s = task[0], task[1]
        start[task], end[task] = t0, t0 + dur[kind]
        free[s] = end[task]
        orders[s].append(task)
        if kind == "F":
            nf[s] += 1
        elif kind == "B":
            nb[s] += 1
        else:
            nw[s] += 1
    return orders


def simulate(schedule: str, p: int, m: int, v: int = 1, *, t_f: float, t_b: float, t_w: float | None = None,
             t_p2p: float = 0.0) -> SimResult:
    """Simulate one step of `schedule` over p stages and m micro-batches (v chunks per stage for interleaved)."""
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"need p, m, v ≥ 1 (p={p}, m={m}, v={v})")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown or unsimulated schedule {schedule!r} (simulated: {', '.join(SCHEDULES)})")
    if schedule != "interleaved":
        v = 1
    if schedule == "zero-bubble":
        if t_w is None:
            raise ValueError("zero-bubble needs t_w, the weight-gradient half of the backward")
        dur = {"F": t_f, "B": t_b, "W": t_w}
        start, end, orders = _run_fixed(order_zb_h1(p, m, dur), p, 1, dur, t_p2p, split_w=True)
    else:
        dur = {"F": t_f / v, "B": (t_b + (t_w or 0.0)) / v}
        if schedule == "gpipe":
            orders = order_gpipe(p, m)
        elif schedule == "1f1b":
            orders = order_1f1b(p, m)
        else:
            orders = order_interleaved(p, m, v)
        start, end, orders = _run_fixed(orders, p, v, dur, t_p2p)
    makespan = max(end.values())
    busy = [sum(end[t] - start[t] for t in orders[s]) for s in range(p)]
    return SimResult(schedule, p, m, v, makespan, busy, [makespan - b for b in busy], start, end, orders)
