"""Render a predicted step timeline as per-rank Kineto trace files (the writers of sample_traces.generate), so
the ordinary ingest → attribute path can be run on the model's own schedule."""
from __future__ import annotations

import json
import random
from pathlib import Path

from .generate import (FIRST_STEP, FUSED_ADAM, GEMM_H100, LAUNCH_LAT_NS, NCCL_ALLREDUCE,
                                    NCCL_SENDRECV, TRUE_START_REL_NS, RankTrace, _TAILS, footer_text, header_text,
                                    metadata_lines, open_out)

from ninefold.analysis.cost_model.timeline import P2P, STREAM_COMPUTE, STREAM_DP, STREAM_EP, STREAM_RECV_B, STREAM_RECV_F, STREAM_SEND_B, \
    STREAM_SEND_F, STREAM_TP, groups

COMM_KERNELS = {
    "allreduce": NCCL_ALLREDUCE,
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "all_gather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "all_to_allv": NCCL_SENDRECV,
    "send": NCCL_SENDRECV,
    "recv": NCCL_SENDRECV,
}
LEAD_NS = 200_000          # the CPU enters a step this long before its GPU work starts
STREAMS = (STREAM_COMPUTE, STREAM_DP, STREAM_TP, STREAM_EP, STREAM_RECV_F, STREAM_SEND_F, STREAM_RECV_B,
           STREAM_SEND_B)


def _tail(ev, pg_desc, seq):
    g = ev.group
    nel = max(ev.nbytes // 2, 1)
    return (_TAILS[NCCL_ALLREDUCE] if ev.coll not in P2P and ev.coll != "all_to_allv" else _TAILS[NCCL_SENDRECV]) + (
        f', "Collective name": "{ev.coll}", "In msg nelems": {nel}, "Out msg nelems": {nel}, '
        f'"Group size": {len(g)}, "dtype": "BFloat16", "Process Group Name": "{ev.pg}", '
        f'"Process Group Description": "{pg_desc}", '
        f'"Process Group Ranks": "[{", ".join(str(r) for r in g)}]", "Rank": {g.index(ev.rank)}, "Seq": {seq}')


def render(pred, out_dir, steps: int = 3) -> dict:
    """Write rank-<r>.json for ``steps`` identical steps of ``pred`` (a Prediction made with keep_events=True,
    pipeline schedules gpipe / 1f1b or pp = 1). Returns {period_ns, steps, files}."""
    if pred.events is None:
        raise ValueError("the prediction holds no timeline (pipeline schedule without a simulation)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = pred.plan
    world = plan.world
    gs = groups(plan)
    pg_list = [{"pg_name": name, "pg_desc": name, "backend_config": "cuda:nccl", "pg_size": len(g), "ranks": list(g)}
               for name, (_ax, g) in sorted(gs.items())]
    # sequence numbers continue from step to step on every process group
    per_step = {}
    for evs in pred.events.values():
        for ev in evs:
            if ev.pg:
                per_step[ev.pg] = max(per_step.get(ev.pg, 0), ev.seq)
    period = {r: w1 - w0 for r, (w0, w1) in pred.windows.items()}
    P = max(period.values())
    origin = TRUE_START_REL_NS + P + LEAD_NS     # every window start (may be < 0 in step time) lands after it
    files = []
    for r in range(world):
        rt = RankTrace(r, world, 0, random.Random(r))
        path = out / f"rank-{r}.json"
        fh = open_out(path, False)
        fh.write(header_text(r, world, pg_list) + metadata_lines(rt, origin - P, sorted({e.stream for e in pred.events[r]} | {STREAM_COMPUTE})))
        evs = pred.events[r]
        w0 = pred.windows[r][0]
        for n in range(steps):
            shift = origin + n * P
            c0 = shift + w0 - LEAD_NS
            c1 = c0 + P
            x, _ = rt.ids()
            rt.cpu("user_annotation", f"ProfilerStep#{FIRST_STEP + n}", c0, c1 - c0, f'{{"External id": {x}}}')
            for i, ev in enumerate(evs):
                s = shift + ev.start
                d = ev.end - ev.start
                launch = min(c0 + 1000 + 100 * i, s - LAUNCH_LAT_NS)
                assert c0 <= launch < c1, "launch outside its step"
                x, cid = rt.ids()
                if ev.kind == "comm":
                    desc = ev.pg
                    kname = COMM_KERNELS[ev.coll]
                    tail = _tail(ev, desc, ev.seq + n * per_step[ev.pg])
                    args = tail[tail.index('"Collective name"'):]
                    rt.cpu("cpu_op", "record_param_comms", launch - 40, 80, f'{{"External id": {x}, {args}}}')
                else:
                    kname = FUSED_ADAM if ev.name == "optimizer" else GEMM_H100
                    tail = _TAILS[kname]
                    cname = "aten::_fused_adamw_" if ev.name == "optimizer" else "aten::mm"
                    rt.cpu("cpu_op", cname, launch - 40, 80, f'{{"External id": {x}}}')
                    if ev.kind == "recompute":
                        xr, _ = rt.ids()
                        rt.cpu("cpu_op", "CheckpointFunctionBackward", launch - 45, 90, f'{{"External id": {xr}}}')
                rt.runtime("cudaLaunchKernel", launch, 30, cid, x, 211)
                rt.gpu("kernel", kname, ev.stream, s, d, cid, x, tail)
            fh.write("".join(rt.cbuf) + "".join(rt.gbuf))
            rt.cbuf.clear()
            rt.gbuf.clear()
        fh.write(footer_text(rt, origin + steps * P, str(path)))
        fh.close()
        files.append(str(path))
    meta = {"period_ns": P, "steps": steps, "files": files, "world_size": world}
    (out / "render.json").write_text(json.dumps(meta, indent=1))
    return meta
