"""Predicted per-step ledgers (ns, per rank) and memory ledger (bytes, per rank) from a configuration, with
what a stored trace tells taking precedence over the file."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ninefold.analysis.ledgers import LEDGERS

from . import calibrate
from .collectives import axis_link, canonical, coll_time
from .compute import flops_per_token, microbatch_times
from .config import Config, load_config, resolve, world_size
from .memory import memory_ledger
from .params import param_count
from .moe import a2a_payload_bytes, expert_loads
from .pipeline import bubble_fraction, bubble_time
from .timeline import StepPlan, coords, step_ledgers

SIMULATED = ("gpipe", "1f1b")


@dataclass
class Prediction:
    cfg: Config
    plan: StepPlan
    ledgers: dict                      # rank -> {ledger: ns}
    memory: dict                       # rank -> {item: bytes}
    details: list = field(default_factory=list)   # (name, value, unit/note)
    fits: list = field(default_factory=list)
    events: dict | None = None
    windows: dict | None = None
    in_trace: dict | None = None       # rank -> {ledger: ns} without the components the trace cannot contain
    excluded: list = field(default_factory=list)   # coverage.Excluded: predicted, shown, not compared
    sources: dict = field(default_factory=dict)    # ledger -> what its inputs were calibrated from

    def mean(self, compared: bool = False) -> dict:
        led = self.compared if compared else self.ledgers
        n = len(led)
        return {k: sum(v[k] for v in led.values()) / n for k in LEDGERS}

    @property
    def compared(self) -> dict:
        """The ledgers set beside the measured ones (the whole prediction when the trace can contain all of it)."""
        return self.in_trace if self.in_trace is not None else self.ledgers

    @property
    def step_ns(self) -> float:
        return sum(self.mean().values())


def apply_trace(cfg: Config, facts: dict) -> Config:
    """Trace facts override the file (source = trace)."""
    cfg.set("trace.world_size", facts["world_size"], "trace", f"{facts['ranks_present']} rank file(s) stored")
    if "preset" in facts:
        cfg.set("hardware.preset", facts["preset"][0], "trace", facts["preset"][1])
    for axis in ("dp", "tp", "pp", "ep", "cp"):
        if axis in facts:
            cfg.set(f"parallel.{axis}", int(facts[axis]), "trace", "process-group size")
    if "micro_batches" in facts:
        cfg.set("parallel.micro_batches", int(facts["micro_batches"]), "trace", "sends per rank, group and step")
    for k in ("p2p_bytes", "dp_grad_bytes", "a2a_bytes"):
        if k in facts:
            cfg.set(f"trace.{k}", facts[k], "trace", "collectives.bytes")
    if "ep_loads" in facts:
        cfg.set("trace.ep_loads", [round(x, 1) for x in facts["ep_loads"]], "trace",
                "tokens received per EP rank (Out split size)")
    if "step_ns" in facts:
        cfg.set("trace.step_ns", round(facts["step_ns"][0]), "trace", facts["step_ns"][1])
    if "groups" in facts and facts["groups"]:
        cfg.set("trace.groups", ", ".join(f"{k}:{v['axis']}({v['size']})" for k, v in sorted(facts["groups"].items())),
                "trace", "process group: axis (size)")
    return cfg


class Costs:
    """Collective time: a calibrated fit for (collective, group size) when there is one, else α–β on the
    axis's link level from the hardware preset."""

    def __init__(self, cfg, hw, fits):
        self.cfg, self.hw = cfg, hw
        self.fits = {(f.coll, f.nranks): f for f in fits}

    def t(self, coll, nbytes, n, axis) -> float:
        coll = canonical(coll)
        f = self.fits.get((coll, n))
        if f is not None:
            return f.time(nbytes)
        _lvl, link = axis_link(self.cfg, self.hw, axis, 2 if axis == "pp" else n)
        return coll_time(coll, nbytes, n, link)


def ns(x: float) -> int:
    return int(round(x * 1e9))


