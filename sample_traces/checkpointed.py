"""Seeded Kineto traces of a job with activation checkpointing in both of PyTorch's forms, recompute planted.

    python -m sample_traces.checkpointed OUT_DIR [--ranks 2] [--steps 2] [--seed 0]
    generate_checkpointed(out_dir, ...) -> ground truth dict

Per step and rank, four layers. Forward on the main thread: layer 0 inside ``CheckpointFunction`` (the reentrant
checkpoint's original forward, run once: compute), layer 1 inside the non-reentrant checkpoint's python frames.
Backward on the autograd engine's own thread (as on a GPU), layers 3..0:

* layer 1 (non-reentrant): ``evaluate_function: MmBackward0`` > ``checkpoint.py(…): unpack_hook`` >
  ``checkpoint.py(…): recompute_fn`` launching the re-run forward (recompute), then the layer's backward
  kernels launched in the same node after the frame closes (compute);
* layer 0 (reentrant): ``evaluate_function: CheckpointFunctionBackward`` > ``CheckpointFunctionBackward``
  launching the re-run forward (recompute), then the inner backward (a nested ``evaluate_function`` node) and
  one more kernel launched inside ``CheckpointFunctionBackward`` after the inner backward began (compute).

While each recompute runs, the main thread launches a kernel of its own (a gradient-bucket copy) that the GPU
runs between two recompute kernels: launched outside recompute, so compute, though it runs inside the window.
All kernels share one stream, so the recompute ledger is exactly the planted recompute kernels' time. Names
are those a real capture records (see ``sample_traces/capture_gloo.py``).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from .generate import (BWD_LAYER, COMPUTE_STREAM, ELEM_ADD, FIRST_STEP, FWD_LAYER,
                       STEP_SEPARATION_NS, TRUE_START_REL_NS, RankTrace, footer_text, header_text, metadata_lines,
                       open_out)

CKPT = "torch/utils/checkpoint.py"
FRAMES_NONREENTRANT_FWD = f"{CKPT}(1558): _checkpoint_without_reentrant_generator"
FRAME_UNPACK = f"{CKPT}(1165): unpack_hook"
FRAME_RECOMPUTE = f"{CKPT}(1657): recompute_fn"


class _Job:
    def __init__(self, rt: RankTrace):
        self.rt = rt
        self.main = rt.pid
        self.autograd = rt.pid + 1
        self.recompute_ns = 0
        self.recompute_n = 0
        self.compute_ns = 0
        self.inside_window_other_thread = 0

    def launch(self, tid, cname, kname, base, recompute=False):
        rt = self.rt
        rt.tid = tid
        ks, ke = rt.op_kernel(cname, kname, rt.jitter(base))
        rt.tid = self.main
        if recompute:
            self.recompute_ns += ke - ks
            self.recompute_n += 1
        else:
            self.compute_ns += ke - ks
        return ks, ke

    def annotate(self, tid, cat, name, s, e):
        rt = self.rt
        x, _ = rt.ids()
        rt.tid = tid
        rt.cpu(cat, name, s, e - s, f'{{"External id": {x}}}')
        rt.tid = self.main

    def recompute_with_intruder(self, tid):
        """The re-run forward on TID; after its first kernel the main thread launches one kernel of its own."""
        rt = self.rt
        for j, (cname, kname, base) in enumerate(FWD_LAYER):
            self.launch(tid, cname, kname, base, recompute=True)
            if j == 0:
                self.launch(self.main, "aten::copy_", ELEM_ADD, 30_000)
                self.inside_window_other_thread += 1
        return rt.c


def _step(job: _Job, S):
    rt = job.rt
    rt.c = S + 5000
    # forward, main thread
    for li in range(4):
        s0 = rt.c
        rt.c += 1000
        for cname, kname, base in FWD_LAYER:
            job.launch(job.main, cname, kname, base)
        rt.c += 1000
        if li == 0:
            job.annotate(job.main, "cpu_op", "CheckpointFunction", s0, rt.c)
        elif li == 1:
            job.annotate(job.main, "python_function", FRAMES_NONREENTRANT_FWD, s0, rt.c)
    # backward, autograd thread
    for li in reversed(range(4)):
        n_s = rt.c
        rt.c += 1500
        if li == 1:
            u_s = rt.c
            rt.c += 800
            r_s = rt.c
            rt.c += 700
            job.recompute_with_intruder(job.autograd)
            rt.c += 700
            r_e = rt.c
            rt.c += 500
            job.annotate(job.autograd, "python_function", FRAME_RECOMPUTE, r_s, r_e)
            job.annotate(job.autograd, "python_function", FRAME_UNPACK, u_s, rt.c)
            for cname, kname, base in BWD_LAYER:
                job.launch(job.autograd, cname, kname, base)
            rt.c += 1000
            job.annotate(job.autograd, "cpu_op", "autograd::engine::evaluate_function: MmBackward0", n_s, rt.c)
        elif li == 0:
            c_s = rt.c
            rt.c += 1000
            job.recompute_with_intruder(job.autograd)
            b_s = rt.c
            rt.c += 1000
            for cname, kname, base in BWD_LAYER:
                job.launch(job.autograd, cname, kname, base)
            rt.c += 1000
            job.annotate(job.autograd, "cpu_op", "autograd::engine::evaluate_function: MmBackward0", b_s, rt.c)
            job.launch(job.autograd, "aten::add_", ELEM_ADD, 25_000)  # inside CFB, after the inner backward
            rt.c += 1000
            job.annotate(job.autograd, "cpu_op", "CheckpointFunctionBackward", c_s, rt.c)
            rt.c += 500
            job.annotate(job.autograd, "cpu_op", "autograd::engine::evaluate_function: CheckpointFunctionBackward",
                         n_s, rt.c)
        else:
            for cname, kname, base in BWD_LAYER:
                job.launch(job.autograd, cname, kname, base)
            rt.c += 1000
            job.annotate(job.autograd, "cpu_op", "autograd::engine::evaluate_function: MmBackward0", n_s, rt.c)
        rt.c += 2000


def generate_checkpointed(out_dir, ranks=2, steps=2, seed=0):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    W = int(ranks)
    files = [f"rank-{r}.json" for r in range(W)]
    gt = {"generator": "sample_traces.checkpointed", "seed": seed, "world_size": W, "files": files, "ranks": []}
    for r in range(W):
        rt = RankTrace(r, W, 0, random.Random(seed * 1000 + 53 + r))
        job = _Job(rt)
        S = TRUE_START_REL_NS
        steps_gt = []
        with open_out(out / files[r], False) as fh:
            fh.write(header_text(r, W) + metadata_lines(rt, S, (COMPUTE_STREAM,)))
            for n in range(steps):
                job.recompute_ns = job.compute_ns = job.recompute_n = 0
                _step(job, S)
                S_next = max(rt.c, rt.g) + STEP_SEPARATION_NS
                x, _ = rt.ids()
                rt.cpu("user_annotation", f"ProfilerStep#{FIRST_STEP + n}", S, S_next - S, f'{{"External id": {x}}}')
                rt.flush_to(fh)
                steps_gt.append({"step": FIRST_STEP + n, "recompute_kernel_ns": job.recompute_ns,
                                 "recompute_kernel_count": job.recompute_n, "compute_kernel_ns": job.compute_ns})
                S = S_next
            fh.write(footer_text(rt, S, str(out / files[r])))
        gt["ranks"].append({"rank": r, "file": files[r], "main_tid": job.main, "autograd_tid": job.autograd,
                            "steps": steps_gt,
                            "recompute_kernel_ns": sum(s["recompute_kernel_ns"] for s in steps_gt),
                            "compute_kernel_ns": sum(s["compute_kernel_ns"] for s in steps_gt),
                            "other_thread_kernels_inside_recompute": job.inside_window_other_thread})
    (out / "ground_truth.json").write_text(json.dumps(gt, indent=1))
    return gt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    generate_checkpointed(a.out_dir, a.ranks, a.steps, a.seed)


if __name__ == "__main__":
    main()
