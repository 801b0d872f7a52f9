import os
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

# Property tests draw the same examples on every run, so the test gate cannot turn red by chance;
# HYPOTHESIS_PROFILE=explore draws fresh examples on each run to hunt for new counterexamples (pin any it
# finds with @example).
settings.register_profile("gate", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))
SHARED_TRACES = Path(os.environ.get("NINEFOLD_SHARED_TRACES", ROOT.parent / "shared" / "traces"))

needs_shared = pytest.mark.skipif(
    not SHARED_TRACES.is_dir(),
    reason=f"the shared trace corpus is not beside this checkout ({SHARED_TRACES})",
)


# ---- browser tests: Debian's Chromium driven by Playwright (make test installs it)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def offline(page) -> tuple[list, list]:
    """Let PAGE load only file:// URLs: (the other URLs it tried, its page errors), filled as it runs."""
    attempted, errors = [], []

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            attempted.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return attempted, errors


@pytest.fixture
def db(tmp_path):
    from ninefold.store.connection import connect

    con = connect(tmp_path / "t.duckdb")
    yield con
    con.close()


# ---- reference ledger results (tests/reference_totals.py): every attribution run in the tests is checked
# against the results recorded for its inputs, or recorded with NINEFOLD_RECORD_REFERENCE=1
_RECORDING = os.environ.get("NINEFOLD_RECORD_REFERENCE") == "1"
_REF: dict = {}
_REF_STATS = {"checked": 0, "recorded": 0}


def pytest_sessionstart(session):
    from tests import reference_totals

    _REF.update(reference_totals.load())


def pytest_sessionfinish(session, exitstatus):
    if _RECORDING and _REF_STATS["recorded"]:
        from tests import reference_totals

        reference_totals.save(_REF)


@pytest.fixture(autouse=True)
def _reference_ledgers(request, monkeypatch):
    import ninefold.analysis.attribution.attribute as attribution
    from tests import reference_totals

    core = attribution._attribute

    def checked(con, job, recompute_pattern, io_pattern, progress=None):
        out = core(con, job, recompute_pattern, io_pattern, progress)
        key = reference_totals.input_key(con, job, recompute_pattern, io_pattern)
        got = reference_totals.results(con, job)
        if _RECORDING:
            _REF.setdefault(key, {"test": request.node.nodeid, "job": job, **got})
            _REF_STATS["recorded"] += 1
        elif key in _REF:
            diff = reference_totals.compare(_REF[key], got)
            assert diff is None, f"job {job!r} ({_REF[key]['test']}): {diff}"
            _REF_STATS["checked"] += 1
        return out

    monkeypatch.setattr(attribution, "_attribute", checked)
    yield


def pytest_terminal_summary(terminalreporter):
    if _REF_STATS["checked"] or _REF_STATS["recorded"]:
        terminalreporter.write_line(f"reference ledgers: {_REF_STATS['checked']} attribution runs reproduced the "
                                    f"recorded results exactly, {_REF_STATS['recorded']} recorded")
