"""The Python API (ninefold.open / Store): the documented example runs as written, and the facade gives what the
analyses give, with typed one-line errors."""
import re

import polars as pl
import pytest

import ninefold
from conftest import ROOT
from sample_traces.generate import generate


def test_the_documented_example_runs(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/api.md has no python example"
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, "docs/api.md", "exec"), {"__name__": "docs_api"})
    assert (tmp_path / "runs.duckdb").exists()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    generate(d / "j", ranks=4, steps=3, seed=0)
    s = ninefold.open(d / "nf.duckdb")
    rep = s.ingest(d / "j", job="j")
    assert rep.ok and rep.stored == 4
    s.attribute("j")
    yield s
    s.close()


def test_ledgers_match_the_stored_totals(store):
    led = store.ledgers("j")
    assert isinstance(led, pl.DataFrame) and led.columns == ["rank", "step", "ledger", "ns"]
    raw = store.sql("SELECT sum(ns) AS ns FROM ledger_totals WHERE job = 'j'")
    assert led["ns"].sum() == raw["ns"][0]
    # each (rank, step) sums to its window, as the LEDGERS contract says
    win = store.sql("SELECT rank, step, end_ns - start_ns AS w FROM step_windows WHERE job = 'j'")
    per = led.group_by(["rank", "step"]).agg(pl.col("ns").sum()).join(win, on=["rank", "step"])
    assert (per["ns"] == per["w"]).all()


def test_reingest_is_a_no_op(store, tmp_path):
    rep = store.ingest(store.path.parent / "j", job="j")
    assert rep.stored == 0 and rep.unchanged == 4 and rep.skipped == 1  # ground_truth.json


def test_typed_errors(store, tmp_path):
    with pytest.raises(ninefold.UnknownJob, match="job 'nope' is not in the store .*jobs: j\\)"):
        store.ledgers("nope")
    s2 = ninefold.open(tmp_path / "other.duckdb")
    generate(tmp_path / "k", ranks=2, steps=2, seed=1)
    s2.ingest(tmp_path / "k", job="k")
    with pytest.raises(ninefold.NotAttributed, match="job 'k' is not attributed yet: run `ninefold attribute"):
        s2.ledgers("k")
    s2.close()
    with pytest.raises(ninefold.NinefoldError, match="no such store"):
        ninefold.open(tmp_path / "missing.duckdb", read_only=True)


def test_sql_is_read_only(store):
    with pytest.raises(Exception, match="(?i)read.only"):
        store.sql("CREATE TABLE x (a INT)")


def test_whatif_and_waits_agree_with_the_analyses(store):
    from ninefold.analysis.waits import waits
    from ninefold.analysis.whatif import whatif

    con = store._read()
    assert store.waits("j")["wait_ns"].sum() == sum(r["wait_ns"] for r in waits(con, "j")["rows"])
    assert store.whatif("j", remove=["straggler"])["saved_ns"] == whatif(con, "j", remove=("straggler",))["saved_ns"]


def test_compare_and_report_through_the_facade(store, tmp_path):
    cmp = store.compare("j", ROOT / "sample_traces" / "configs" / "dp4.toml")
    assert cmp["ledger"].to_list()[0] == "compute" and cmp.height == 9
    # the residuals add up to the step's, and its share is of the measured step
    step = cmp["measured_ns"].sum()
    assert cmp["residual_ns"].sum() == pytest.approx(step - cmp["predicted_ns"].sum(), abs=1)
    assert abs(cmp["residual_share"].sum() - cmp["residual_ns"].sum() / step) < 1e-9
    stored = store.sql("SELECT count(*) AS n FROM predicted_ledgers WHERE job = 'j'")
    assert stored["n"][0] > 0
    out = store.report("j", tmp_path / "j.html")
    text = out.read_text()
    assert "residual, % of measured step" in text and "<script" in text


def test_analyze_runs_the_whole_path_in_one_command(tmp_path):
    import subprocess
    import sys

    generate(tmp_path / "run9", ranks=2, steps=2, seed=3)
    out = tmp_path / "r.html"
    r = subprocess.run([sys.executable, "-m", "ninefold", "analyze", str(tmp_path / "run9"), "--out", str(out),
                        "--config", str(ROOT / "sample_traces" / "configs" / "dp4.toml")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "ingest: 2 stored" in r.stdout and "(job run9)" in r.stdout and "compare:" in r.stdout
    assert out.exists() and (tmp_path / "r.duckdb").exists()
    s = ninefold.open(tmp_path / "r.duckdb", read_only=True)
    assert s.jobs() == ["run9"] and s.ledgers("run9").height == 2 * 2 * 9
    s.close()
    r = subprocess.run([sys.executable, "-m", "ninefold", "analyze", str(tmp_path / "nope"), "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip() == f"error: {tmp_path / 'nope'}: no such file or directory"


def test_a_command_whose_extra_is_missing_says_which_to_install(tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['bokeh'] = None; sys.modules['panel'] = None\n"
            "from ninefold.cli.main import main\n"
            f"sys.argv = ['ninefold', 'serve', '--db', {str(tmp_path / 'x.duckdb')!r}]\n"
            "main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert "pip install 'ninefold[web]'" in r.stderr and "Traceback" not in r.stderr
