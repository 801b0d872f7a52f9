"""The static report: one self-contained HTML file per job, and the `ninefold report` command."""
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sample_traces.demo_store import build_demo_store
from ninefold.dashboards.report import write_report
from ninefold.dashboards.queries import NO_PREDICTION
from ninefold.analysis.ledgers import LEDGERS
from ninefold.dashboards.style import esc
from ninefold.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    truth = build_demo_store(d / "demo.duckdb", d, jobs=("dp4", "moe4"))
    return d / "demo.duckdb", truth


def _docs(html: str) -> list:
    """The Bokeh documents embedded in the page (file_html writes them as one JSON script)."""
    m = re.search(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>', html, re.S)
    assert m, "no embedded Bokeh document"
    return list(json.loads(m.group(1)).values())


def test_report_is_self_contained(demo, tmp_path):
    out = write_report(demo[0], "dp4", tmp_path / "sub" / "dp4.html")
    assert out == tmp_path / "sub" / "dp4.html"
    html = out.read_text()
    # BokehJS inline: no external scripts or stylesheets
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"<link[^>]+href=", html)
    # (BokehJS itself names a MathJax CDN for math text it never needs here: the browser test checks that no
    # request leaves the page)
    assert "embed_items" in html and "Bokeh.set_log_level" in html
    docs = _docs(html)
    assert len(docs) == 1
    names = {r.get("attributes", {}).get("name") for r in docs[0]["roots"]}
    assert "ninefold_report" in names
    text = json.dumps(docs[0])
    for needle in ("overview_ledgers", "timeline", "straggler_heatmap", "prediction config", "overview_compare",
                   "no all-to-all collectives in this job"):
        assert needle in text, needle
    assert NO_PREDICTION not in text  # the demo stores dp4's prediction: measured vs predicted for every ledger
    assert "ninefold report: dp4" in html


def test_report_of_the_moe_job_has_the_drilldown(demo, tmp_path):
    out = write_report(demo[0], "moe4", tmp_path / "moe.html")
    text = json.dumps(_docs(out.read_text())[0])
    rank = demo[1]["moe4"]["overloaded_rank"]
    assert "moe_ranks" in text and "moe_ledgers" in text
    assert f"slowest MoE rank {rank}" in text


def test_report_of_an_ingested_but_unattributed_job(tmp_path):
    from ninefold.ingest.load import ingest_paths
    from sample_traces.demo_store import sample_files
    from ninefold.store.connection import connect

    db = tmp_path / "raw.duckdb"
    con = connect(db)
    ingest_paths(con, sample_files("dp4")[:2], job="raw")
    con.close()
    out = write_report(db, "raw", tmp_path / "raw.html")
    text = json.dumps(_docs(out.read_text())[0])
    # the header says the job is not attributed and what to run; no view built on ledgers pretends otherwise
    assert "ninefold report: raw (not attributed)" in text
    assert f"is not attributed yet: run `ninefold attribute --db {db} --job raw` first" in text
    assert "step None" not in text and "Timeline:" not in text and "Efficiency: raw" in text


def test_report_has_the_apps_efficiency_section(demo, tmp_path):
    from ninefold.web.data_store import read_connection
    from ninefold.dashboards.views import efficiency

    out = write_report(demo[0], "dp4", tmp_path / "eff.html")
    text = json.dumps(_docs(out.read_text())[0])
    assert "Efficiency: dp4" in text and efficiency.PLOT_NAME in text
    with read_connection(demo[0]) as con:   # the same analysis the app's Efficiency view shows
        data = efficiency.load(con, "dp4")
    top = data["kernels"][0]["kernel"]
    assert json.dumps(esc(top[:60]))[1:-1] in text


def test_residual_is_one_share_of_the_measured_step_everywhere(demo, tmp_path):
    """The report's residual column and `ninefold compare` print the same number under the same heading."""
    import shutil

    from ninefold.analysis.cost_model.residual import HEADING
    from ninefold.web.data_store import read_connection
    from ninefold.dashboards.queries import ledger_compare

    db = tmp_path / "copy.duckdb"
    shutil.copy(demo[0], db)
    r = CliRunner().invoke(cli, ["compare", "--db", str(db), "--job", "dp4", "--config",
                                 str(ROOT / "sample_traces" / "configs" / "dp4.toml")])
    assert r.exit_code == 0, r.output
    assert HEADING in r.output
    printed = {ln.split()[0]: ln.split()[4] for ln in r.output.splitlines()
               if ln.startswith("  ") and ln.split()[0] in LEDGERS + ("step",) and len(ln.split()) >= 6}
    out = write_report(db, "dp4", tmp_path / "res.html")
    text = json.dumps(_docs(out.read_text())[0])
    assert esc(HEADING) in text and "residual %" not in text
    with read_connection(db) as con:
        cmp = ledger_compare(con, "dp4")
    step = cmp["measured_ns"].sum()
    for row in cmp.iter_rows(named=True):
        shown = f"{row['residual_pct']:+.1f}"
        assert printed[row["ledger"]] == shown, (row["ledger"], printed, shown)
        # a share of the step: the residual over the sum of the measured ledgers, not over the prediction
        assert abs(row["residual_pct"] - 100 * row["residual_ns"] / step) < 1e-9
    assert abs(sum(cmp["residual_pct"]) - float(printed["step"])) < 0.05 + 0.05 * len(LEDGERS)


def test_straggler_heatmap_ticks_are_whole_collectives(demo):
    from ninefold.web.data_store import read_connection
    from ninefold.dashboards.views import stragglers

    with read_connection(demo[0]) as con:
        data = stragglers.load(con, "dp4")
    p = stragglers.heatmap(data["matrix"])
    assert p.xaxis[0].ticker.min_interval >= 1   # no tick between two collectives


def test_hidden_communication_says_it_is_a_total_over_the_steps(demo, tmp_path):
    out = write_report(demo[0], "dp4", tmp_path / "ov.html")
    text = json.dumps(_docs(out.read_text())[0])
    from ninefold.web.data_store import read_connection

    with read_connection(demo[0]) as con:
        n = con.execute("SELECT count(DISTINCT step) FROM step_windows WHERE job = 'dp4'").fetchone()[0]
    assert f"Communication hidden under compute, totals over {n} steps" in text


def test_cli_report(demo, tmp_path):
    r = CliRunner().invoke(cli, ["report", "--db", str(demo[0]), "--job", "dp4", "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r.html").stat().st_size > 100_000
    assert "wrote" in r.output


def test_cli_report_errors_are_one_line(demo, tmp_path):
    r = CliRunner().invoke(cli, ["report", "--db", str(demo[0]), "--job", "nope", "--out", str(tmp_path / "x.html")])
    assert r.exit_code == 2
    assert r.output.strip() == f"error: job 'nope' is not in the store {demo[0]} (jobs: dp4, moe4)"
    assert not (tmp_path / "x.html").exists()
    r = CliRunner().invoke(cli, ["report", "--db", str(tmp_path / "missing.duckdb"), "--job", "dp4",
                                 "--out", str(tmp_path / "x.html")])
    assert r.exit_code == 2 and f"error: no store at {tmp_path / 'missing.duckdb'}: create it" in r.output
