"""Seeded generator of per-rank PyTorch Flight Recorder dumps (NCCL backend) of an N-rank job that hangs.

    python -m sample_traces.flight_recorder OUT_DIR [--world 8] [--steps 4] [--hang-ranks 5,6] [--seed 0]

writes ``OUT_DIR/pickle/nccl_trace_rank_<r>.pkl`` (what ``TORCH_FR_DUMP_TEMP_FILE`` dumps: a pickle with tuples,
None and stack frames), ``OUT_DIR/json/nccl_trace_rank_<r>.json`` (the ``_dump_nccl_trace_json`` form: lists
instead of tuples, no frames, pg_status values as strings) and ``OUT_DIR/ground_truth.json``.

The schema follows formats.md §4.2 (version "2.10"): ``pg_config`` keyed by pg name with ``ranks`` as a string,
``pg_status`` keyed by the local pg uid, entries with record_id, pg_id, process_group (name, desc),
collective_seq_id, p2p_seq_id, op_id, profiling_name, time_created_ns, input/output sizes and dtypes, state,
time_discovered_started/completed_ns, duration_ms, retired, timeout_ms, is_p2p, frames, thread_id/name.

The job: a default group "0" over all ranks and tensor-parallel groups "1", "2", ... of ``tp`` consecutive
ranks (desc "tp"; each rank holds only its own, with local uid 1). Each step runs two all_reduces on the tp
group, a send/recv with the neighbour rank (p2p on the default group), then reduce_scatter and all_gather on
the default group. In the last step the ``hang_ranks`` stop before the default group's reduce_scatter (a stuck
data loader): every other rank has that collective (sequence N) ``started`` and never completed; the hang
ranks' last completed collective on the default group is N-1. ``buffer_size`` keeps only the newest entries
per rank, as the ring buffer does (record_id keeps counting).
"""
from __future__ import annotations

import argparse
import json
import pickle
import random
from pathlib import Path

VERSION = "2.10"
COMM_LIB = "2.21.5"
T0_NS = 1_735_689_600_000_000_000
TIMEOUT_MS = 600_000
FRAMES = [
    ("forward", "model/transformer.py", 212),
    ("_call_impl", "torch/nn/modules/module.py", 1747),
    ("train_step", "train.py", 88),
    ("main", "train.py", 131),
    ("<module>", "train.py", 140),
]
OP_FRAME = {"nccl:all_reduce": "all_reduce", "nccl:reduce_scatter": "reduce_scatter_tensor",
            "nccl:all_gather": "all_gather_into_tensor", "nccl:send": "send", "nccl:recv": "recv"}


def _frames(op: str, line: int) -> list[dict]:
    top = {"name": OP_FRAME.get(op, op.split(":")[-1]), "filename": "torch/distributed/distributed_c10d.py",
           "line": line}
    return [top] + [{"name": n, "filename": f, "line": ln} for n, f, ln in FRAMES]


