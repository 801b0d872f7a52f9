"""``predict --explain`` / ``compare --explain``: every ledger's terms, with values that recompose the ledger and
sources that name where each came from."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ninefold.ingest.load import ingest_paths
from ninefold.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "sample_traces" / "configs"


@pytest.fixture
def sample_db(tmp_path):
    from ninefold.store.connection import connect

    db = tmp_path / "s.duckdb"
    con = connect(db)
    ingest_paths(con, [str(ROOT / "sample_traces" / "dp4"), str(ROOT / "sample_traces" / "pp4_1f1b")])
    con.close()
    return db


def _terms(db, job, config):
    r = CliRunner().invoke(cli, ["predict", str(CONFIGS / config), "--db", str(db), "--job", job,
                                 "--format", "json", "--explain"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    return out, {(t["ledger"], t["term"]): t for t in out["terms"]}


def test_terms_recompose_the_compute_and_comm_ledgers(sample_db):
    from ninefold.analysis.cost_model import calibrate
    from ninefold.store.connection import connect

    out, t = _terms(sample_db, "dp4", "dp4.toml")
    led = out["ledgers_ns"]["0"]
    f = t[("compute", "forward per micro-batch (busiest rank)")]["value"]
    b = t[("compute", "backward per micro-batch")]["value"]
    m = t[("compute", "micro-batches")]["value"]
    opt = t[("compute", "optimizer step")]["value"]
    assert m * (f + b) + opt == pytest.approx(led["compute"] / 1e6, rel=1e-4)
    assert t[("recompute", "recompute per micro-batch")]["value"] * m == pytest.approx(led["recompute"] / 1e6,
                                                                                      rel=1e-4)
    # the DP term is the trace's gradient bytes through the trace's own all-reduce fit
    nbytes = t[("exposed_comm", "DP bytes (one)")]["value"]
    con = connect(sample_db, read_only=True)
    fit = next(x for x in calibrate.fit_from_trace(con, "dp4", 0.0) if x.coll == "allreduce")
    gt = json.loads((ROOT / "sample_traces" / "dp4" / "ground_truth.json").read_text())
    con.close()
    assert nbytes == gt["collectives"][0]["nelems"] * 2
    one = t[("exposed_comm", "DP time (one): α·steps + bytes/β")]
    assert one["source"].startswith("allreduce n=4 fitted from trace")
    assert one["value"] / 1e3 == pytest.approx(fit.time(nbytes), rel=0.05)
    assert t[("exposed_comm", "DP overlap factor")]["value"] == 0.0
    # overlap 0 and nothing else on the stream: the ledger is the one all-reduce
    assert led["exposed_comm"] / 1e9 == pytest.approx(one["value"] / 1e3, rel=0.02)
    assert "shape-free" in t[("compute", "achieved rate")]["source"]


def test_pipeline_terms_name_the_schedule(sample_db):
    out, t = _terms(sample_db, "pp4_1f1b", "pp4_1f1b.toml")
    sched = t[("bubble", "schedule")]
    assert sched["value"] == 4 and sched["source"].startswith("1f1b: timeline simulation")
    assert t[("exposed_comm", "PP count per step")]["value"] == 6
    assert t[("exposed_comm", "PP bytes (one)")]["value"] == 8 * 4096 * 1024 * 2


def test_explain_text_in_predict_and_compare(sample_db):
    r = CliRunner().invoke(cli, ["predict", str(CONFIGS / "dp4.toml"), "--db", str(sample_db), "--job", "dp4",
                                 "--explain"])
    assert r.exit_code == 0, r.output
    assert "explain: the terms of each predicted ledger" in r.output
    assert "  compute: " in r.output and "  exposed_comm: " in r.output
    r2 = CliRunner().invoke(cli, ["predict", str(CONFIGS / "dp4.toml"), "--db", str(sample_db), "--job", "dp4"])
    assert "explain:" not in r2.output
    r3 = CliRunner().invoke(cli, ["compare", "--db", str(sample_db), "--job", "dp4", "--config",
                                  str(CONFIGS / "dp4.toml"), "--explain"])
    assert r3.exit_code == 0, r3.output
    assert "explain: the terms of each predicted ledger" in r3.output and "DP bytes (one)" in r3.output
