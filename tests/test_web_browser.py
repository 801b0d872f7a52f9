"""The web app and the static report in a real browser (Debian's Chromium driven by Playwright), and the
server's authentication over HTTP."""
import base64
import io
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from conftest import offline
from sample_traces.demo_store import build_demo_store, sample_files
from ninefold.dashboards.report import write_report
from ninefold.analysis.ledgers import LEDGERS
from ninefold.dashboards.style import LEDGER_COLORS

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "tok-5f3a9c1e"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(db, *extra):
    port = _free_port()
    log = open(Path(db).parent / f"serve-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "ninefold.cli.main", "serve", "--db", str(db), "--port", str(port),
                             *extra], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, Path(log.name).read_text()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            assert time.monotonic() - t0 < 60, "server did not start"
            time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _status(url, headers=None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _colours(png: bytes) -> set:
    img = Image.open(io.BytesIO(png)).convert("RGB")
    return {c for _, c in img.getcolors(maxcolors=1 << 22)}


def _hex(c: str) -> tuple:
    return tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from ninefold.analysis.attribution.attribute import attribute_job
    from ninefold.ingest.load import ingest_paths
    from sample_traces.generate import generate
    from ninefold.store.connection import connect

    d = tmp_path_factory.mktemp("web")
    build_demo_store(d / "web.duckdb", d, jobs=("moe4",))
    # a planted pair for the Compare tab: the same seeded job, every GEMM 10 % slower in the second
    con = connect(d / "web.duckdb")
    for job, scale in (("base", 1.0), ("slow_gemm", 1.1)):
        generate(d / job, ranks=2, steps=12, seed=0, gemm_scale=scale)
        ingest_paths(con, sorted((d / job).glob("rank-*.json")), job=job)
        attribute_job(con, job)
    con.close()
    return d / "web.duckdb"


@pytest.fixture(scope="module")
def server(store):
    proc, url = _serve(store)
    yield url
    _stop(proc)


def test_upload_shows_overview_then_moe_drilldown(server, browser, store):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    remote = []
    page.on("request", lambda r: remote.append(r.url)
            if r.url.split(":", 1)[0] in ("http", "https", "ws", "wss") and not r.url.startswith(server) else None)
    page.goto(f"{server}/?upload_job=dp4up")
    page.get_by_text("Upload", exact=True).click()
    page.locator(".nf-tab-upload input[type=file]").set_input_files([str(p) for p in sample_files("dp4")])
    # ingest + attribute in the background, then the page switches to the new job's overview
    plot = page.locator(".nf-tab-overview canvas").first
    plot.wait_for(state="visible", timeout=90_000)
    assert page.locator("select").first.input_value() == "dp4up"
    page.wait_for_timeout(500)
    area = page.locator(".nf-tab-overview").first
    area.get_by_text("Overview: dp4up").wait_for(timeout=5_000)  # text inside Bokeh's shadow DOM
    cols = _colours(area.screenshot())
    assert len(cols) > 20
    assert _hex(LEDGER_COLORS["compute"]) in cols  # the stacked bars were drawn
    # the uploads are listed, and a reload does not lose them (the overview opens after the first upload is
    # attributed; the last may still be attributing: reload until all four are, at most ~60 s)
    for _ in range(20):
        page.reload()
        page.get_by_text("Upload", exact=True).click()
        listing = page.locator(".nf-uploads").first
        listing.wait_for(timeout=20_000)
        if listing.get_by_text("attributed", exact=True).count() == 4:
            break
        page.wait_for_timeout(3000)
    assert listing.get_by_text("attributed", exact=True).count() == 4
    # the MoE drill-down of the other job
    page.locator("select").first.select_option("moe4")
    page.get_by_text("MoE", exact=True).click()
    moe = page.locator(".nf-tab-moe canvas").first
    moe.wait_for(state="visible", timeout=30_000)
    page.locator(".nf-tab-moe").first.get_by_text("slowest MoE rank 2").wait_for(timeout=5_000)
    assert len(_colours(page.locator(".nf-tab-moe").first.screenshot())) > 10
    assert remote == []
    page.close()


def test_static_report_renders_offline(browser, tmp_path):
    db = tmp_path / "r.duckdb"
    build_demo_store(db, tmp_path, jobs=("dp4",))
    out = write_report(db, "dp4", tmp_path / "dp4.html")
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    attempted, errors = offline(page)
    page.goto(out.as_uri())
    page.locator("[data-root-id]").first.wait_for(state="attached", timeout=20_000)
    canvas = page.locator("canvas").first
    canvas.wait_for(state="visible", timeout=20_000)
    page.wait_for_timeout(500)
    assert page.locator("canvas").count() >= 3
    page.get_by_text("Overview: dp4").wait_for(timeout=5_000)
    cols = _colours(page.screenshot())
    assert len(cols) > 20 and _hex(LEDGER_COLORS["compute"]) in cols
    assert attempted == [] and errors == []
    # measured vs predicted: the demo stores dp4's prediction, so every ledger's row has a predicted value
    table = page.locator("table.nf-table").filter(has_text="residual, % of measured step").first
    table.wait_for(timeout=5_000)
    rows = {}
    for tr in table.locator("tbody tr").all():
        cells = [c.inner_text() for c in tr.locator("td").all()]
        rows[cells[0]] = cells
    assert set(rows) == set(LEDGERS)
    assert all(c[2] not in ("", "–") for c in rows.values()), rows
    # each residual opens onto the terms of its prediction
    page.get_by_text("compute: measured").first.click()
    page.get_by_text("training FLOPs per token").first.wait_for(state="visible", timeout=5_000)
    # what if: the removals ranked by saving (the planted straggler among them), the cost model's step beside
    wi = page.locator("table.nf-whatif").first
    wi.wait_for(timeout=5_000)
    got = [[c.inner_text() for c in tr.locator("td").all()] for tr in wi.locator("tbody tr").all()]
    assert "straggler" in [r[0] for r in got]
    page.get_by_text("the cost model (config").wait_for(timeout=5_000)
    page.locator("table.nf-critical-path").first.wait_for(timeout=5_000)
    page.get_by_text("the black line is the step's critical path").wait_for(timeout=5_000)
    page.close()


def _tab(browser, server, job: str, label: str, key: str):
    """A page of the app on JOB's tab LABEL: (page, its page errors, the tab's area)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server)
    page.locator("select").first.select_option(job)
    page.get_by_text(label, exact=True).click()
    return page, errors, page.locator(f".nf-tab-{key}").first


def test_whatif_tab_and_the_critical_path_on_the_timeline(server, browser):
    page, errors, area = _tab(browser, server, "moe4", "What if", "whatif")
    area.get_by_text("What if: moe4").wait_for(timeout=60_000)
    table = area.locator("table.nf-whatif").first
    table.wait_for(timeout=10_000)
    removals = [tr.locator("td").first.inner_text() for tr in table.locator("tbody tr").all()]
    assert removals and set(removals) <= {"straggler", "bubble", "host", "io", "memcpy", "exposed_comm", "idle",
                                          "launch_gaps"}
    area.locator("table.nf-critical-path").first.wait_for(timeout=10_000)
    page.get_by_text("Timeline", exact=True).click()
    tl = page.locator(".nf-tab-timeline").first
    tl.get_by_text("the black line is the step's critical path").wait_for(timeout=60_000)
    tl.locator("canvas").first.wait_for(state="visible", timeout=20_000)
    page.wait_for_timeout(500)
    assert (0, 0, 0) in _colours(tl.screenshot())  # the path is drawn
    assert errors == []
    page.close()


def test_compare_tab_flags_the_slower_gemms_and_efficiency_tab_ranks_lost_time(server, browser):
    page, errors, area = _tab(browser, server, "base", "Compare", "compare")
    area.get_by_text("pick a second job").wait_for(timeout=30_000)
    page.locator("select").nth(2).select_option("slow_gemm")
    area.get_by_text("Compare: base → slow_gemm").wait_for(timeout=60_000)
    table = area.locator("table.nf-diff-ledgers").first
    table.wait_for(timeout=10_000)
    sig = {}
    for tr in table.locator("tbody tr").all():
        cells = [c.inner_text() for c in tr.locator("td").all()]
        sig[cells[0]] = cells[-1]
    assert sig["compute"] == "yes" and sig["step"] == "yes"
    assert {k for k, v in sig.items() if v == "yes"} == {"compute", "step"}   # nothing else moved beyond noise
    moved = area.locator("table.nf-diff-significant").first.inner_text()
    assert "kclass" in moved and "gemm" in moved
    area.locator("canvas").first.wait_for(state="visible", timeout=20_000)
    page.wait_for_timeout(500)
    assert _hex(LEDGER_COLORS["compute"]) in _colours(area.screenshot())  # compute's delta bar, solid
    # the efficiency of the same job: kernels ranked by the time lost against the H100's peak
    page.get_by_text("Efficiency", exact=True).click()
    eff = page.locator(".nf-tab-efficiency").first
    eff.get_by_text("Efficiency: base").wait_for(timeout=60_000)
    rows = eff.locator("table.nf-efficiency tbody tr").all()
    assert rows
    lost = [r.locator("td").nth(1).inner_text() for r in rows]
    assert "allreduce" in lost
    eff.locator("table.nf-efficiency-missing").first.wait_for(timeout=5_000)   # GEMMs without shapes: said
    assert "no Input Dims" in eff.locator("table.nf-efficiency-missing").first.inner_text()
    eff.locator("canvas").first.wait_for(state="visible", timeout=20_000)
    assert errors == []
    page.close()


def test_token_auth(store, browser):
    proc, url = _serve(store, "--token", TOKEN)
    try:
        assert _status(url + "/") in (401, 403)
        assert _status(url + "/", {"Authorization": "Bearer wrong-token"}) in (401, 403)
        assert _status(url + "/", {"Authorization": f"Bearer {TOKEN}"}) == 200
        # every route asks: the page's own scripts and styles (Bokeh and Panel serve their static files to anyone
        # unless told), the favicon, metadata, autoload and the websocket
        with urllib.request.urlopen(urllib.request.Request(url + "/", headers={"Authorization": f"Bearer {TOKEN}"}),
                                    timeout=20) as r:
            html = r.read().decode()
        assets = sorted({"/" + u.lstrip("./") for u in re.findall(r'(?:src|href)="([^":]+)"', html)
                         if "static/" in u})
        assert len(assets) >= 5 and any("bokeh" in a for a in assets), assets
        for path in assets + ["/favicon.ico", "/metadata", "/static/js/bokeh.min.js"]:
            assert _status(url + path, {"Authorization": f"Bearer {TOKEN}"}) == 200, path
            assert _status(url + path) == 401, path
            assert _status(url + path, {"Authorization": "Bearer wrong-token"}) == 401, path
        ws = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
              "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
        assert _status(url + "/ws", ws) == 401
        page = browser.new_page()
        resp = page.goto(url + "/")
        assert resp.status in (401, 403)
        # the token once in the URL; the cookie carries the websocket and the static files
        page.goto(f"{url}/?token={TOKEN}&job=moe4&view=overview")
        page.locator(".nf-tab-overview canvas").first.wait_for(state="visible", timeout=30_000)
        page.close()
        # after login only a path on this server is followed: a backslash, a doubled slash, a control
        # character or a scheme sends the browser home instead (a browser reads "/\\evil.com" as "//evil.com")
        import http.client
        from urllib.parse import quote, urlsplit

        host = urlsplit(url)
        for nxt, want in (("/%5Cevil.com", "/"), ("//evil.com", "/"), ("/%09/evil.com", "/"),
                          ("https://evil.com/", "/"), ("/\\/evil.com", "/"), ("%2F%2Fevil.com", "/"),
                          ("/?job=moe4", "/?job=moe4")):
            c = http.client.HTTPConnection(host.hostname, host.port, timeout=20)
            c.request("GET", f"/nf-login?token={TOKEN}&next={quote(nxt, safe='%/?=')}")
            r = c.getresponse()
            assert r.status in (301, 302, 303, 307) and r.getheader("Location") == want, (nxt, r.status,
                                                                                           r.getheader("Location"))
            c.close()
    finally:
        _stop(proc)


def test_basic_auth_and_non_loopback_refusal(store):
    r = subprocess.run([sys.executable, "-m", "ninefold.cli.main", "serve", "--db", str(store), "--host", "0.0.0.0",
                        "--port", str(_free_port())], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "refusing to serve on non-loopback address 0.0.0.0 without authentication" in r.stderr
    proc, url = _serve(store, "--basic-auth", "ana:pw-1234")
    try:
        req = urllib.request.Request(url + "/")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=20)
        assert e.value.code == 401 and "Basic" in e.value.headers.get("WWW-Authenticate", "")
        bad = base64.b64encode(b"ana:nope").decode()
        assert _status(url + "/", {"Authorization": f"Basic {bad}"}) == 401
        good = base64.b64encode(b"ana:pw-1234").decode()
        assert _status(url + "/", {"Authorization": f"Basic {good}"}) == 200
    finally:
        _stop(proc)


def test_twenty_concurrent_uploads_all_land(browser, tmp_path):
    """Twenty browser sessions upload a trace each at once into one server: every page ends on its own job's
    overview, and the uploads list shows all twenty attributed, none failed."""
    from sample_traces.alltoall2023 import generate_a2a

    n = 20
    files = []
    for i in range(n):
        generate_a2a(tmp_path / f"j{i}", ranks=2, steps=1, seed=100 + i)
        files.append(tmp_path / f"j{i}" / "rank-0.json")
    assert len({f.read_bytes() for f in files}) == n  # twenty different files (uploads are keyed by sha256)
    proc, url = _serve(tmp_path / "c.duckdb")
    ctx = browser.new_context()
    try:
        pages = []
        for i in range(n):
            page = ctx.new_page()
            page.goto(f"{url}/?upload_job=c{i}")
            page.get_by_text("Upload", exact=True).click()
            pages.append(page)
        for i, page in enumerate(pages):  # all twenty in flight before any is waited for
            page.locator(".nf-tab-upload input[type=file]").set_input_files([str(files[i])])
        for i, page in enumerate(pages):
            page.locator(".nf-tab-overview canvas").first.wait_for(state="visible", timeout=240_000)
            assert page.locator("select").first.input_value() == f"c{i}"
        page = pages[0]
        page.reload()
        page.get_by_text("Upload", exact=True).click()
        listing = page.locator(".nf-uploads").first
        listing.wait_for(timeout=30_000)
        assert listing.get_by_text("attributed", exact=True).count() == n
        assert listing.get_by_text("failed", exact=True).count() == 0
    finally:
        ctx.close()
        _stop(proc)
