"""The nightly index (reports/index.html) is a Bokeh page like the per-job reports: per job a trend figure of its
ledger shares across nights, tonight's significant diff and its top kernels by lost time.

Two nights of a batch over real generated jobs: `job` with GEMMs 10 % slower on night 2 (a planted regression),
`steady` unchanged (skipped on night 2: it still shows its last known lost-time rows), then its trace cut short
on night 3 (failed: its error, a gap in its trend, its last successful night's rows)."""
import html as _html
import json
import re
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from ninefold.analysis.ledgers import LEDGERS
from conftest import CHROMIUM, CHROMIUM_ARGS, offline
from sample_traces.generate import generate
from ninefold.cli.main import cli

STEPS = 12


# ------------------------------------------------------------------ reading the page (also used by test_batch*)

def index_objects(page: str) -> tuple[dict, list[dict]]:
    """The embedded Bokeh document of PAGE: (its models by id, its root models)."""
    assert not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=", page)
    m = re.search(r'<script type="application/json" id="[^"]+">\s*(.*?)\s*</script>', page, re.S)
    assert m, "no embedded Bokeh document"
    [doc] = json.loads(m.group(1)).values()
    by_id: dict = {}

    def walk(o):
        if isinstance(o, dict):
            if o.get("type") == "object" and "id" in o:
                by_id.setdefault(o["id"], o)
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(doc)
    return by_id, doc["roots"]


def index_texts(page: str) -> list[str]:
    """The text of each Div of the page, in page order, as the browser shows it (the document's JSON is
    HTML-escaped inside its script)."""
    by_id, _ = index_objects(page)
    return [_html.unescape(o["attributes"]["text"]) for o in by_id.values()
            if o["name"] == "Div" and "text" in o.get("attributes", {})]


def index_text(page: str) -> str:
    return "\n".join(index_texts(page))


def trend_lines(page: str, job: str) -> dict[str, tuple[list, list]]:
    """Figure ``trend-<job>``: per line renderer (named trend-<job>-<ledger>) its (nights, percentages)."""
    by_id, _ = index_objects(page)
    [fig] = [o for o in by_id.values() if o["name"] == "Figure" and o["attributes"].get("name") == f"trend-{job}"]
    out = {}
    for ref in fig["attributes"]["renderers"]:
        r = by_id[ref["id"]]
        if by_id[r["attributes"]["glyph"]["id"]]["name"] != "Line":
            continue
        data = dict(by_id[r["attributes"]["data_source"]["id"]]["attributes"]["data"]["entries"])
        pct = [x if isinstance(x, (int, float)) else float(x["value"]) for x in data["pct"]]
        out[r["attributes"]["name"][len(f"trend-{job}-"):]] = (data["night"], pct)
    return out


# ------------------------------------------------------------------ the batch

def _night(drop: Path, job: str, seed: int, scale: float) -> None:
    shutil.rmtree(drop / job, ignore_errors=True)
    generate(drop / job, ranks=2, steps=STEPS, seed=seed, gemm_scale=scale)
    (drop / job / "ground_truth.json").unlink()


def run_night(base: Path, night: str):
    """`ninefold batch` of BASE/drop for NIGHT on the serial scheduler: (the CLI result, summary.json)."""
    r = CliRunner().invoke(cli, ["batch", str(base / "drop"), "--db", str(base / "store" / "c.duckdb"),
                                 "--reports", str(base / "reports"), "--scheduler", "serial", "--night", night])
    return r, json.loads((base / "reports" / "summary.json").read_text())



@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    base = tmp_path_factory.mktemp("index")
    _night(base / "drop", "job", 0, 1.0)
    _night(base / "drop", "steady", 5, 1.0)
    r1, s1 = run_night(base, "n1")
    _night(base / "drop", "job", 0, 1.1)
    r2, s2 = run_night(base, "n2")
    index2 = (base / "reports" / "index.html").read_text()
    shutil.copytree(base / "reports", base / "reports-n2")     # (the browser test opens night 2's page)
    f = base / "drop" / "steady" / "rank-1.json"                # night 3: steady's trace cut short, job unchanged
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    r3, s3 = run_night(base, "n3")
    return {"base": base, "r1": r1, "s1": s1, "r2": r2, "s2": s2, "index": index2, "r3": r3, "s3": s3,
            "index3": (base / "reports" / "index.html").read_text()}


