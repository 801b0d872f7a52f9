"""Parameter counts from the model shape (no other cost-model module needed: config and memory both use it)."""
from __future__ import annotations


def param_count(cfg) -> dict:
    """Parameter counts of a cost-model Config: total, dense (replicated over EP) and expert (sharded over EP), and active per token.

    Shapes: attention QKV h·(h + 2·h·kv/a) + output h² (grouped-query attention, Ainslie et al. 2023);
    MLP mats·h·f with mats = 3 for SwiGLU (Shazeer 2020), 2 for GELU; embedding V·h (tied).
    When ``model.parameters`` is given it is the total; the expert share is taken from the shape.
    """
    L, h, a = cfg["model.layers"], cfg["model.hidden"], cfg["model.heads"]
    kv = cfg.get("model.kv_heads") or a
    f = cfg.get("model.ffn_hidden") or 4 * h
    fe = cfg.get("model.expert_ffn_hidden") or f
    E, k = cfg["model.experts"], cfg["model.top_k"]
    moe_layers = cfg.get("model.moe_layers")
    if moe_layers is None:
        moe_layers = L if E > 1 else 0
    mats = 3 if cfg["model.mlp"] == "swiglu" else 2
    attn = h * (h + 2 * h * kv // a) + h * h + 2 * h
    mlp = mats * h * f
    expert_one = mats * h * fe
    expert = moe_layers * E * expert_one if E > 1 else 0
    shape_total = L * attn + (L - moe_layers) * mlp + expert + moe_layers * h * E + cfg["model.vocab"] * h
    total = cfg.get("model.parameters") or shape_total
    dense = max(total - expert, 0)
    active = dense + (moe_layers * k * expert_one if E > 1 else 0)
    return {"total": float(total), "dense": float(dense), "expert": float(expert), "active": float(active),
            "shape_total": float(shape_total)}
