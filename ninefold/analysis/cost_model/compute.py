"""Compute time: FLOPs over achieved FLOP/s."""
from __future__ import annotations

from .config import Config
from .params import param_count


def flops_per_token(cfg: Config) -> dict:
    """Training FLOPs per token: 6·N (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1,
    C ≈ 6N per token) with N the active parameters, plus attention 12·L·h·s (Chowdhery et al. 2022, "PaLM",
    Appendix B: 6N + 12·L·H·Q·T per token). Forward is a third: 2N + 4·L·h·s; split into the dense part and
    the routed-expert part (2·top_k·expert parameters per MoE layer)."""
    pc = param_count(cfg)
    L, h, s = cfg["model.layers"], cfg["model.hidden"], cfg["model.seq_len"]
    mats = 3 if cfg["model.mlp"] == "swiglu" else 2
    E = cfg["model.experts"]
    expert_active = (cfg["model.moe_layers"] * cfg["model.top_k"] * mats * h * cfg["model.expert_ffn_hidden"]
                     if E > 1 else 0.0)
    attn = 4.0 * L * h * s
    fwd = 2.0 * pc["active"] + attn
    return {"forward": fwd, "forward_expert": 2.0 * expert_active, "forward_dense": fwd - 2.0 * expert_active,
            "attention_forward": attn, "training": 3.0 * fwd}


def achieved_flops(cfg: Config, hw) -> float:
    """Achieved FLOP/s while compute kernels run = MFU × dense peak of the math dtype."""
    return cfg["compute.mfu"] * hw.peak(cfg["model.dtype"])


def microbatch_times(cfg: Config, hw, achieved: float | None = None, loads: list[float] | None = None,
                     shape_free: dict | None = None) -> dict:
    """Seconds of compute per micro-batch on one rank of one stage: forward dense part, forward expert part
    per EP rank (× its load), backward = bwd_fwd_ratio × forward, recompute (full: a forward of the
    checkpointed layers; selective: the attention-core forward, Korthikanti et al. 2022 §5). With
    ``shape_free`` (shapefree.calibrate) the forward parts are the measured kernel times instead of FLOPs / rate."""
    fpt = flops_per_token(cfg)
    if shape_free is not None:
        from .shapefree import recompute_ratio

        loads = loads or [1.0]
        fw = [shape_free["fwd_dense"] + shape_free["fwd_expert"] * x for x in loads]
        rho = recompute_ratio(cfg, fpt)
        tokens = cfg["parallel.micro_batch_size"] * cfg["model.seq_len"]
        split = cfg["parallel.tp"] * cfg["parallel.pp"] * cfg["parallel.cp"]
        mean_f = shape_free["fwd_dense"] + shape_free["fwd_expert"]
        ach = tokens * fpt["forward"] / split / mean_f if mean_f > 0 else 0.0
        return {"fwd": fw, "bwd": [cfg["compute.bwd_fwd_ratio"] * f for f in fw], "recompute": [rho * (f if cfg["parallel.recompute"] == "full" else mean_f) for f in fw],
                "achieved": ach, "tokens": tokens}
    tp, pp, cp = cfg["parallel.tp"], cfg["parallel.pp"], cfg["parallel.cp"]
    tokens = cfg["parallel.micro_batch_size"] * cfg["model.seq_len"]
    split = tp * pp * cp
    ach = achieved or achieved_flops(cfg, hw)
    dense_f = tokens * fpt["forward_dense"] / split / ach
    loads = loads or [1.0]
    expert_f = [tokens * fpt["forward_expert"] / split / ach * x for x in loads]
    ratio = cfg["compute.bwd_fwd_ratio"]
    rc = cfg["parallel.recompute"]
    share = min((cfg.get("parallel.recompute_layers") or 0) / cfg["model.layers"], 1.0)
    if rc == "full":
        rec = [share * (dense_f + e) for e in expert_f]
    elif rc == "selective":
        rec = [tokens * fpt["attention_forward"] / split / ach] * len(expert_f)
    else:
        rec = [0.0] * len(expert_f)
    return {"fwd": [dense_f + e for e in expert_f], "bwd": [ratio * (dense_f + e) for e in expert_f],
            "recompute": rec, "achieved": ach, "tokens": tokens}
