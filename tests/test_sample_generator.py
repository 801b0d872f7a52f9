import gzip
import json
import re
from decimal import Decimal

import pytest

from sample_traces.generate import BASE_TIME_NS, STRAGGLER_DELAY_NS, generate
from sample_traces.pipeline import generate_1f1b

TS_RE = re.compile(rb'"(ts|dur)": ([^,}]+)')
THREE = re.compile(rb"^\d+\.\d{3}$")


def _ns(v):
    return int(Decimal(v) * 1000)


def _load(path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    return raw, json.loads(raw, parse_float=Decimal)


def _counts(events):
    c = {}
    for e in events:
        if e.get("ph") == "X":
            c[e["cat"]] = c.get(e["cat"], 0) + 1
    c["profiler_steps"] = sum(1 for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
    c["flow_start"] = sum(1 for e in events if e.get("ph") == "s")
    c["flow_end"] = sum(1 for e in events if e.get("ph") == "f")
    return c


@pytest.mark.parametrize("gz", [False, True])
def test_rank_files_match_ground_truth(tmp_path, gz):
    gt = generate(tmp_path, ranks=4, steps=3, seed=1, gzip=gz)
    assert json.loads((tmp_path / "ground_truth.json").read_text()) == gt
    for rk in gt["ranks"]:
        raw, doc = _load(tmp_path / rk["file"])
        assert list(doc) == ["schemaVersion", "deviceProperties", "distributedInfo", "displayTimeUnit",
                             "baseTimeNanoseconds", "traceEvents", "traceName"]
        assert doc["baseTimeNanoseconds"] == BASE_TIME_NS
        assert doc["distributedInfo"]["rank"] == rk["rank"]
        ev = doc["traceEvents"]
        assert ev[-1]["name"] == "Record Window End"
        c = _counts(ev)
        for key in ("kernel", "gpu_memcpy", "gpu_memset", "profiler_steps", "cpu_op", "user_annotation",
                    "cuda_runtime", "flow_start", "flow_end"):
            assert c.get(key, 0) == rk["counts"][key], key
        assert len(ev) == rk["counts"]["trace_events"]
        times = TS_RE.findall(raw)
        assert len(times) > 1000
        assert all(THREE.match(v) for _, v in times)
        # per-step facts visible in the file
        steps = {e["name"]: e for e in ev if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}
        gpu = [e for e in ev if e.get("ph") == "X" and e.get("pid") == 0]
        for st in rk["steps"]:
            pe = steps[f"ProfilerStep#{st['step']}"]
            s = BASE_TIME_NS + _ns(pe["ts"])
            assert [s, s + _ns(pe["dur"])] == st["window_abs_ns"]
            inside = [BASE_TIME_NS + _ns(e["ts"]) for e in gpu
                      if st["window_abs_ns"][0] <= BASE_TIME_NS + _ns(e["ts"]) < st["window_abs_ns"][1]]
            assert min(inside) == st["first_gpu_start_abs_ns"]
        # GPU work of a step never overlaps the next step's
        for a, b in zip(rk["steps"], rk["steps"][1:]):
            assert a["last_gpu_end_abs_ns"] < b["first_gpu_start_abs_ns"]


def test_straggler_collective_ends_together(tmp_path):
    W = 4
    gt = generate(tmp_path, ranks=W, steps=3, seed=3)
    strag = gt["straggler"]
    assert strag["rank"] == W - 1 and strag["delay_ns"] == STRAGGLER_DELAY_NS
    ends, starts = [], []
    for rk in gt["ranks"]:
        _, doc = _load(tmp_path / rk["file"])
        (k,) = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"
                and e["name"].startswith("ncclDevKernel_AllReduce") and e["args"]["Seq"] == strag["seq"]]
        assert k["args"]["Collective name"] == "allreduce" and k["args"]["Group size"] == W
        off = rk["clock_offset_ns"]
        s = BASE_TIME_NS + _ns(k["ts"]) - off
        starts.append(s)
        ends.append(s + _ns(k["dur"]))
    coll = gt["collectives"][strag["step_index"]]
    assert len(set(ends)) == 1 and ends[0] == coll["true_end_ns"]
    assert starts == coll["true_arrival_ns"]
    assert starts[W - 1] - max(starts[:W - 1]) == STRAGGLER_DELAY_NS
    assert ends[0] - starts[W - 1] == coll["transfer_ns"]
    # clocks really disagree across ranks in the raw file
    assert len({o for o in (r["clock_offset_ns"] for r in gt["ranks"])}) == W


def test_planted_gaps_and_recompute(tmp_path):
    gt = generate(tmp_path, ranks=2, steps=2, seed=5)
    rk = gt["ranks"][0]
    _, doc = _load(tmp_path / rk["file"])
    gpu = sorted((BASE_TIME_NS + _ns(e["ts"]), BASE_TIME_NS + _ns(e["ts"]) + _ns(e["dur"]), e)
                 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 0)
    for st in rk["steps"]:
        g = st["host_launch_gap"]
        ends_at = [e for s, e, _ in gpu if e == g["start_abs_ns"]]
        starts_at = [s for s, e, _ in gpu if s == g["end_abs_ns"]]
        assert ends_at and starts_at and g["end_abs_ns"] - g["start_abs_ns"] == 300_000
        assert not [1 for s, e, _ in gpu if s < g["end_abs_ns"] and e > g["start_abs_ns"]]
        m = st["memcpy_dtoh"]
        assert not [1 for s, e, ev in gpu if s < m["end_abs_ns"] and e > m["start_abs_ns"]
                    and ev["cat"] != "gpu_memcpy"]
        assert st["recompute_kernel_ns"] > 0
    assert sum(1 for e in doc["traceEvents"] if e.get("name") == "CheckpointFunctionBackward") == 2


def test_target_mb(tmp_path):
    gt = generate(tmp_path, ranks=1, steps=1, seed=0, target_mb=2)
    assert (tmp_path / "rank-0.json").stat().st_size >= 2 * (1 << 20)
    _, doc = _load(tmp_path / "rank-0.json")
    assert _counts(doc["traceEvents"])["kernel"] == gt["ranks"][0]["counts"]["kernel"]
    assert gt["straggler"] is None


def test_pipeline_1f1b(tmp_path):
    gt = generate_1f1b(tmp_path, stages=4, microbatches=8, seed=0)
    assert gt["theoretical_bubble_fraction"] == pytest.approx(3 / 11)
    for st in gt["stage_info"]:
        raw, doc = _load(tmp_path / st["file"])
        assert all(THREE.match(v) for _, v in TS_RE.findall(raw))
        ks = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        assert len(ks) == st["counts"]["kernel"]
        p2p = [e for e in ks if e["name"].startswith("ncclDevKernel_SendRecv")]
        assert len(p2p) == st["counts"]["p2p_kernels"]
        assert all(e["args"]["Group size"] == 2 and e["args"]["Collective name"] in ("send", "recv") for e in p2p)
        comp = [e for e in ks if e["args"]["stream"] == 7]
        assert sum(_ns(e["dur"]) for e in comp) == st["compute_busy_ns"] == 8 * 3 * gt["forward_ns"]
        first = min(BASE_TIME_NS + _ns(e["ts"]) for e in comp)
        assert first == st["first_forward_start_abs_ns"]
        assert st["bubble_fraction_actual"] == pytest.approx(gt["theoretical_bubble_fraction"], abs=0.02)
    last = gt["stage_info"][-1]
    assert last["idle_before_first_forward_ns"] >= 3 * gt["forward_ns"]
