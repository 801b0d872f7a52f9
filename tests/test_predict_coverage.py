"""What the trace tells wins, and what it lacks is said: a predicted component the trace cannot contain is
stored and shown but left out of the residual and the step; a layout that contradicts the trace is overridden
with a note, or refused when no dp can make it fit."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ninefold.analysis.cost_model import coverage
from ninefold.analysis.cost_model.config import ConfigError, load_config
from ninefold.analysis.cost_model.predict import predict
from ninefold.analysis.ledgers import LEDGERS
from ninefold.ingest.load import ingest_paths
from sample_traces.moe import generate_moe
from ninefold.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
MOE = """
[model]
layers = 3
hidden = 4096
heads = 32
seq_len = 8192
experts = 8
top_k = 1
[parallel]
{extra}
[overlap]
dp = 0.0
"""


@pytest.fixture
def moe_db(tmp_path):
    """An 8-rank EP job (generated): all-to-alls only, no data-parallel all-reduce, no send/recv."""
    from ninefold.store.connection import connect

    generate_moe(tmp_path / "moe", ranks=8, steps=2, layers=3, overloaded=2, overload=3.0)
    db = tmp_path / "m.duckdb"
    con = connect(db)
    ingest_paths(con, [str(tmp_path / "moe")], job="moe")
    con.close()
    return db


def _cfg(tmp_path, extra=""):
    p = tmp_path / "c.toml"
    p.write_text(MOE.format(extra=extra))
    return p


def test_dp_sync_not_in_trace_is_predicted_but_not_compared(tmp_path, moe_db):
    from ninefold.store.connection import connect

    cfg = _cfg(tmp_path)
    r = CliRunner().invoke(cli, ["compare", "--db", str(moe_db), "--job", "moe", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert "not in the trace (predicted, shown, not compared): DP gradient sync" in r.output
    assert "the trace records no DP collective" in r.output
    con = connect(moe_db, read_only=True)
    pred = predict(load_config(cfg), con, "moe")
    assert [e.axis for e in pred.excluded] == ["dp", "optimizer"]      # a forward-only profile: no optimizer
    full, comp = pred.mean(), pred.mean(compared=True)
    assert pred.plan.grad_sync > 0 and full["exposed_comm"] > comp["exposed_comm"]
    # predicted_ledgers holds what the trace can contain; predicted_parts every part, with the reason
    stored = dict(con.execute("SELECT ledger, avg(ns) FROM predicted_ledgers WHERE job = 'moe' GROUP BY ledger"
                              ).fetchall())
    assert stored["exposed_comm"] == pytest.approx(comp["exposed_comm"], abs=1)
    parts = con.execute("""SELECT ledger, in_trace, reason, sum(ns) / count(DISTINCT (rank, step))
                           FROM predicted_parts WHERE job = 'moe' GROUP BY ALL""").fetchall()
    out = [(led, ns, why) for led, it, why, ns in parts if not it]
    assert out and all("DP gradient sync" in why for _, _, why in out)
    whole = {}
    for led, _it, _why, ns in parts:
        whole[led] = whole.get(led, 0) + ns
    for led in LEDGERS:
        assert whole[led] == pytest.approx(full[led], abs=1)
    # the printed step compares only the in-trace part, and says how much it left out
    meas = con.execute("SELECT avg(s) FROM (SELECT sum(ns) s FROM ledger_totals WHERE job = 'moe' GROUP BY rank, step)"
                       ).fetchone()[0]
    con.close()
    step = next(x for x in r.output.splitlines() if x.strip().startswith("step "))
    vals = [float(x) for x in step.split()[1:4]]
    assert vals[0] == pytest.approx(meas / 1e6, abs=2e-3)
    assert vals[1] == pytest.approx(sum(comp.values()) / 1e6, abs=2e-3)
    gone = sum(full.values()) - sum(comp.values())
    assert float(step.split()[-1]) == pytest.approx(gone / 1e6, abs=2e-3) and gone > 0


def test_missing_is_one_rule_for_every_axis():
    from ninefold.analysis.cost_model.timeline import StepPlan

    plan = StepPlan(dp=2, tp=1, pp=4, ep=1, cp=1, schedule="1f1b", m=4, fwd=[10], bwd=[20], rec=[0],
                    p2p=5, grad_sync=7)
    pp_group = {"g": {"axis": "pp", "colls": ["send", "recv"]}}
    # nothing recorded: both excluded
    assert {e.axis for e in coverage.missing(plan, {}, {})} == {"dp", "pp"}
    # a pp group with sends: pp is in; an all-reduce kernel on an unclassified group: dp is in
    assert {e.axis for e in coverage.missing(plan, {"groups": pp_group}, {})} == {"dp"}
    assert coverage.missing(plan, {"groups": pp_group}, {"allreduce": 3}) == []
    # send/recv kernels without groups also count for pp
    assert {e.axis for e in coverage.missing(plan, {}, {"sendrecv": 8})} == {"dp"}
    s = coverage.strip(plan, coverage.missing(plan, {}, {}))
    assert s.p2p == 0 and s.grad_sync == 0 and s.fwd == plan.fwd


def test_dp_that_contradicts_the_trace_is_overridden_with_a_note(tmp_path, moe_db):
    from ninefold.store.connection import connect

    cfg = _cfg(tmp_path, "dp = 4")
    con = connect(moe_db, read_only=True)
    c = load_config(cfg)
    pred = predict(c, con, "moe")
    con.close()
    v = c.values["parallel.dp"]
    assert (v.value, v.source) == (8, "trace") and "config said 4" in v.note and "world size 8" in v.note
    assert pred.plan.world == 8
    r = CliRunner().invoke(cli, ["predict", str(cfg), "--db", str(moe_db), "--job", "moe", "--format", "json"])
    assert r.exit_code == 0, r.output
    dp = next(x for x in json.loads(r.output)["inputs"] if x["key"] == "parallel.dp")
    assert dp["value"] == 8 and "config said 4" in dp["note"]
    r = CliRunner().invoke(cli, ["compare", "--db", str(moe_db), "--job", "moe", "--config", str(cfg)])
    assert r.exit_code == 0, r.output


def test_a_layout_no_dp_can_fit_is_refused(tmp_path, moe_db):
    from ninefold.store.connection import connect

    con = connect(moe_db, read_only=True)
    for extra in ("tp = 3", "dp = 4\ntp = 3"):      # dp derived or given: no dp makes 3 divide 8
        with pytest.raises(ConfigError, match="world size 8,? (is )?not a multiple of tp\\*pp\\*cp = 3"):
            predict(load_config(_cfg(tmp_path, extra)), con, "moe")
    con.close()


def test_shipped_dp4_config_on_a_larger_job(tmp_path):
    """dp4.toml says the trace wins: on an 8-rank generated job compare uses dp = 8 from the trace."""
    from sample_traces.generate import generate
    from ninefold.store.connection import connect

    generate(tmp_path / "j", ranks=8, steps=2, seed=0)
    db = tmp_path / "j.duckdb"
    con = connect(db)
    ingest_paths(con, [str(tmp_path / "j")], job="j8")
    con.close()
    r = CliRunner().invoke(cli, ["compare", "--db", str(db), "--job", "j8", "--config",
                                 str(ROOT / "sample_traces" / "configs" / "dp4.toml")])
    assert r.exit_code == 0, r.output
    assert "8 ranks predicted" in r.output and "not in the trace" not in r.output
