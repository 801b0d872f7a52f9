"""What the trace can contain: a predicted component whose kind of communication the trace does not record at
all is still predicted and shown, but left out of the residual and the step comparison, with the reason.

Rule (one, for every axis): a component is *in the trace* when the trace has a collective on a process group of
that axis, or — where the groups are not recorded or not classified — any kernel of the collective's kind
(an all-reduce / reduce-scatter / all-gather kernel for DP, TP; all-to-all for EP; send/recv for PP). Only when
neither is there is it excluded. A partial trace (one chunk of a step, one rank of many) is the usual cause:
e.g. a profile of one forward/backward chunk pair has no gradient sync and no stage-to-stage transfer. The
optimizer step follows the same rule with the optimizer kernel class (a profile of forward and backward only
has none)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ninefold.analysis.classify import classify_kernel

# axis -> (kernel classes of ninefold.analysis.classify that can carry it, what the component is)
KINDS = {
    "dp": (("allreduce", "reducescatter", "allgather"), "DP gradient sync / ZeRO parameter all-gather"),
    "tp": (("allreduce", "reducescatter", "allgather"), "TP all-reduce (or SP all-gather + reduce-scatter)"),
    "ep": (("alltoall", "sendrecv", "nvshmem"), "EP all-to-all dispatch / combine"),
    "pp": (("sendrecv",), "PP send/recv between stages"),
}


@dataclass(frozen=True)
class Excluded:
    axis: str
    what: str
    reason: str


def kernel_classes(con, job: str) -> dict:
    """Communication kernel class -> count in the job's traces."""
    out: dict = {}
    for name, n in con.execute("""SELECT name, count(*) FROM gpu_ops WHERE job = ? AND kind = 'kernel'
                                  GROUP BY name""", [job]).fetchall():
        fam, cls = classify_kernel(name)
        if fam == "comm":
            out[cls] = out.get(cls, 0) + n
    return out


def kernel_classes_compute(con, job: str) -> set:
    """Compute kernel classes present in the job's traces."""
    out = set()
    for (name,) in con.execute("SELECT DISTINCT name FROM gpu_ops WHERE job = ? AND kind = 'kernel'", [job]).fetchall():
        fam, cls = classify_kernel(name)
        if fam == "compute":
            out.add(cls)
    return out


def _predicted(plan, axis) -> bool:
    if axis == "optimizer":
        return bool(plan.optimizer)
    if axis == "dp":
        return bool(plan.grad_sync or plan.param_gather or plan.z3_layers)
    if axis == "tp":
        return bool(plan.tp_fwd or plan.tp_bwd)
    if axis == "ep":
        return bool(plan.a2a_fwd or plan.a2a_bwd)
    return bool(plan.p2p) and plan.pp > 1


def missing(plan, facts: dict, classes: dict, compute_classes: set | None = None) -> list[Excluded]:
    """The predicted components the trace cannot contain, by the rule above (the optimizer only when
    ``compute_classes`` is given)."""
    axes_seen = {g["axis"] for g in (facts.get("groups") or {}).values() if g.get("colls")}
    out = []
    for axis, (kinds, what) in KINDS.items():
        if not _predicted(plan, axis) or axis in axes_seen:
            continue
        if any(classes.get(k) for k in kinds):
            continue
        out.append(Excluded(axis, what, f"the trace records no {axis.upper()} collective and no "
                                         f"{'/'.join(kinds)} kernel"))
    if compute_classes is not None and _predicted(plan, "optimizer") and "optimizer" not in compute_classes:
        out.append(Excluded("optimizer", "optimizer step", "the trace records no optimizer kernel"))
    return out


def strip(plan, excluded: list[Excluded]):
    """The plan without the excluded components (what the trace can be compared with)."""
    kw: dict = {}
    for ex in excluded:
        if ex.axis == "dp":
            kw.update(grad_sync=0, param_gather=0, z3_layers=0)
        elif ex.axis == "tp":
            kw.update(tp_fwd=0, tp_bwd=0)
        elif ex.axis == "ep":
            kw.update(a2a_fwd=0, a2a_bwd=0)
        elif ex.axis == "pp":
            kw.update(p2p=0)
        elif ex.axis == "optimizer":
            kw.update(optimizer=0)
    return replace(plan, **kw)
