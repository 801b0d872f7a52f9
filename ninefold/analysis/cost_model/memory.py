"""Memory ledger per GPU (bytes): model states under ZeRO, activations under recompute / TP / SP, pipeline buffers."""
from __future__ import annotations

from .config import DTYPE_BYTES, Config
from .params import param_count

MEMORY_ITEMS = ("params", "grads", "optimizer", "activations", "pipeline_buffers")


def model_state_bytes(P: float, zero_stage: int, N: int) -> dict:
    """Mixed-precision Adam model states for P parameters sharded over N data-parallel ranks.

    Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", §3 / Fig. 1
    (K = 12): fp16 params 2P + fp16 grads 2P + optimizer states (fp32 master weights, momentum, variance) 12P
    = 16P. Stage 1 (P_os) shards the optimizer: 4P + 12P/N; stage 2 (P_os+g) also the grads: 2P + 14P/N;
    stage 3 (P_os+g+p) everything: 16P/N.
    """
    N = max(int(N), 1)
    params, grads, opt = 2.0 * P, 2.0 * P, 12.0 * P
    if zero_stage >= 1:
        opt /= N
    if zero_stage >= 2:
        grads /= N
    if zero_stage >= 3:
        params /= N
    return {"params": params, "grads": grads, "optimizer": opt}


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int, sp: bool, recompute: str) -> float:
    """Activation bytes one transformer layer keeps for one micro-batch (16-bit activations).

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 2:
      no parallelism                 sbh(34 + 5as/h)                      (eq. 1)
      tensor parallel                sbh(10 + 24/t + 5as/(ht))            (eq. 2)
      tensor + sequence parallel     sbh/t (34 + 5as/h)                   (eq. 3)
      TP + selective recompute       sbh(10 + 24/t)
      TP + SP + selective recompute  34 sbh/t
      full recompute                 2 sbh (only the layer input is kept)
    """
    sbh = float(s) * b * h
    if recompute == "full":
        return 2.0 * sbh
    if recompute == "selective":
        return 34.0 * sbh / t if sp else sbh * (10.0 + 24.0 / t)
    if sp:
        return sbh / t * (34.0 + 5.0 * a * s / h)
    return sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t))


def memory_ledger(cfg: Config, stage: int = 0) -> dict:
    """Bytes per GPU for the rank of pipeline stage ``stage``: params, grads, optimizer, activations,
    pipeline_buffers."""
    from .pipeline import in_flight_microbatches, param_copies

    pc = param_count(cfg)
    dp, tp, pp, ep, cp = (cfg[f"parallel.{x}"] for x in ("dp", "tp", "pp", "ep", "cp"))
    zs = cfg["parallel.zero_stage"]
    copies = param_copies(cfg["parallel.schedule"])
    dense_gpu = pc["dense"] / (tp * pp)
    expert_gpu = pc["expert"] / (ep * pp)
    # the distributed optimizer shards over the data-parallel ranks of each parameter: dp·cp for dense
    # weights, dp·cp/ep for experts (EP is carved out of the data-parallel ranks)
    st = model_state_bytes(dense_gpu * copies, zs, dp * cp)
    se = model_state_bytes(expert_gpu * copies, zs, max(dp * cp // ep, 1))
    out = {k: st[k] + se[k] for k in st}
    L, h, a = cfg["model.layers"], cfg["model.hidden"], cfg["model.heads"]
    s = cfg["model.seq_len"] // cp
    b = cfg["parallel.micro_batch_size"]
    sp = bool(cfg["parallel.sequence_parallel"])
    rc = cfg["parallel.recompute"]
    n_rc = cfg.get("parallel.recompute_layers") or 0
    layers_stage = L // pp
    rc_share = min(n_rc / L, 1.0) if rc == "full" else 0.0
    per_layer = (rc_share * activation_bytes_per_layer(s, b, h, a, tp, sp, "full")
                 + (1 - rc_share) * activation_bytes_per_layer(s, b, h, a, tp, sp, "none" if rc == "full" else rc))
    inflight = in_flight_microbatches(cfg["parallel.schedule"], pp, cfg["parallel.micro_batches"],
                                      cfg["parallel.v"], stage)
    out["activations"] = per_layer * layers_stage * inflight
    dbytes = DTYPE_BYTES["bf16"] if cfg["model.dtype"] == "fp8" else DTYPE_BYTES[cfg["model.dtype"]]
    # one activation (forward) and one activation gradient (backward) receive buffer per stage
    out["pipeline_buffers"] = (2.0 * s * b * h * dbytes / (tp if sp else 1)) if pp > 1 else 0.0
    return {k: float(out[k]) for k in MEMORY_ITEMS}
