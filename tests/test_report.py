"""The static report: one self-contained HTML file per job, and the `ninefold report` command."""
import json
import re

import pytest
from click.testing import CliRunner

from sample_traces.demo_store import build_demo_store
from dashboards.report import write_report
from dashboards.queries import NO_PREDICTION, NOT_ATTRIBUTED
from service.cli import cli


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
    from ingest.load import ingest_paths
    from sample_traces.demo_store import sample_files
    from store.connection import connect

    db = tmp_path / "raw.duckdb"
    con = connect(db)
    ingest_paths(con, sample_files("dp4")[:2], job="raw")
    con.close()
    out = write_report(db, "raw", tmp_path / "raw.html")
    text = json.dumps(_docs(out.read_text())[0])
    assert NOT_ATTRIBUTED in text


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