def build_plan(cfg: Config, hw, fits=(), achieved: float | None = None, shape_free: dict | None = None
               ) -> tuple[StepPlan, list]:
    costs = Costs(cfg, hw, fits)
    g = {x: cfg[f"parallel.{x}"] for x in ("dp", "tp", "pp", "ep", "cp")}
    details = []
    measured = cfg.get("trace.ep_loads")
    loads = expert_loads(g["ep"], cfg["model.expert_imbalance"], 0, measured) if g["ep"] > 1 else [1.0]
    mt = microbatch_times(cfg, hw, achieved, loads, shape_free)
    details.append(("achieved FLOP/s", mt["achieved"], "model FLOPs / measured kernel time (shape-free)"
                    if shape_free else "GEMMs with Input Dims" if achieved else "compute.mfu × preset peak"))
    fpt = flops_per_token(cfg)
    details.append(("training FLOPs / token", fpt["training"], "6N + 12·L·h·s"))
    act_b = 4 if cfg["model.dtype"] == "fp32" else 2
    h, L, m = cfg["model.hidden"], cfg["model.layers"], cfg["parallel.micro_batches"]
    s_loc = cfg["model.seq_len"] // g["cp"]
    b = cfg["parallel.micro_batch_size"]
    sp = cfg["parallel.sequence_parallel"]
    layers_stage = L // g["pp"]
    plan = StepPlan(dp=g["dp"], tp=g["tp"], pp=g["pp"], ep=g["ep"], cp=g["cp"], schedule=cfg["parallel.schedule"],
                    m=m, fwd=[ns(x) for x in mt["fwd"]], bwd=[ns(x) for x in mt["bwd"]],
                    rec=[ns(x) for x in mt["recompute"]],
                    overlap={x: cfg[f"overlap.{x}"] for x in ("dp", "tp", "pp", "ep", "cp")})
    if g["tp"] > 1:
        # Megatron-LM: two all-reduces of the b·s·h activation per layer in the forward, two in the backward
        # (Shoeybi et al. 2019, §3 and Fig. 4, operators f and g); with sequence parallelism an all-gather +
        # reduce-scatter pair of the same volume (Korthikanti et al. 2022, §4.2.2).
        plan.tp_bytes = b * s_loc * h * act_b
        t1 = costs.t("allreduce", plan.tp_bytes, g["tp"], "tp")
        plan.tp_fwd = plan.tp_bwd = ns(2 * layers_stage * t1)
        details.append(("TP all-reduce, one", t1, f"{plan.tp_bytes} B over {g['tp']}"))
    if g["ep"] > 1 and cfg["model.experts"] > 1:
        tokens = b * s_loc / (g["tp"] if sp else 1)
        payload = cfg.get("trace.a2a_bytes") or a2a_payload_bytes(tokens, cfg["model.top_k"], h, act_b)
        plan.a2a_bytes = int(payload)
        t1 = costs.t("alltoall", payload, g["ep"], "ep")
        moe_stage = cfg["model.moe_layers"] / g["pp"]
        plan.a2a_fwd = plan.a2a_bwd = ns(2 * moe_stage * t1)
        details.append(("EP all-to-all, one", t1, f"{int(payload)} B over {g['ep']}"))
        details.append(("EP loads per EP index", [round(x, 3) for x in loads],
                        "relative to the mean, " + ("measured split sizes" if measured else "busiest first")))
    if g["pp"] > 1:
        pb = cfg.get("trace.p2p_bytes") or b * s_loc * h * act_b / (g["tp"] if sp else 1)
        plan.p2p_bytes = int(pb)
        t1 = costs.t("sendrecv", pb, 2, "pp")
        plan.p2p = ns(t1)
        details.append(("PP send/recv, one", t1, f"{int(pb)} B"))
    pc = param_count(cfg)
    from .pipeline import param_copies

    copies = param_copies(cfg["parallel.schedule"])
    p_gpu = (pc["dense"] / (g["tp"] * g["pp"]) + pc["expert"] / (g["ep"] * g["pp"])) * copies
    n_dp = g["dp"] * g["cp"]
    zs = cfg["parallel.zero_stage"]
    if n_dp > 1:
        gb = cfg.get("trace.dp_grad_bytes") or 2.0 * p_gpu
        plan.grad_bytes = int(gb)
        plan.grad_coll = "allreduce" if zs == 0 else "reduce_scatter"
        t_g = costs.t(plan.grad_coll, gb, n_dp, "dp")
        if zs == 3:
            # ZeRO-3 / FSDP: every layer's parameters gathered before its forward and again before its backward,
            # its gradient reduce-scattered after its backward, in every micro-batch; the gathers prefetched
            # parallel.fsdp_prefetch layers ahead (Rajbhandari et al. 2020, §5; Zhao et al. 2023, FSDP §3.3)
            n_l = max(1, layers_stage)
            plan.z3_layers, plan.z3_prefetch = n_l, cfg["parallel.fsdp_prefetch"]
            plan.z3_bytes = int(2.0 * p_gpu / n_l)
            plan.z3_gather = ns(costs.t("allgather", 2.0 * p_gpu / n_l, n_dp, "dp"))
            plan.z3_reduce = ns(costs.t("reduce_scatter", gb / n_l, n_dp, "dp"))
            plan.param_bytes = int(2.0 * p_gpu)
            details.append(("ZeRO-3 layer all-gather, one", plan.z3_gather / 1e9,
                            f"{plan.z3_bytes} B over {n_dp}, {n_l} layers, prefetch {plan.z3_prefetch}"))
            details.append(("ZeRO-3 layer reduce-scatter, one", plan.z3_reduce / 1e9, f"{int(gb / n_l)} B over {n_dp}"))
        else:
            if zs >= 1:
                t_ag = costs.t("allgather", 2.0 * p_gpu, n_dp, "dp")
                plan.param_bytes = int(2.0 * p_gpu)
                plan.param_gather = ns(t_ag)
            plan.grad_sync = ns(t_g)
            details.append((f"DP {plan.grad_coll}", t_g, f"{int(gb)} B over {n_dp}"))
    shard = p_gpu / (n_dp if zs >= 1 else 1)
    if shape_free and shape_free.get("optimizer") is not None:
        plan.optimizer = ns(shape_free["optimizer"])
        details.append(("optimizer step", plan.optimizer / 1e9,
                        f"measured: {shape_free['kernels']['optimizer']} optimizer kernels"))
    else:
        plan.optimizer = ns(cfg["compute.optimizer_bytes_per_param"] * shard / hw.hbm_bw)
        details.append(("optimizer step", plan.optimizer / 1e9, f"{shard:.3g} params, HBM-bound"))
    return plan, details


