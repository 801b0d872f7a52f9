"""α–β cost of collectives (ring and tree), bus-bandwidth factors, exposure under overlap."""
from __future__ import annotations

import math

from ninefold.analysis.process_groups import canonical  # noqa: F401  (the cost model's callers import it from here)

from .hardware import Hardware, Link

# nccl-tests doc/PERFORMANCE.md ("bus bandwidth"): bytes each rank moves per byte of the buffer, so that
# busbw = algbw · factor is comparable with the link bandwidth.
BUSBW = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


def ring_steps(coll: str, n: int) -> int:
    """Latency terms of the ring algorithms (Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective
    Communication Operations in MPICH", IJHPCA 19(1), §4: ring allgather (p−1)α, reduce-scatter (p−1)α,
    allreduce = reduce-scatter + allgather 2(p−1)α; pairwise all-to-all (p−1)α); point-to-point one α."""
    if n <= 1:
        return 0
    if coll == "allreduce":
        return 2 * (n - 1)
    if coll == "sendrecv":
        return 1
    return n - 1


def tree_steps(coll: str, n: int) -> int:
    """Binomial / double-binary tree: reduce then broadcast, 2⌈log2 p⌉ α for allreduce (Thakur et al. 2005 §4;
    NCCL's double binary tree keeps the same latency order); ⌈log2 p⌉ α for broadcast/reduce."""
    if n <= 1:
        return 0
    lg = math.ceil(math.log2(n))
    if coll == "allreduce":
        return 2 * lg
    if coll in ("broadcast", "reduce"):
        return lg
    return ring_steps(coll, n)


def coll_time(coll: str, nbytes: float, n: int, link: Link, algo: str = "ring") -> float:
    """Seconds: α·steps + busbw_factor(n)·bytes/β (bytes = the per-rank buffer, as nccl-tests' "size")."""
    coll = canonical(coll) or coll
    if n <= 1 and coll != "sendrecv":
        return 0.0
    steps = tree_steps(coll, n) if algo == "tree" else ring_steps(coll, n)
    return link.alpha * steps + BUSBW[coll](max(n, 2) if coll == "sendrecv" else n) * float(nbytes) / link.beta


def exposed(t: float, overlap: float) -> float:
    """Comm time left visible when a fraction ``overlap`` of it runs behind compute."""
    return (1.0 - overlap) * t


def axis_strides(cfg) -> dict:
    """Rank stride of each axis in the Megatron-LM default order tp-cp-dp-pp (tp fastest); EP is carved out of
    the data-parallel ranks, contiguous within them."""
    tp, cp, dp = cfg["parallel.tp"], cfg["parallel.cp"], cfg["parallel.dp"]
    return {"tp": 1, "cp": tp, "dp": tp * cp, "ep": tp * cp, "pp": tp * cp * dp}


def axis_link(cfg, hw: Hardware, axis: str, size: int | None = None) -> tuple[str, Link]:
    """NVLink when the group's ranks share a node (stride·size ≤ GPUs per node), else InfiniBand."""
    size = size or cfg[f"parallel.{axis}"]
    stride = axis_strides(cfg)[axis]
    level = "nvlink" if stride * size <= hw.gpus_per_node else "ib"
    return level, hw.link(level)
