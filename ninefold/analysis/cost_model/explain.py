"""The terms each predicted ledger is made of, with their values and where each came from, so a residual can be
traced to an input (``ninefold predict --explain`` / ``compare --explain``)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Term:
    ledger: str
    term: str
    value: float
    unit: str
    source: str


def _src(cfg, key) -> str:
    v = cfg.values.get(key)
    if v is None:
        return "-"
    return v.source + (f" ({v.note})" if v.note else "")


def _detail(pred, prefix):
    return next(((v, note) for name, v, note in pred.details if name.startswith(prefix)), (None, ""))


def terms(pred) -> list[Term]:
    """Per ledger, the terms of the prediction (ms for times, bytes for sizes, plain numbers otherwise)."""
    cfg, plan = pred.cfg, pred.plan
    src = pred.sources
    ms = 1e-6
    out: list[Term] = []
    excluded = {e.axis: e for e in pred.excluded}

    def add(ledger, term, value, unit, source):
        out.append(Term(ledger, term, float(value), unit, source))

    ach, ach_note = _detail(pred, "achieved FLOP/s")
    fpt, _ = _detail(pred, "training FLOPs / token")
    add("compute", "training FLOPs per token", fpt or 0, "FLOP", "6N + 12·L·h·s from the model shape")
    add("compute", "achieved rate", (ach or 0) / 1e12, "TFLOP/s", f"{ach_note}; {src.get('compute', '')}")
    for key, v in cfg.values.items():
        if key.startswith("trace.") and key.endswith("_ms_per_layer"):
            add("compute", key[6:].replace("_ms_per_layer", "") + " per layer and micro-batch", v.value, "ms",
                f"trace ({v.note})")
    add("compute", "forward per micro-batch (busiest rank)", max(plan.fwd) * ms, "ms", "FLOPs / achieved rate"
        if "shape-free" not in src.get("compute", "") else "measured kernel time / (1 + bwd/fwd + recompute)")
    add("compute", "backward per micro-batch", max(plan.bwd) * ms, "ms",
        f"× compute.bwd_fwd_ratio {cfg['compute.bwd_fwd_ratio']} [{_src(cfg, 'compute.bwd_fwd_ratio')}]")
    add("compute", "micro-batches", plan.m, "", _src(cfg, "parallel.micro_batches"))
    add("compute", "optimizer step", plan.optimizer * ms, "ms", _detail(pred, "optimizer step")[1])
    if max(plan.rec):
        add("recompute", "recompute per micro-batch", max(plan.rec) * ms, "ms",
            f"parallel.recompute = {cfg['parallel.recompute']} [{_src(cfg, 'parallel.recompute')}]")
    from .collectives import canonical

    fits = {(f.coll, f.nranks): f for f in pred.fits}
    sizes = {"tp": ("allreduce", plan.tp), "ep": ("alltoall", plan.ep), "pp": ("sendrecv", 2),
             "dp": (canonical(plan.grad_coll), plan.dp * plan.cp)}
    hw = cfg.hardware().name

    def comm_src(coll, n):
        f = fits.get((canonical(coll) or coll, n))
        if f is None:
            return f"α–β of the {hw} preset link ({coll}, n={n}: no fit)"
        return f"{coll} n={n} fitted from {f.source}: α={f.alpha * 1e6:.3g} us, β={f.beta / 1e9:.4g} GB/s"

    for axis, per, nbytes, count, ov in (
            ("tp", "TP all-reduce, one", plan.tp_bytes, 2 * cfg["model.layers"] / plan.pp, "overlap.tp"),
            ("ep", "EP all-to-all, one", plan.a2a_bytes, 2 * (cfg["model.moe_layers"] or 0) / plan.pp, "overlap.ep"),
            ("pp", "PP send/recv, one", plan.p2p_bytes, 2 * (plan.pp - 1), "overlap.pp"),
            ("dp", "DP ", plan.grad_bytes, 1, "overlap.dp")):
        t1, note = _detail(pred, per)
        if t1 is None:
            continue
        tag = f" — NOT IN TRACE: {excluded[axis].reason}" if axis in excluded else ""
        add("exposed_comm", f"{axis.upper()} bytes (one)", nbytes, "B", note + tag)
        add("exposed_comm", f"{axis.upper()} time (one): α·steps + bytes/β", t1 * 1e3, "ms", comm_src(*sizes[axis]))
        add("exposed_comm", f"{axis.upper()} count per {'block' if axis in ('tp', 'ep') else 'step'}", count, "",
            "2 per layer (forward), 2 (backward)" if axis in ("tp", "ep") else
            "warm-up + cool-down hops" if axis == "pp" else "one per step")
        add("exposed_comm", f"{axis.upper()} overlap factor", cfg[ov], "", _src(cfg, ov))
    if plan.z3_layers or "dp" in excluded and cfg["parallel.zero_stage"] == 3:
        tag = f" — NOT IN TRACE: {excluded['dp'].reason}" if "dp" in excluded else ""
        n_dp = plan.dp * plan.cp
        for coll, what in (("allgather", "all-gather"), ("reduce_scatter", "reduce-scatter")):
            t1, note = _detail(pred, f"ZeRO-3 layer {what}")
            if t1 is None:
                continue
            add("exposed_comm", f"ZeRO-3 layer {what} (one)", t1 * 1e3, "ms", f"{note}; {comm_src(coll, n_dp)}{tag}")
        add("exposed_comm", "ZeRO-3 layers per stage (gathered per micro-batch, forward and backward)",
            plan.z3_layers or cfg["model.layers"] // plan.pp, "", "model.layers / pp")
        add("exposed_comm", "ZeRO-3 prefetch depth", cfg["parallel.fsdp_prefetch"],
            "", _src(cfg, "parallel.fsdp_prefetch") + "; exposed where a layer's gather outlasts the layer before")
    if plan.pp > 1:
        frac, _ = _detail(pred, "bubble fraction")
        add("bubble", "schedule", plan.pp, "stages", f"{plan.schedule}: {src.get('bubble', '')}")
        add("bubble", "closed-form fraction", frac or 0, "", "no communication (pipeline.py)")
    if plan.ep > 1:
        loads, note = _detail(pred, "EP loads per EP index")
        add("straggler", "busiest EP load / mean", max(loads) if loads else 1.0, "", note)
    return out


def text(pred, mean: dict, compared: dict) -> list[str]:
    """Lines: per ledger its predicted ms (and the part not compared), then its terms."""
    lines = ["explain: the terms of each predicted ledger (value, source)"]
    by: dict = {}
    for t in terms(pred):
        by.setdefault(t.ledger, []).append(t)
    for led, ts in by.items():
        extra = mean[led] - compared[led]
        lines.append(f"  {led}: {mean[led] / 1e6:.3f} ms predicted" +
                     (f", of which {extra / 1e6:.3f} ms not in the trace (not compared)" if abs(extra) > 0 else ""))
        for t in ts:
            val = f"{t.value:.6g}"
            lines.append(f"    {t.term:44s} {val:>14s} {t.unit:8s} {t.source}")
    return lines
