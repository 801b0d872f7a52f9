"""A running ``ninefold serve`` and other processes on the same store: a write lock held elsewhere never freezes
the server (every view says who holds the store and fills in when it goes; static files answer at once), and
another process's ingest + attribute shows in the app without a restart."""
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from playwright.sync_api import expect

from ninefold.dashboards.views import TABS  # not from web.app: Panel imported here changes the report's resources
from test_web_browser import ROOT, _serve, _stop

# holds a read-write connection on argv[1] until its stdin closes; the rest of argv only dresses its command line
# as a ninefold command's would look
# (and writes a row, as an ingest would: what the server has cached is stale)
HOLD = ("import duckdb, sys; c = duckdb.connect(sys.argv[1]); c.execute('CREATE TABLE IF NOT EXISTS held (x INT)'); "
        "c.execute('INSERT INTO held VALUES (1)'); print('locked', flush=True); sys.stdin.read()")


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    from ninefold.analysis.attribution.attribute import attribute_job
    from ninefold.ingest.load import ingest_paths
    from sample_traces.generate import generate
    from ninefold.store.connection import connect

    d = tmp_path_factory.mktemp("lock")
    generate(d / "first", ranks=2, steps=2, seed=1)
    con = connect(d / "s.duckdb")
    ingest_paths(con, sorted((d / "first").glob("rank-*.json")), job="first")
    attribute_job(con, "first")
    con.close()
    return d / "s.duckdb"


def _hold(db):
    h = subprocess.Popen([sys.executable, "-c", HOLD, str(db), "ninefold.cli.main", "--wait", "3", "ingest", "x.json"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert h.stdout.readline().strip() == "locked"
    return h


def _release(h):
    h.stdin.close()
    h.wait(20)


def _get_s(url, least: int = 100_000) -> float:
    """Seconds a GET of URL takes (its body at least LEAST bytes)."""
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=60) as r:
        assert r.status == 200 and len(r.read()) >= least
    return time.monotonic() - t0


def test_a_locked_store_answers_busy_at_once_and_fills_in_when_it_goes(small_store, browser):
    proc, url = _serve(small_store)
    _get_s(f"{url}/?job=first", 1000)  # the server's first page builds its templates
    holder = _hold(small_store)
    time.sleep(1.2)  # the server looks at the store file at most once a second
    pages = []
    try:
        # a page load while the store is locked does not hold up anything else the server does
        slow = []
        t = threading.Thread(target=lambda: slow.append(_get_s(f"{url}/?job=first&view=overview", 1000)))
        t.start()
        time.sleep(0.3)
        static_s = _get_s(url + "/static/js/bokeh.min.js")
        t.join()
        print(f'static file {static_s:.3f} s during a page load of {slow[0]:.3f} s')
        assert static_s < 1.0, static_s
        assert slow[0] < 10.0, slow  # the old read slept 20 s on the event loop before giving up
        for key, _ in TABS:
            if key == "upload":
                continue
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            t0 = time.monotonic()
            page.goto(f"{url}/?job=first&view={key}")
            busy = page.locator(f".nf-tab-{key} .nf-store-busy").first
            busy.wait_for(timeout=19_000)  # under the old read's 20 s, with room for a loaded machine
            assert time.monotonic() - t0 < 19
            text = busy.inner_text()
            assert f"the store is busy (ingest by PID {holder.pid}), retrying" in text, text
            assert _get_s(url + "/static/js/bokeh.min.js") < 1.0
            pages.append((key, page))
        _release(holder)
        # every open page fills in by itself once the lock goes
        for key, page in pages:
            area = page.locator(f".nf-tab-{key}").first
            want = {"jobs": "Jobs", "compare": "pick a second job"}.get(key, "first")
            area.get_by_text(want).first.wait_for(timeout=60_000)   # every page re-renders at once: 2 cores
            assert area.locator(".nf-store-busy").count() == 0, key
            expect(page.locator("select").first).to_have_value("first", timeout=10_000)
        overview = dict(pages)["overview"].locator(".nf-tab-overview canvas").first
        overview.wait_for(state="visible", timeout=30_000)
    finally:
        if holder.poll() is None:
            _release(holder)
        for _, page in pages:
            page.close()
        _stop(proc)


def test_another_process_s_ingest_shows_without_a_restart(small_store, browser, tmp_path):
    from sample_traces.generate import generate

    proc, url = _serve(small_store)
    try:
        page = browser.new_page()
        page.goto(f"{url}/?view=jobs")
        page.locator(".nf-tab-jobs table.nf-jobs").first.wait_for(timeout=30_000)
        names = lambda p: p.locator("select").first.locator("option").all_inner_texts()  # noqa: E731
        assert names(page) == ["first"]
        generate(tmp_path / "second", ranks=2, steps=2, seed=2)
        cli = [sys.executable, "-m", "ninefold.cli.main"]
        for args in (["ingest", *map(str, sorted((tmp_path / "second").glob("rank-*.json"))), "--db", str(small_store),
                      "--job", "second"], ["attribute", "--db", str(small_store), "--job", "second"]):
            r = subprocess.run(cli + args, cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
        # a new page load lists it, and so does the page already open (its periodic tick)
        fresh = browser.new_page()
        fresh.goto(f"{url}/?view=jobs&job=second")
        fresh.locator(".nf-tab-jobs table.nf-jobs").get_by_text("second", exact=True).wait_for(timeout=30_000)
        assert sorted(names(fresh)) == ["first", "second"]
        deadline = time.monotonic() + 15
        while sorted(names(page)) != ["first", "second"]:
            assert time.monotonic() < deadline, names(page)
            page.wait_for_timeout(300)
        page.locator(".nf-tab-jobs table.nf-jobs").get_by_text("second", exact=True).wait_for(timeout=10_000)
        fresh.close()
        page.close()
    finally:
        _stop(proc)


def test_describe_holder_names_the_ninefold_command(small_store):
    from ninefold.web import data_store

    holder = _hold(small_store)
    try:
        with pytest.raises(data_store.StoreBusy) as e:
            with data_store.read_connection(small_store, wait_s=0):
                pass
        assert e.value.holder == f"ingest by PID {holder.pid}"
        t0 = time.monotonic()
        with pytest.raises(data_store.StoreBusy):
            with data_store.read_connection(small_store, wait_s=0.5):
                pass
        assert 0.4 < time.monotonic() - t0 < 3
    finally:
        _release(holder)


def test_serve_meeting_a_locked_store_at_start_fails_in_one_line(small_store):
    holder = _hold(small_store)
    try:
        r = subprocess.run([sys.executable, "-m", "ninefold.cli.main", "--wait", "0.5", "serve", "--db", str(small_store),
                            "--port", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        _release(holder)
    assert "Traceback" not in r.stderr
    line = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode == 2 and len(line) == 1 and f"PID {holder.pid}" in line[0], r.stderr
