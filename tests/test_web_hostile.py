"""Hostile names never run: a job whose job, file, kernel, op, process group, device and host names and
diagnostics are HTML and template payloads, opened in the static report and in every tab of the app in a real
browser (Debian's Chromium driven by Playwright). Zero dialogs, zero planted elements, and the names shown as
text."""
import json
from pathlib import Path
from urllib.parse import quote

import pytest
from bokeh.models import HoverTool

from conftest import offline
from test_web_browser import _serve, _stop

PAYLOADS = ["<img src=x onerror=alert(1)>", "<script>alert(2)</script>", '"><svg onload=alert(3)>', "{{7*7}}",
            "</div>"]
JOB = "".join(PAYLOADS)
JOB_B = "b" + PAYLOADS[2] + PAYLOADS[0]
# what the payloads would plant if one of them reached a page as markup
PLANTED = ["img[src='x']", "svg[onload]", "[onerror]", "[onload]", "script:has-text('alert(')"]


def hostile_files(src: Path, out: Path) -> list[Path]:
    """The generator's rank files with every kernel and op name, the process group, the device, the host and the
    file name carrying a payload, plus an event of negative duration (a diagnostic quoting its name)."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for f in sorted(src.glob("rank-*.json")):
        d = json.loads(f.read_text())
        for i, e in enumerate(d["traceEvents"]):
            if e.get("cat") in ("kernel", "cpu_op"):
                e["name"] = f"{e['name']} {PAYLOADS[i % len(PAYLOADS)]}"
            args = e.get("args") or {}
            if "Process Group Description" in args:
                args["Process Group Description"] = PAYLOADS[1] + PAYLOADS[2]
        d["deviceProperties"][0]["name"] = "NVIDIA H100 " + PAYLOADS[0]
        d["host_name"] = f"node-{f.stem}{PAYLOADS[2]}"
        for pg in d["distributedInfo"]["pg_config"]:
            pg["pg_desc"] = PAYLOADS[1] + PAYLOADS[2]
        ev = next(e for e in d["traceEvents"] if e.get("cat") == "cpu_op")
        d["traceEvents"].append(dict(ev, name="negative " + PAYLOADS[0], dur=-5.0))
        g = out / f"{f.stem}{PAYLOADS[0]}.json"
        g.write_text(json.dumps(d))
        files.append(g)
    return files


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    from ninefold.analysis.attribution.attribute import attribute_job
    from ninefold.ingest.load import ingest_paths
    from sample_traces.generate import generate
    from ninefold.store.connection import connect

    d = tmp_path_factory.mktemp("hostile")
    generate(d / "gen", ranks=2, steps=3, seed=0)
    files = hostile_files(d / "gen", d / "files")
    db = d / "h.duckdb"
    con = connect(db)
    for job in (JOB, JOB_B):
        assert all(r.status == "stored" for r in ingest_paths(con, files, job=job))
        attribute_job(con, job)
    # every planted text column holds its payload (else the test would prove nothing)
    assert con.execute("SELECT count(*) FROM diagnostics WHERE example LIKE '%<img src=x%'").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM collectives WHERE pg_desc LIKE '%<script>%'").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM traces WHERE device_name LIKE '%<img%' AND path LIKE '%<img%' "
                       "AND host_name LIKE '%<svg%'").fetchone()[0] == 4
    con.close()
    return db


def _watch(page) -> list:
    dialogs = []

    def on_dialog(d):
        dialogs.append(d.message)
        d.dismiss()
    page.on("dialog", on_dialog)
    return dialogs


def _planted(page) -> dict:
    """Elements the payloads would create, counted through every open shadow root (Playwright's CSS pierces)."""
    return {sel: n for sel in PLANTED if (n := page.locator(sel).count())}


def test_report_shows_hostile_names_as_text(hostile_store, browser, tmp_path):
    from ninefold.dashboards.report import write_report

    out = write_report(hostile_store, JOB, tmp_path / "r.html")
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    dialogs = _watch(page)
    offline(page)
    page.goto(out.as_uri())
    page.locator("canvas").first.wait_for(state="visible", timeout=30_000)
    for text in (f"ninefold report: {JOB}", f"Overview: {JOB}", f"Timeline: {JOB}", f"Stragglers: {JOB}",
                 f"MoE: {JOB}", f"Pipeline: {JOB}", f"Memory: {JOB}", f"What if: {JOB}"):
        page.get_by_text(text).first.wait_for(timeout=10_000)
    page.get_by_text("negative " + PAYLOADS[0], exact=False).first.wait_for(timeout=5_000)  # a diagnostic
    page.get_by_text("NVIDIA H100 " + PAYLOADS[0]).first.wait_for(timeout=5_000)          # the device
    page.wait_for_timeout(500)
    assert dialogs == [] and _planted(page) == {}
    page.close()


VIEWS = [("jobs", "Jobs"), ("overview", f"Overview: {JOB}"), ("timeline", f"Timeline: {JOB}"),
         ("whatif", f"What if: {JOB}"), ("stragglers", f"Stragglers: {JOB}"), ("moe", f"MoE: {JOB}"),
         ("pipeline", f"Pipeline: {JOB}"), ("memory", f"Memory: {JOB}"), ("efficiency", f"Efficiency: {JOB}"),
         ("compare", f"Compare: {JOB} → {JOB_B}"), ("upload", "Upload traces")]


def test_every_app_view_shows_hostile_names_as_text(hostile_store, browser):
    proc, url = _serve(hostile_store)
    try:
        for key, title in VIEWS:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            dialogs = _watch(page)
            page.goto(f"{url}/?job={quote(JOB)}&view={key}")
            area = page.locator(f".nf-tab-{key}").first
            if key == "compare":
                area.get_by_text("pick a second job").wait_for(timeout=60_000)
                page.locator("select").nth(2).select_option(JOB_B)
            area.get_by_text(title).first.wait_for(timeout=60_000)
            if key == "jobs":  # both names listed as text in the jobs table
                area.locator("table.nf-jobs").get_by_text(JOB_B, exact=True).wait_for(timeout=10_000)
            if key == "whatif":  # op names on the critical path, as text
                path = area.locator("table.nf-critical-path").first
                path.wait_for(timeout=10_000)
                assert "alert(" in path.inner_text()
            assert page.locator("select").first.input_value() == JOB
            page.wait_for_timeout(700)
            assert dialogs == [], (key, dialogs)
            assert _planted(page) == {}, key
            page.close()
    finally:
        _stop(proc)


def test_hover_tooltips_take_stored_text_as_text(hostile_store):
    """Every hover tool of every view is (label, '@field') pairs, which Bokeh fills in as text: no HTML
    template, no {safe} format, no stored name inside a template."""
    from ninefold.web import data_store
    from ninefold.dashboards.views import compare, efficiency, memory, moe, overview, pipeline, stragglers, timeline, whatif

    with data_store.read_connection(hostile_store) as con:
        models = []
        for view in (overview, timeline, stragglers, moe, pipeline, memory, whatif, efficiency):
            models += view.render(view.load(con, JOB))
        models += compare.render(compare.load(con, JOB, JOB_B))
    tools = [t for m in models for t in m.select({"type": HoverTool})]
    assert len(tools) >= 6
    for t in tools:
        assert isinstance(t.tooltips, list), t.tooltips
        for label, value in t.tooltips:
            assert "{safe}" not in value and "<" not in value, value