def generate(out_dir, world=8, steps=4, tp=4, hang_ranks=(5, 6), seed=0, buffer_size=None, numel=1 << 20):
    """Write the dumps; return the ground truth (also written to ground_truth.json)."""
    if world % tp:
        raise ValueError("world must be a multiple of tp")
    out = Path(out_dir)
    (out / "pickle").mkdir(parents=True, exist_ok=True)
    (out / "json").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    hang = sorted(set(int(r) for r in hang_ranks))
    tp_name = {r: str(1 + r // tp) for r in range(world)}
    tp_ranks = {g: [r for r in range(world) if tp_name[r] == g] for g in set(tp_name.values())}

    # the schedule of (step, pg kind, op, is_p2p); every rank runs it, hang ranks stop early in the last step
    sched = []
    for s in range(steps):
        sched += [(s, "tp", "nccl:all_reduce", False), (s, "tp", "nccl:all_reduce", False),
                  (s, "default", "p2p", True),
                  (s, "default", "nccl:reduce_scatter", False), (s, "default", "nccl:all_gather", False)]
    hang_at = len(sched) - 2  # the last step's reduce_scatter on the default group
    clock = {r: T0_NS + rng.randrange(0, 50_000) for r in range(world)}
    dumps = {}
    gt_last = {}
    n_default = None
    for r in range(world):
        rr = random.Random(seed * 7919 + r)
        entries = []
        seq = {"0": 0, tp_name[r]: 0}
        p2p = {"0": 0, tp_name[r]: 0}
        op_id = {"0": 0, tp_name[r]: 0}
        status = {"0": [-1, -1, -1], tp_name[r]: [-1, -1, -1]}  # enqueued, started, completed
        t = clock[r]
        # the others enqueue the hung collective and wait in it; the hang ranks never get there
        stop = hang_at if r in hang else hang_at + 1
        for i, (step, kind, op, is_p2p) in enumerate(sched[:stop]):
            pg = "0" if kind == "default" else tp_name[r]
            desc = "default_pg" if pg == "0" else "tp"
            pg_id = 0 if pg == "0" else 1
            ops = [op] if not is_p2p else (["nccl:send", "nccl:recv"] if r % 2 == 0 else ["nccl:recv", "nccl:send"])
            for o in ops:
                op_id[pg] += 1
                if is_p2p:
                    p2p[pg] += 1
                else:
                    seq[pg] += 1
                t += 200_000 + rr.randrange(0, 100_000)
                hung = (i == hang_at)
                dur = round(1.5 + rr.random() * 0.5 + (2.0 if o == "nccl:all_gather" else 0.0), 3)
                started = t + 20_000 + rr.randrange(0, 30_000)
                completed = None if hung else started + int(dur * 1e6) + rr.randrange(10_000, 60_000)
                size = numel // (tp if pg != "0" else 1)
                in_sz, out_sz = [[size]], [[size]]
                if o == "nccl:reduce_scatter":
                    in_sz = [[size * world]]
                elif o == "nccl:all_gather":
                    out_sz = [[size * world]]
                entries.append({
                    "record_id": len(entries), "pg_id": pg_id, "process_group": (pg, desc),
                    "collective_seq_id": seq[pg], "p2p_seq_id": p2p[pg], "op_id": op_id[pg],
                    "profiling_name": o, "time_created_ns": t,
                    "input_sizes": in_sz, "input_dtypes": ["BFloat16"],
                    "output_sizes": out_sz, "output_dtypes": ["BFloat16"],
                    "state": "started" if hung else "completed",
                    "time_discovered_started_ns": started, "time_discovered_completed_ns": completed,
                    "duration_ms": None if hung else dur, "retired": not hung, "timeout_ms": TIMEOUT_MS,
                    "is_p2p": is_p2p, "frames": _frames(o, 3000 + len(o)),
                    "thread_id": str(140_000_000_000_000 + r), "thread_name": "pt_main_thread",
                })
                st = status[pg]
                if not is_p2p:
                    st[0] = seq[pg]
                    st[1] = seq[pg]
                    if not hung:
                        st[2] = seq[pg]
                if completed is not None:
                    t = completed
        if r not in hang:
            n_default = seq["0"]
        gt_last[r] = {"0": status["0"][2], tp_name[r]: status[tp_name[r]][2]}
        if buffer_size is not None and len(entries) > buffer_size:
            entries = entries[-buffer_size:]
        pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))},
                     tp_name[r]: {"name": tp_name[r], "desc": "tp", "ranks": str(tp_ranks[tp_name[r]])}}
        pg_status = {str(0 if g == "0" else 1): {"last_enqueued_collective": v[0], "last_started_collective": v[1],
                                                 "last_completed_collective": v[2]} for g, v in status.items()}
        dump = {"version": VERSION, "comm_lib_version": COMM_LIB, "pg_config": pg_config, "pg_status": pg_status,
                "nccl_comm_state": {}, "entries": entries}
        dumps[r] = dump
        (out / "pickle" / f"nccl_trace_rank_{r}.pkl").write_bytes(pickle.dumps(dump, protocol=4))
        jdump = dict(dump)
        jdump["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in pg_status.items()}
        jdump["entries"] = [{k: (list(v) if k == "process_group" else v) for k, v in e.items() if k != "frames"}
                            for e in entries]
        (out / "json" / f"nccl_trace_rank_{r}.json").write_text(json.dumps(jdump, indent=1))
    reached = [r for r in range(world) if r not in hang]
    gt = {
        "generator": "sample_traces.flight_recorder", "seed": seed, "world_size": world, "tp": tp,
        "steps": steps, "buffer_size": buffer_size, "version": VERSION,
        "hang": {"pg_name": "0", "pg_desc": "default_pg", "seq": n_default, "op": "nccl:reduce_scatter",
                 "missing_ranks": hang, "reached_ranks": reached,
                 "state_on_reached": "started"},
        "last_completed": {str(r): v for r, v in gt_last.items()},
        "tp_groups": {g: rs for g, rs in sorted(tp_ranks.items())},
    }
    (out / "ground_truth.json").write_text(json.dumps(gt, indent=1))
    return gt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--hang-ranks", default="5,6")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--buffer-size", type=int, default=None)
    a = ap.parse_args(argv)
    hang = [int(x) for x in a.hang_ranks.split(",") if x.strip()]
    gt = generate(a.out_dir, world=a.world, steps=a.steps, tp=a.tp, hang_ranks=hang, seed=a.seed,
                  buffer_size=a.buffer_size)
    print(json.dumps(gt["hang"]))


if __name__ == "__main__":
    main()
