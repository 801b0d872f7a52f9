"""`ninefold batch` over two nights of one job: the diff against the previous night sets the exit code.

A job whose GEMMs are 10 % slower on night 2 (same seed) exits 3 with compute/gemm the top contributor, its
delta the generator's own within a point of the step; the same job on a second seed (only step-to-step noise)
exits 0 with nothing flagged; the index shows the significant rows beside the trend."""
import shutil
from pathlib import Path

import duckdb
import pytest

from ninefold.analysis.ledgers import LEDGERS
from sample_traces.generate import generate
from tests.test_batch_index import index_text, run_night as _run, trend_lines

STEPS = 12


def _night(root: Path, seed: int, scale: float) -> float:
    """The job under ROOT/job for one night; the generator's compute-kernel time per step (all ranks)."""
    shutil.rmtree(root / "job", ignore_errors=True)
    gt = generate(root / "job", ranks=2, steps=STEPS, seed=seed, gemm_scale=scale)
    (root / "job" / "ground_truth.json").unlink()
    return sum(s["compute_kernel_ns"] for r in gt["ranks"] for s in r["steps"]) / STEPS




@pytest.fixture(scope="module")
def slow_gemm(tmp_path_factory):
    base = tmp_path_factory.mktemp("slow")
    t1 = _night(base / "drop", 0, 1.0)
    r1, s1 = _run(base, "n1")
    t2 = _night(base / "drop", 0, 1.1)
    r2, s2 = _run(base, "n2")
    return {"base": base, "r1": r1, "s1": s1, "r2": r2, "s2": s2, "want": t2 - t1,
            "index": (base / "reports" / "index.html").read_text()}


def test_first_night_has_nothing_to_compare(slow_gemm):
    assert slow_gemm["r1"].exit_code == 0, slow_gemm["r1"].output
    assert slow_gemm["s1"]["diffs"] == {} and slow_gemm["s1"]["regressions"] == []


def test_slower_gemms_exit_3_with_gemm_the_top_contributor(slow_gemm):
    r, s = slow_gemm["r2"], slow_gemm["s2"]
    assert r.exit_code == 3, r.output
    assert s["exit_code"] == 3 and s["confidence"] == 0.95
    d = s["diffs"]["job"]
    assert d["previous_night"] == "n1" and d["steps"] == [STEPS, STEPS] and d["changed"] and d["regression"]
    top = d["top"][0]
    assert (top["level"], top["key"]) == ("kclass", "gemm"), d["top"]
    assert 1 <= len(d["top"]) <= 3
    assert {"level", "key", "delta_ns", "ci_low_ns", "ci_high_ns"} <= set(top)
    step = next(x for x in d["rows"] if (x["level"], x["key"]) == ("ledger", "step"))
    assert abs(top["delta_ns"] - slow_gemm["want"]) / step["a_ns"] <= 0.01, (top["delta_ns"], slow_gemm["want"])
    assert 0 < top["ci_low_ns"] <= top["delta_ns"] <= top["ci_high_ns"]
    # the compute ledger is explained by its kernel class, not listed beside it
    assert ("ledger", "compute") not in {(x["level"], x["key"]) for x in d["top"]}
    regs = {x["ledger"]: x for x in s["regressions"]}
    assert {"step", "compute"} <= set(regs) and all(x["job"] == "job" and x["delta_ns"] > 0 for x in regs.values())
    assert all(x["ci_low_ns"] > 0 for x in regs.values())
    log = (slow_gemm["base"] / "reports" / "logs" / "job.log").read_text()
    assert "REGRESSION: step" in log and "diff against night n1" in log


def test_the_index_shows_the_significant_rows_beside_the_trend(slow_gemm):
    text = index_text(slow_gemm["index"])     # the Bokeh page's Divs (no external script)
    assert "tonight's diff" in text
    assert "<td>kclass</td><td title='gemm'>gemm ★</td>" in text
    assert "regression: " in text
    assert text.index("class='side'") < text.index("class='diff'")
    assert list(trend_lines(slow_gemm["index"], "job")) == list(LEDGERS)


def test_samples_kept_for_the_latest_two_nights_only(slow_gemm, tmp_path):
    base = slow_gemm["base"]
    _night(base / "drop", 0, 1.0)
    r, s = _run(base, "n3")   # back to the first night's job: the GEMMs got faster again
    assert r.exit_code == 0, r.output   # an improvement is a change, not a regression
    d = s["diffs"]["job"]
    assert d["previous_night"] == "n2" and d["changed"] and not d["regression"]
    assert d["top"][0]["key"] == "gemm" and d["top"][0]["delta_ns"] < 0
    con = duckdb.connect(str(base / "store" / "c.duckdb"), read_only=True)
    nights = [x[0] for x in con.execute("SELECT DISTINCT night FROM batch_step_samples ORDER BY 1").fetchall()]
    con.close()
    assert nights == ["n2", "n3"]


def test_step_to_step_noise_alone_exits_0_and_flags_nothing(tmp_path):
    _night(tmp_path / "drop", 0, 1.0)
    r1, _ = _run(tmp_path, "n1")
    assert r1.exit_code == 0, r1.output
    _night(tmp_path / "drop", 1, 1.0)   # another seed: the same job, other step-to-step noise
    r2, s = _run(tmp_path, "n2")
    assert r2.exit_code == 0, r2.output
    d = s["diffs"]["job"]
    assert d["previous_night"] == "n1" and not d["changed"] and not d["regression"]
    assert d["top"] == [] and d["rows"] == [] and s["regressions"] == []
    assert "nothing beyond the step-to-step noise" in index_text((tmp_path / "reports" / "index.html").read_text())
