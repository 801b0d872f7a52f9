"""Pipeline schedules: bubble per schedule (closed forms from the papers), the activation / parameter memory each
schedule adds, and a list-scheduling simulation of GPipe and 1F1B with point-to-point transfer time.

Times per micro-batch and stage: t_f forward, t_b backward for the input (activation gradient), t_w backward for
the weights (t_b + t_w = the full backward)."""
from __future__ import annotations


def bubble_time(schedule: str, p: int, m: int, t_f: float, t_b: float, t_w: float, v: int = 1,
                t_fb: float | None = None) -> float:
    """Idle time per stage and step (equal stages, no communication).

    - gpipe, 1f1b: (p−1)(t_f + t_b + t_w). GPipe: Huang et al. 2019, "GPipe", §2.3 (bubble O((K−1)/(M+K−1)));
      1F1B: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
      Megatron-LM" (SC'21), §2.2.1: t_pb = (p−1)(t_f + t_b), bubble fraction (p−1)/m of the ideal time.
    - interleaved with v chunks per device: (p−1)(t_f + t_b + t_w)/v (same paper, §2.2.2).
    - zero-bubble (ZB-H1): (p−1)(t_f + t_b − t_w). Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024,
      arXiv:2401.10241), §2, Table 2 (1F1B (p−1)(T_F+T_B+T_W), ZB-H1 (p−1)(T_F+T_B−T_W), ZB-H2 (p−1)(T_F+T_B−2T_W));
      with T_F = T_B = T_W this is a third of 1F1B's.
    - dualpipe: (p/2 − 1)(F&B + B − 3W) with B the full backward (t_b + t_w) and F&B the time of a forward and
      a backward chunk run overlapped (default t_f + t_b + t_w: the overlap hides communication, not compute).
      DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv:2412.19437), §3.2.1, Table 2.
    """
    if p <= 1:
        return 0.0
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) * (t_f + t_b + t_w)
    if schedule == "interleaved":
        return (p - 1) * (t_f + t_b + t_w) / max(v, 1)
    if schedule == "zero-bubble":
        return max((p - 1) * (t_f + t_b - t_w), 0.0)
    if schedule == "dualpipe":
        b_full = t_b + t_w
        fb = t_f + b_full if t_fb is None else t_fb
        return max((p / 2 - 1) * (fb + b_full - 3 * t_w), 0.0)
    raise ValueError(f"unknown schedule {schedule!r}")


def bubble_fraction(schedule: str, p: int, m: int, v: int = 1, t_f: float = 1.0, t_b: float = 1.0,
                    t_w: float = 1.0, t_fb: float | None = None) -> float:
    """bubble / (bubble + ideal), ideal = m(t_f + t_b + t_w). With the defaults (t_b = t_w = t_f): GPipe/1F1B
    (p−1)/(m+p−1), interleaved (p−1)/(v·m+p−1), ZB-H1 (p−1)/(3m+p−1)."""
    bt = bubble_time(schedule, p, m, t_f, t_b, t_w, v, t_fb)
    ideal = m * (t_f + t_b + t_w)
    return bt / (bt + ideal) if bt + ideal > 0 else 0.0


def in_flight_microbatches(schedule: str, p: int, m: int, v: int = 1, stage: int = 0) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of (one micro-batch × the stage's
    layers).

    - gpipe: all m (Huang et al. 2019 §2.3).
    - 1f1b: min(p − stage, m) (Narayanan et al. 2021 §2.2.1: at most p in flight on the first stage).
    - interleaved: the first stage holds p + (p−1)/v, i.e. L·(1 + (p−1)/(p·v)) layers' worth
      (Korthikanti et al. 2022, §4.2.3 / Narayanan et al. 2021 §2.2.2).
    - zero-bubble (ZB-H1): as 1F1B, p·M_B (Qi et al. 2024, Table 2).
    - dualpipe: PP + 1 (DeepSeek-V3 report, Table 2).
    """
    if p <= 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    if schedule in ("1f1b", "zero-bubble"):
        return float(min(p - stage, m))
    if schedule == "interleaved":
        return float(min(p - stage, m)) + (p - 1) / max(v, 1)
    if schedule == "dualpipe":
        return float(p + 1)
    raise ValueError(f"unknown schedule {schedule!r}")


def param_copies(schedule: str) -> int:
    """DualPipe keeps two copies of the parameters (DeepSeek-V3 report, Table 2: Parameter 2×); others one."""
    return 2 if schedule == "dualpipe" else 1


def program(schedule: str, p: int, m: int) -> list[list[tuple[str, int]]]:
    """Per-stage order of ('F'|'B', micro-batch). GPipe: all forwards then all backwards; 1F1B: p−s−1 warm-up
    forwards, then alternate one forward / one backward, then the remaining backwards."""
    progs = []
    for s in range(p):
        if schedule == "gpipe":
            progs.append([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            continue
        warm = min(p - s - 1, m)
        ops = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while f < m:
            ops.append(("F", f))
            f += 1
            ops.append(("B", b))
            b += 1
        while b < m:
            ops.append(("B", b))
            b += 1
        progs.append(ops)
    return progs


def simulate(schedule: str, p: int, m: int, d_f: float, d_b: float, t_p2p: float,
             free0: list[float] | None = None) -> tuple[list, dict, dict]:
    """List-schedule one step of GPipe / 1F1B. d_f, d_b: block durations per micro-batch and stage; a block
    may start when its stage is free and its input arrived (producer end + t_p2p). Returns
    (programs, start, end) keyed by (kind, stage, micro-batch)."""
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"simulation covers gpipe and 1f1b, not {schedule!r}")
    progs = program(schedule, p, m)
    start, end = {}, {}
    pos = [0] * p
    free = list(free0) if free0 is not None else [0] * p
    left = sum(len(x) for x in progs)
    while left:
        moved = False
        for s in range(p):
            while pos[s] < len(progs[s]):
                kind, i = progs[s][pos[s]]
                if kind == "F":
                    dep = ("F", s - 1, i) if s > 0 else None
                    hop = t_p2p
                else:
                    dep = ("B", s + 1, i) if s < p - 1 else ("F", s, i)
                    hop = t_p2p if s < p - 1 else 0
                if dep is not None and dep not in end:
                    break
                ready = end[dep] + hop if dep is not None else free[s]
                st = max(free[s], ready)
                start[(kind, s, i)] = st
                end[(kind, s, i)] = st + (d_f if kind == "F" else d_b)
                free[s] = end[(kind, s, i)]
                pos[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError("pipeline schedule deadlocked")
    return progs, start, end