def fit_layout(cfg: Config, world: int | None) -> None:
    """The one rule for a layout that contradicts the trace: the trace wins, with a note. What the trace tells
    (world size, group sizes) has already replaced the file's values; ``parallel.dp``, when no DP group told
    it, is then re-derived as world / (tp·pp·cp), noting what the file said. Only a layout that no dp can
    make fit — dp itself told by the trace, or a world size that tp·pp·cp does not divide — is an error."""
    if not world or world_size(cfg) == world:
        return
    from .config import ConfigError

    mp = cfg["parallel.tp"] * cfg["parallel.pp"] * cfg["parallel.cp"]
    if cfg.values["parallel.dp"].source == "trace":
        raise ConfigError(cfg.path, "parallel", f"dp*tp*pp*cp = {world_size(cfg)} but the trace has world size "
                          f"{world} (dp = {cfg['parallel.dp']} from its process groups)")
    if world % mp:
        raise ConfigError(cfg.path, "parallel", f"dp*tp*pp*cp = {world_size(cfg)} but the trace has world size "
                          f"{world}, not a multiple of tp*pp*cp = {mp}")
    cfg.set("parallel.dp", world // mp, "trace", f"= world size {world} / (tp*pp*cp)")


def _ledgers(plan: StepPlan, cfg: Config):
    """(ledgers per rank, events, windows, how the bubble was found) of a plan."""
    p, sched = plan.pp, plan.schedule
    if p == 1 and sched == "dualpipe" and (plan.a2a_fwd or plan.a2a_bwd):
        return _pairs(plan)
    if p == 1 or sched in SIMULATED:
        led, events, windows = step_ledgers(plan)
        return led, events, windows, ("timeline simulation" if p > 1 else "no pipeline")
    # the stage's blocks back to back, plus the bubble of the schedule: simulated per stage
    # (schedule_sim: interleaved, zero-bubble) or the closed form (dualpipe), with the point-to-point
    # transfers (1 − overlap.pp) exposed on every hop
    from . import schedule_sim

    flat = replace(plan, pp=1)
    led1, _events, _windows = step_ledgers(flat)
    w = cfg["compute.weight_grad_share"]
    d_f = max(plan.fwd) + plan.a2a_fwd + plan.tp_fwd
    d_b = max(plan.bwd) + max(plan.rec) + plan.a2a_bwd + plan.tp_bwd
    hop = (1 - plan.overlap.get("pp", 0.0)) * plan.p2p
    sim = None
    if sched in schedule_sim.SCHEDULES and not (sched == "interleaved" and plan.m % p):
        zb = sched == "zero-bubble"
        sim = schedule_sim.simulate(sched, p, plan.m, cfg["parallel.v"], t_f=d_f, t_b=d_b * (1 - w) if zb else d_b,
                                    t_w=d_b * w if zb else None, t_p2p=hop)
    if sim is not None:
        bub = {s: sim.idle[s] for s in range(p)}
        p2p = 0.0          # the hops are inside the simulated idle time
        how = f"{sched} simulated (schedule_sim), makespan {sim.makespan / 1e6:.3f} ms"
    elif sched == "dualpipe":
        # chunk pairs: the all-to-all of each chunk under the paired chunk's compute (dualpipe_sim); the flat
        # step's exposed all-to-all is replaced by what the simulation leaves exposed
        from .dualpipe_sim import simulate_dualpipe

        led0 = step_ledgers(replace(flat, a2a_fwd=0, a2a_bwd=0))[0]
        b_all = max(plan.bwd) + max(plan.rec)
        sim = simulate_dualpipe(p, plan.m, c_f=max(plan.fwd) + plan.tp_fwd, c_b=b_all * (1 - w) + plan.tp_bwd,
                                c_w=b_all * w, a_f=plan.a2a_fwd, a_b=plan.a2a_bwd, t_p2p=hop)
        bub = {s: sim.idle[s] for s in range(p)}
        p2p = 0.0
        for r in range(flat.world):
            led1[r] = dict(led1[r], exposed_comm=led0[r]["exposed_comm"])
        a2a = {s: sim.exposed[s] for s in range(p)}
        how = (f"dualpipe simulated (dualpipe_sim: chunk pairs, EP all-to-all under the paired chunk), makespan "
               f"{sim.makespan / 1e6:.3f} ms")
    else:
        b = bubble_time(sched, p, plan.m, d_f, d_b * (1 - w), d_b * w, cfg["parallel.v"])
        bub = {s: b for s in range(p)}
        p2p = 2 * (p - 1) * hop
        how = f"{sched} closed form" + (" (Megatron's order needs m a multiple of p)" if sched == "interleaved" else "")
    n1 = flat.world
    led = {}
    for r in range(plan.world):
        x = dict(led1[r % n1])
        s = coords(plan, r)["pp"]
        x["bubble"] += int(round(bub[s]))
        x["exposed_comm"] += int(round(p2p + (a2a[s] if sched == "dualpipe" else 0.0)))
        led[r] = x
    return led, None, None, how


def _pairs(plan: StepPlan):
    """DualPipe's steady state on one rank (pp = 1: a trace of chunk pairs): each micro-batch's forward runs
    paired with another's backward, both chunks' all-to-all under the pair's compute; only what exceeds the
    compute is exposed (dualpipe_sim's pair rule). Waits for the busiest EP rank stay straggler."""
    led0 = step_ledgers(replace(plan, a2a_fwd=0, a2a_bwd=0))[0]
    led1 = step_ledgers(plan)[0]
    out = {}
    for r in led0:
        e = coords(plan, r)["ep"]
        comp = plan.fwd[e] + plan.bwd[e] + plan.rec[e] + plan.tp_fwd + plan.tp_bwd
        excess = max(0, plan.a2a_fwd + plan.a2a_bwd - comp)
        x = dict(led0[r])
        x["exposed_comm"] += plan.m * excess
        x["straggler"] += led1[r]["straggler"]
        out[r] = x
    return out, None, None, "dualpipe chunk pairs (pp = 1): the all-to-all under the paired chunk's compute"


def _calibrate(cfg: Config, con, job: str, hw) -> tuple[list, float | None, dict | None, str]:
    """α/β fits, GEMM FLOP/s from shapes, or the shape-free per-class kernel times; and what compute was
    calibrated from."""
    from . import shapefree

    fits = calibrate.fit_from_trace(con, job, hw.nvlink_alpha) + calibrate.fit_from_nccl_tests(con, None,
                                                                                              hw.nvlink_alpha)
    seen, uniq = set(), []
    for f in fits:          # the trace's own collectives first, nccl-tests for what it lacks
        if (f.coll, f.nranks) not in seen:
            seen.add((f.coll, f.nranks))
            uniq.append(f)
    ga = calibrate.gemm_achieved(con, job)
    if ga:
        cfg.set("trace.gemm_flops_per_s", round(ga["achieved"] / 1e12, 2), "trace",
                f"TFLOP/s over {ga['kernels']} GEMM kernels with Input Dims")
        return uniq, ga["achieved"], None, f"GEMM Input Dims ({ga['kernels']} kernels)"
    ct = shapefree.class_times(con, job)
    sf = shapefree.calibrate(cfg, ct, flops_per_token(cfg)) if ct else None
    if sf is None:
        return uniq, None, None, f"compute.mfu {cfg['compute.mfu']} × {hw.name} peak (no shapes, no math kernels)"
    n = sum(sf["kernels"].values())
    cfg.set("trace.compute_calibration", "shape-free", "trace",
            f"no Input Dims: {n} compute kernels per class / ({sf['layers_stage']:g} layers × "
            f"{sf['micro_batches']} micro-batches)")
    for c, t in sf["per_layer"].items():
        cfg.set(f"trace.{c}_ms_per_layer", round(t * 1e3, 4), "trace",
                f"{sf['kernels'][c]} kernels, per layer and micro-batch")
    return uniq, None, sf, f"shape-free: measured kernel time per class ({n} kernels)"


def predict(cfg: Config, con=None, job: str | None = None, calibrate_from_trace: bool = True,
            keep_events: bool = False) -> Prediction:
    """Prediction for ``cfg`` (loaded with load_config); with ``con`` and ``job`` the trace's facts and its
    calibration (α/β fits, GEMM FLOP/s or shape-free kernel times) are used, and the components the trace
    cannot contain are set apart (coverage.py)."""
    fits, achieved, sf = [], None, None
    facts = None
    if con is not None and job is not None:
        from .infer import infer

        facts = infer(con, job)
        apply_trace(cfg, facts)
    world = cfg.get("trace.world_size")
    resolve(cfg, world)
    fit_layout(cfg, world)
    hw = cfg.hardware()
    compute_src = f"compute.mfu {cfg['compute.mfu']} × {hw.name} peak"
    if facts is not None and calibrate_from_trace:
        fits, achieved, sf, compute_src = _calibrate(cfg, con, job, hw)
    plan, details = build_plan(cfg, hw, fits, achieved, sf)
    led, events, windows, bubble_how = _ledgers(plan, cfg)
    p, sched = plan.pp, plan.schedule
    if p > 1:
        w = cfg["compute.weight_grad_share"]
        d_f = max(plan.fwd)
        d_b = max(plan.bwd) + max(plan.rec)
        details.append((f"bubble fraction ({sched}, closed form)",
                        bubble_fraction(sched, p, plan.m, cfg["parallel.v"], d_f, d_b * (1 - w), d_b * w),
                        "no communication"))
    mem = {r: memory_ledger(cfg, coords(plan, r)["pp"]) for r in range(plan.world)}
    pred = Prediction(cfg, plan, led, mem, details, fits)
    comm_src = (", ".join(f"{f.coll} n={f.nranks} ({f.source})" for f in fits) + "; α–β preset otherwise"
                if fits else f"α–β of the {hw.name} preset links")
    pred.sources = {"compute": compute_src, "recompute": compute_src, "exposed_comm": comm_src,
                    "straggler": comm_src + "; expert loads" if plan.ep > 1 else comm_src,
                    "bubble": bubble_how}
    if facts is not None:
        from . import coverage

        pred.excluded = coverage.missing(plan, facts, coverage.kernel_classes(con, job),
                                         coverage.kernel_classes_compute(con, job))
        if pred.excluded:
            pred.in_trace = _ledgers(coverage.strip(plan, pred.excluded), cfg)[0]
    if keep_events:
        pred.events, pred.windows = events, windows
    return pred


def predict_file(path, con=None, job=None, **kw) -> Prediction:
    return predict(load_config(path), con, job, **kw)