def test_index_is_one_bokeh_page(batch):
    assert batch["r1"].exit_code == 0, batch["r1"].output
    assert batch["r2"].exit_code == 3, batch["r2"].output
    page = batch["index"]
    assert "embed_items" in page and "<title>ninefold batch n2</title>" in page
    _, roots = index_objects(page)
    assert [r["attributes"].get("name") for r in roots] == ["ninefold_index"]
    text = index_text(page)
    assert "ninefold nightly batch: n2" in text
    assert "1 processed, 1 unchanged, 0 failed, 2 regressions" in text
    assert text.index("<h2>Regressions</h2>") < text.index("<h2 id='job-job'>") < text.index("<h2 id='job-steady'>")
    assert "<a href='job.html'>report</a>" in text and "<a href='logs/steady.log'>log</a>" in text
    assert "<span class='tag skip'>unchanged</span>" in text and "<span class='tag reg'>regression: " in text


def test_a_trend_figure_per_job_one_line_per_ledger_one_point_per_night(batch):
    page = batch["index"]
    con = duckdb.connect(str(batch["base"] / "store" / "c.duckdb"), read_only=True)
    want = {}
    for j, n, led, s in con.execute("SELECT job, night, ledger, share FROM batch_shares").fetchall():
        want.setdefault(j, {}).setdefault(led, {})[n] = 100 * s
    con.close()
    nights = {"job": ["n1", "n2"], "steady": ["n1"]}    # steady was unchanged on n2: it has no run that night
    for job, jn in nights.items():
        lines = trend_lines(page, job)
        assert list(lines) == list(LEDGERS), job
        for led, (xs, ys) in lines.items():
            assert xs == jn and len(ys) == len(jn)
            assert ys == pytest.approx([want[job][led][n] for n in jn]), (job, led)
    # the share table beside the figure still says the same numbers
    text = index_text(page)
    # (compute regressed tonight: its cell is marked)
    assert f"<td>n2</td><td class=''>ok</td><td class=bad>{want['job']['compute']['n2']:.2f}</td>" in text


def test_the_planted_regression_shows_its_significant_rows(batch):
    s = batch["s2"]
    d = s["diffs"]["job"]
    assert d["top"][0]["key"] == "gemm"
    texts = index_texts(batch["index"])
    [side] = [t for t in texts if "class='side'" in t and "job-job" not in t and "tonight's diff" in t]
    assert side.index("class='side'") < side.index("class='diff'")
    assert "tonight's diff: significant rows" in side and "against night n1 (12 and 12 steps)" in side
    assert "<td>kclass</td><td title='gemm'>gemm ★</td>" in side
    for r in d["rows"]:
        key = r["key"] if len(r["key"]) <= 60 else r["key"][:57] + "..."
        assert f"<td>{_html.escape(r['level'])}</td><td title='{_html.escape(r['key'])}'>{_html.escape(key)}" in side
        assert f"<td>{r['delta_ns'] / 1e6:+.3f}</td>" in side
    regs = [t for t in texts if "<h2>Regressions</h2>" in t][0]
    for r in s["regressions"]:
        assert f"<td>{r['ledger']}</td><td>n1</td>" in regs and f"<td>{r['delta_ns'] / 1e6:+.3f}</td>" in regs


def test_lost_time_table_names_the_jobs_real_kernels(batch):
    s = batch["s2"]
    lost = s["lost_time"]["job"]
    rows = lost["rows"]
    assert rows and len(rows) <= 10 and set(s["lost_time"]) == {"job"}
    assert all(r["lost_ns"] > 0 and 0 < r["efficiency"] < 1 and r["lost_ns"] <= r["time_ns"] for r in rows)
    assert [r["lost_ns"] for r in rows] == sorted((r["lost_ns"] for r in rows), reverse=True)
    # the generator's GEMMs record no Input Dims: their work is unknown, said so beside the table
    assert "no Input Dims" in lost["reason"]
    # every row is a kernel of the job, its calls and time summed over the ranks
    con = duckdb.connect(str(batch["base"] / "store" / "c.duckdb"), read_only=True)
    for r in rows:
        calls, ns = con.execute("SELECT count(*), sum(end_ns - start_ns) FROM gpu_ops WHERE job = 'job' AND name = ?",
                                [r["kernel"]]).fetchone()
        assert calls == r["calls"] and ns == r["time_ns"], r
    stored = con.execute("SELECT night, job, count(kernel) FROM batch_lost_kernels GROUP BY ALL ORDER BY ALL").fetchall()
    con.close()
    assert [(n, j) for n, j, _ in stored] == [("n1", "job"), ("n1", "steady"), ("n2", "job")]
    assert {r["kclass"] for r in rows} >= {"memcpy", "allreduce"}
    [table] = [t for t in index_texts(batch["index"]) if "top kernels by lost time</b>" in t]
    for r in rows:
        assert f"title='{_html.escape(r['kernel'])}'" in table
        assert f"<td>{100 * r['efficiency']:.1f}%</td>" in table
    assert "without a known work or peak, e.g. no Input Dims" in table


