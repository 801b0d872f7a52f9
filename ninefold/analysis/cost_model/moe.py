"""Mixture-of-experts: all-to-all dispatch/combine payload, expert load per EP rank, and the wait the
imbalance causes (every rank of the EP group waits for the busiest one)."""
from __future__ import annotations


def a2a_payload_bytes(tokens: float, top_k: int, hidden: int, dtype_bytes: float) -> float:
    """Bytes one rank sends in one all-to-all of one MoE layer: tokens × top_k × hidden × bytes. Each MoE layer
    runs two in the forward (dispatch, combine) and two in the backward (Lepikhin et al. 2021, "GShard", §2.2;
    Fedus et al. 2022, "Switch Transformers", §2.2 / Fig. 3: dispatch and combine all-to-alls)."""
    return float(tokens) * top_k * hidden * dtype_bytes


def expert_loads(ep: int, imbalance: float = 1.0, busiest: int = 0, measured: list[float] | None = None) -> list[float]:
    """Load of each EP rank relative to the mean (mean 1). From measured token counts (received split sizes)
    when the trace has them, else the busiest rank carries ``imbalance`` × the mean and the others share the
    rest equally."""
    if measured:
        tot = float(sum(measured))
        if tot > 0:
            return [x * len(measured) / tot for x in measured]
    if ep <= 1:
        return [1.0]
    imb = min(max(imbalance, 1.0), float(ep))
    rest = (ep - imb) / (ep - 1)
    return [imb if r == busiest else rest for r in range(ep)]


def makespan(own: list[float]) -> float:
    """The step waits for the busiest EP rank: max over ranks of its expert time."""
    return max(own) if own else 0.0


def combine_split(own: float, busiest: float, t_a2a: float, overlap: float) -> tuple[float, float]:
    """(straggler, exposed) time of one combine all-to-all on a rank whose expert work ends ``busiest − own``
    before the busiest rank's. The kernel is issued ``overlap·t`` before the rank's compute ends (that part
    hides behind its own compute); it waits for the last member, then transfers for t_a2a. The busiest rank
    shows (1 − overlap)·t exposed; a waiting rank shows its wait beyond the hidden part as straggler and the
    whole transfer as exposed, since nothing of its own is left to compute."""
    wait = max(busiest - own, 0.0)
    o = overlap * t_a2a
    return max(wait - o, 0.0), (1.0 - overlap) * t_a2a + min(wait, o)
