"""Shape-free compute calibration: when the trace records no input shapes (no ``Input Dims``, so no GEMM FLOP
count), the compute time per micro-batch is taken from the measured kernels themselves, per kernel class.

Each compute kernel inside a step window is put in a class by ``ninefold.analysis.classify`` (gemm, attention, norm =
the reduction class, elementwise, optimizer, other), its grouped / MoE GEMMs (``gemm_grouped``) being
``expert_gemm``. A class's time per rank and step, divided by the layers of one stage (MoE layers for the
expert class) and the micro-batches, is its time per layer and micro-batch; summed over the stage's layers it
is the forward + backward (+ recompute) of one micro-batch, split with the configuration's backward/forward
ratio and recompute share (the same split the FLOP model uses). The optimizer kernels give the optimizer step."""
from __future__ import annotations

from ninefold.analysis.classify import classify_kernel

DENSE = ("gemm", "attention", "norm", "elementwise", "other")
CLASSES = DENSE + ("expert_gemm", "optimizer")

KERNELS_SQL = """
WITH w AS (SELECT rank, step, start_ns, end_ns FROM steps WHERE job = ?)
SELECT g.name, sum(g.end_ns - g.start_ns), count(*), count(DISTINCT (w.rank, w.step))
FROM gpu_ops g JOIN w ON w.rank = g.rank AND g.start_ns >= w.start_ns AND g.start_ns < w.end_ns
WHERE g.job = ? AND g.kind = 'kernel' GROUP BY g.name
"""


def kernel_class(name: str) -> str | None:
    """The calibration class of a kernel name; None for communication."""
    fam, cls = classify_kernel(name)
    if fam != "compute":
        return None
    return {"reduction": "norm", "gemm_grouped": "expert_gemm"}.get(cls, cls)


def class_times(con, job: str) -> dict | None:
    """{class: (ns per rank-step, kernels)} over the job's step windows; None when there are no steps or no
    compute kernels."""
    n_rs = con.execute("SELECT count(DISTINCT (rank, step)) FROM steps WHERE job = ?", [job]).fetchone()[0]
    if not n_rs:
        return None
    out: dict = {}
    for name, ns, n, _ in con.execute(KERNELS_SQL, [job, job]).fetchall():
        c = kernel_class(name)
        if c is None:
            continue
        t, k = out.get(c, (0.0, 0))
        out[c] = (t + float(ns) / n_rs, k + int(n))
    return out or None


def recompute_ratio(cfg, fpt: dict) -> float:
    """Recompute time over forward time, as the FLOP model has it (compute.microbatch_times)."""
    rc = cfg["parallel.recompute"]
    if rc == "full":
        return min((cfg.get("parallel.recompute_layers") or 0) / cfg["model.layers"], 1.0)
    if rc == "selective":
        return fpt["attention_forward"] / fpt["forward"]
    return 0.0


def calibrate(cfg, times: dict, fpt: dict) -> dict | None:
    """Seconds per micro-batch: forward of the dense part and of the experts (mean load), the optimizer step, and
    the per-layer time of each class, with the evidence. None when no math kernel (gemm/attention/expert) ran."""
    if not any(times.get(c, (0, 0))[0] for c in ("gemm", "attention", "expert_gemm")):
        return None
    pp, m = cfg["parallel.pp"], cfg["parallel.micro_batches"]
    layers = cfg["model.layers"] / pp
    moe = (cfg["model.moe_layers"] or 0) / pp
    split = 1.0 + cfg["compute.bwd_fwd_ratio"] + recompute_ratio(cfg, fpt)
    per_layer, kernels = {}, {}
    dense = 0.0
    for c in DENSE:
        t, k = times.get(c, (0.0, 0))
        if k:
            per_layer[c] = t / 1e9 / (layers * m)
            kernels[c] = k
            dense += t / 1e9 / m
    t_e, k_e = times.get("expert_gemm", (0.0, 0))
    expert = 0.0
    if k_e:
        if moe <= 0:      # expert kernels in a dense configuration: charged as dense GEMM time
            dense += t_e / 1e9 / m
            per_layer["gemm"] = per_layer.get("gemm", 0.0) + t_e / 1e9 / (layers * m)
        else:
            expert = t_e / 1e9 / m
            per_layer["expert_gemm"] = t_e / 1e9 / (moe * m)
        kernels["expert_gemm"] = k_e
    t_o, k_o = times.get("optimizer", (0.0, 0))
    return {"fwd_dense": dense / split, "fwd_expert": expert / split, "optimizer": t_o / 1e9 if k_o else None,
            "per_layer": per_layer, "kernels": {**kernels, **({"optimizer": k_o} if k_o else {})},
            "split": split, "layers_stage": layers, "moe_layers_stage": moe, "micro_batches": m}
