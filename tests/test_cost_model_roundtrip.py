"""The model's own timeline, rendered as Kineto traces, ingested and attributed by the ordinary code path,
gives back the predicted ledgers; ``ninefold predict`` / ``compare`` end to end on the shipped samples."""
import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.cost_model.predict import predict_file
from sample_traces.model_render import render
from ninefold.analysis.ledgers import LEDGERS
from ninefold.ingest.load import ingest_paths
from ninefold.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "sample_traces" / "configs"

PP_DP = """
[model]
layers = 8
hidden = 2048
heads = 16
seq_len = 2048
[parallel]
dp = 2
pp = 4
micro_batches = 4
schedule = "1f1b"
[hardware]
preset = "H100"
[overlap]
dp = 0.5
"""
MOE_TP = """
[model]
layers = 4
hidden = 2048
heads = 16
seq_len = 2048
experts = 8
top_k = 2
expert_imbalance = 1.6
[parallel]
dp = 4
tp = 2
ep = 4
micro_batches = 2
recompute = "full"
zero_stage = 1
[hardware]
preset = "H200"
[overlap]
dp = 0.8
ep = 0.3
"""


def check_round_trip(tmp_path, db, text, expect):
    """Tolerance rule: a ledger holding at least 1% of the step must come back within 1% of its predicted value;
    every other ledger within 0.1% of the step."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    pred = predict_file(cfg, keep_events=True)
    out = tmp_path / "trace"
    meta = render(pred, out, steps=3)
    (out / "render.json").unlink()
    res = ingest_paths(db, [str(out)], job="rt")
    assert [r.status for r in res] == ["stored"] * pred.plan.world
    attribute_job(db, "rt")
    rows = db.execute("SELECT rank, step, ledger, ns FROM ledger_totals WHERE job = 'rt'").fetchall()
    got: dict = {}
    for rank, step, led, ns in rows:
        got.setdefault((rank, step), {})[led] = ns
    assert len(got) == pred.plan.world * meta["steps"]
    for (rank, _step), meas in got.items():
        p = pred.ledgers[rank]
        step = sum(p.values())
        assert sum(meas.values()) == pytest.approx(step, rel=0.01)
        for led in LEDGERS:
            if p[led] >= 0.01 * step:
                assert meas[led] == pytest.approx(p[led], rel=0.01), (rank, led)
            else:
                assert abs(meas[led] - p[led]) <= 0.001 * step, (rank, led)
    # the configuration's planted effects are really there
    mean = pred.mean()
    for led in expect:
        assert mean[led] > 0.01 * pred.step_ns, led
    return pred


def test_round_trip_1f1b_with_dp_allreduce(tmp_path, db):
    pred = check_round_trip(tmp_path, db, PP_DP, ["compute", "bubble", "exposed_comm"])
    assert pred.plan.world == 8
    # the simulated bubble is the closed form (p−1)/(m+p−1) of the blocks, plus the transfer hops
    blocks = 4 * (pred.plan.fwd[0] + pred.plan.bwd[0])
    assert pred.ledgers[0]["bubble"] >= 3 * (pred.plan.fwd[0] + pred.plan.bwd[0])
    assert pred.ledgers[0]["compute"] == blocks + pred.plan.optimizer


def test_round_trip_moe_tp_recompute(tmp_path, db):
    pred = check_round_trip(tmp_path, db, MOE_TP, ["compute", "recompute", "exposed_comm", "straggler"])
    busiest = pred.ledgers[0]     # EP index 0 carries 1.6x the mean tokens: it never waits
    assert busiest["straggler"] == 0
    assert all(pred.ledgers[r]["straggler"] > 0 for r in range(pred.plan.world)
               if (r // pred.plan.tp) % pred.plan.ep)


@pytest.fixture
def sample_db(tmp_path):
    from ninefold.store.connection import connect

    db = tmp_path / "s.duckdb"
    con = connect(db)
    res = ingest_paths(con, [str(ROOT / "sample_traces" / "dp4"), str(ROOT / "sample_traces" / "pp4_1f1b")])
    con.close()
    assert sum(r.status == "stored" for r in res) == 8 and not any(r.status == "failed" for r in res)
    return db


@pytest.mark.parametrize("job, config", [("dp4", "dp4.toml"), ("pp4_1f1b", "pp4_1f1b.toml")])
def test_compare_on_shipped_samples(sample_db, job, config):
    from ninefold.store.connection import connect

    path = CONFIGS / config
    r = CliRunner().invoke(cli, ["compare", "--db", str(sample_db), "--job", job, "--config", str(path)])
    assert r.exit_code == 0, r.output
    for led in LEDGERS:
        assert f"  {led} " in r.output
    con = connect(sample_db, read_only=True)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    n_steps = con.execute("SELECT count(DISTINCT (rank, step)) FROM ledger_totals WHERE job = ?", [job]).fetchone()[0]
    assert con.execute("SELECT count(*), count(DISTINCT config_sha), any_value(config_sha) FROM predicted_ledgers "
                       "WHERE job = ?", [job]).fetchone() == (n_steps * len(LEDGERS), 1, sha)
    assert con.execute("SELECT count(*) FROM predicted_memory WHERE job = ?", [job]).fetchone()[0] == 4 * 5
    # the printed residual of compute is measured (ledger_totals) − predicted (predicted_ledgers)
    m = con.execute("SELECT avg(ns) FROM ledger_totals WHERE job = ? AND ledger = 'compute'", [job]).fetchone()[0]
    p = con.execute("SELECT avg(ns) FROM predicted_ledgers WHERE job = ? AND ledger = 'compute'", [job]).fetchone()[0]
    line = next(x for x in r.output.splitlines() if x.strip().startswith("compute "))
    vals = [float(x) for x in line.split()[1:4]]
    assert vals == pytest.approx([m / 1e6, p / 1e6, (m - p) / 1e6], abs=2e-3)
    con.close()
    # rerunning replaces, not appends
    r2 = CliRunner().invoke(cli, ["compare", "--db", str(sample_db), "--job", job, "--config", str(path)])
    assert r2.exit_code == 0
    con2 = connect(sample_db, read_only=True)
    assert con2.execute("SELECT count(*) FROM predicted_ledgers WHERE job = ?", [job]).fetchone()[0] == \
        n_steps * len(LEDGERS)
    con2.close()


def test_predict_shows_sources_from_trace(sample_db):
    r = CliRunner().invoke(cli, ["predict", str(CONFIGS / "pp4_1f1b.toml"), "--db", str(sample_db),
                                 "--job", "pp4_1f1b"])
    assert r.exit_code == 0, r.output
    lines = {x.split()[0]: x.split() for x in r.output.splitlines() if x.startswith("  ") and x.split()}
    assert lines["parallel.pp"][1:3] == ["4", "trace"]
    assert lines["parallel.micro_batches"][1:3] == ["8", "trace"]
    assert lines["model.hidden"][2] == "config" and lines["hardware.peak_bf16"][2] == "preset"
    assert lines["parallel.v"][2] == "default"
    assert "predicted ledgers per step" in r.output and "predicted memory per GPU" in r.output


def test_predict_70b_and_moe_configs_without_trace():
    r = CliRunner().invoke(cli, ["predict", str(CONFIGS / "llama70b_zero3_64gpu.toml"), "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert len(out["memory_bytes"]) == 64
    m0 = out["memory_bytes"]["0"]
    assert m0["params"] + m0["grads"] + m0["optimizer"] == pytest.approx(17.5e9)
    led = out["ledgers_ns"]["0"]
    assert led["compute"] > 0 and led["exposed_comm"] > 0 and led["bubble"] == 0
    r = CliRunner().invoke(cli, ["predict", str(CONFIGS / "moe_ep8.toml"), "--format", "json"])
    assert r.exit_code == 0, r.output
    led = json.loads(r.output)["ledgers_ns"]
    assert led["0"]["straggler"] == 0 and all(led[str(k)]["straggler"] > 0 for k in range(1, 8))


def test_cli_errors_are_one_line(tmp_path, sample_db):
    bad = tmp_path / "bad.toml"
    bad.write_text("[parallel]\nschedule = 'looped'\n")
    r = CliRunner().invoke(cli, ["compare", "--db", str(sample_db), "--job", "dp4", "--config", str(bad)])
    assert r.exit_code == 2 and str(bad) in r.output and "parallel.schedule" in r.output
    r = CliRunner().invoke(cli, ["predict", str(CONFIGS / "dp4.toml"), "--db", str(sample_db), "--job", "nope"])
    assert r.exit_code == 2 and "nope" in r.output
    # a config whose layout contradicts the trace: pp = 4 on a 4-rank DP job
    wrong = tmp_path / "wrong.toml"
    wrong.write_text((CONFIGS / "dp4.toml").read_text().replace("pp = 1", "pp = 4"))
    r = CliRunner().invoke(cli, ["predict", str(wrong), "--db", str(sample_db), "--job", "dp4"])
    assert r.exit_code == 2 and "world size 4" in r.output