def test_an_unchanged_job_shows_its_last_known_lost_time_rows(batch):
    s1, s2 = batch["s1"], batch["s2"]
    assert s2["jobs"]["skipped"] == [{"job": "steady", "last_night": "n1"}]
    rows = s1["lost_time"]["steady"]["rows"]
    assert rows
    [table] = [t for t in index_texts(batch["index"]) if "top kernels by lost time (night n1" in t]
    assert "the job is unchanged since" in table
    for r in rows:
        assert f"title='{_html.escape(r['kernel'])}'" in table


def test_a_failed_job_shows_its_error_a_gap_and_its_last_successful_rows(batch):
    r3, s3 = batch["r3"], batch["s3"]
    assert r3.exit_code == 4, r3.output
    [failed] = s3["jobs"]["failed"]
    assert failed["job"] == "steady" and s3["jobs"]["skipped"] == [{"job": "job", "last_night": "n2"}]
    assert s3["lost_time"] == {}
    page = batch["index3"]
    texts = index_texts(page)
    text = "\n".join(texts)
    # failed jobs first, after those with a regression (none tonight)
    assert text.index("<h2 id='job-steady'>") < text.index("<h2 id='job-job'>")
    head = next(t for t in texts if "<h2 id='job-steady'>" in t)
    assert "<span class='tag fail'>failed</span>" in head
    assert "<p class='failed'>" + _html.escape(failed["error"]).splitlines()[0] in head
    # the failed night is in the trend, without a value
    for led, (xs, ys) in trend_lines(page, "steady").items():
        assert xs == ["n1", "n3"] and ys[0] >= 0 and ys[1] != ys[1], led
    assert "<td>n3</td><td class='failed'>failed</td>" in text
    [table] = [t for t in texts if "top kernels by lost time (night n1, its latest successful run)" in t]
    for r in batch["s1"]["lost_time"]["steady"]["rows"]:
        assert f"title='{_html.escape(r['kernel'])}'" in table
    [table] = [t for t in texts if "top kernels by lost time (night n2: the job is unchanged since)" in t]
    for r in batch["s2"]["lost_time"]["job"]["rows"]:
        assert f"title='{_html.escape(r['kernel'])}'" in table


def test_lost_kernels_without_efficiency_is_an_empty_list_with_the_reason():
    from ninefold.batch.tasks import lost_kernels
    from ninefold.store.schema import create_all

    con = duckdb.connect()
    create_all(con)
    got = lost_kernels(con, "absent")
    con.close()
    assert got["rows"] == [] and got["reason"] == "efficiency: no job 'absent' in the store"


def test_index_renders_offline_in_a_browser(batch):
    from playwright.sync_api import sync_playwright

    out = batch["base"] / "reports-n2" / "index.html"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = b.new_page(viewport={"width": 1300, "height": 900})
            attempted, errors = offline(page)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(out.as_uri())
            page.locator("[data-root-id]").first.wait_for(state="attached", timeout=20_000)
            page.locator("canvas").first.wait_for(state="visible", timeout=20_000)
            page.wait_for_timeout(500)
            assert page.locator("canvas").count() >= 2      # one trend figure per job
            page.get_by_text("ninefold nightly batch: n2").wait_for(timeout=5_000)
            page.get_by_text("top kernels by lost time").first.wait_for(timeout=5_000)
            # the links to a job's section find it inside its Div's shadow root
            page.goto(out.as_uri() + "#job-steady")
            page.locator("canvas").first.wait_for(state="visible", timeout=20_000)
            page.wait_for_function("window.scrollY > 0", timeout=5_000)
            page.evaluate("window.scrollTo(0, 0)")
            page.get_by_role("link", name="job", exact=True).first.click()      # the regressions table's link
            page.wait_for_function("window.scrollY > 0", timeout=5_000)
            assert page.url.endswith("#job-job")
            assert attempted == [] and errors == []
        finally:
            b.close()
