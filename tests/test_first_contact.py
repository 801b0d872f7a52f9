"""What a new user meets first: each mistake or thin job gets one line saying what is wrong and what to do, with
one exit status per mistake (2: usage, the store or job is not there; 1: a file or job that could not be read or
attributed; 0: an answer, even "no waits")."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ninefold.dashboards.style import esc
from ninefold.cli.main import cli
from conftest import SHARED_TRACES, needs_shared

ROOT = Path(__file__).resolve().parents[1]
LACKS_GPU = ("its traces hold no GPU ops (no kernel, memcpy or memset): profile with "
             "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
READ_COMMANDS = (["ledgers"], ["breakdown"], ["waits"], ["critical-path"], ["whatif"], ["export", "--out", "x.json"],
                 ["efficiency"], ["report", "--out", "r.html"])


def _kineto(path: Path, steps: int = 2, gpu: bool = True, zero_steps: bool = False) -> Path:
    """A one-rank Kineto trace whose GPU work is only a memcpy and a memset per step (back to back, filling the
    step), or no GPU op at all; ZERO_STEPS: ProfilerStep#N ranges of no duration."""
    ev = [{"name": "process_labels", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}}]
    for s in range(steps):
        t0 = 1000.0 + s * 1000
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": t0,
                   "dur": 0 if zero_steps else 1000})
        if gpu:
            for i, (cat, name, ts, dur) in enumerate((("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t0, 600),
                                                      ("gpu_memset", "Memset (Device)", t0 + 600, 400))):
                ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                           "args": {"correlation": 2 * s + i + 1, "stream": 7, "device": 0, "bytes": 1 << 20}})
    path.mkdir(parents=True, exist_ok=True)
    f = path / "rank-0.json"
    f.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
                             "traceEvents": ev}))
    return f


def run(*args):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """copies: memcpy/memset only, attributed; nogpu: no GPU op; zero: zero-length steps; pending: ingested,
    not attributed (all one rank)."""
    d = tmp_path_factory.mktemp("first")
    db = d / "nf.duckdb"
    for job, kw in (("copies", {}), ("nogpu", {"gpu": False}), ("zero", {"zero_steps": True}), ("pending", {})):
        r = run("ingest", _kineto(d / job, **kw), "--db", db, "--job", job, "--quiet")
        assert r.exit_code == 0, r.output
    r = run("attribute", "--db", db, "--job", "copies")
    assert r.exit_code == 0, r.output
    return d, db


def test_whatif_on_a_job_of_copies_only(store):
    d, db = store
    r = run("whatif", "--db", db, "--job", "copies")
    assert r.exit_code == 0, r.output
    row = next(x for x in r.output.splitlines() if x.startswith("memcpy "))
    # the job is nothing but copies: without them no step time is left, the speed-up is unbounded
    assert row.split()[1:3] == ["0.000", "2.000"] and row.split()[3] == "all"
    assert "(speed-up 'all': without that ledger nothing of the step is left)" in r.output
    r = run("whatif", "--db", db, "--job", "copies", "--remove", "memcpy")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == ("copies without memcpy: 2.000 ms -> 0.000 ms (saves 2.000 ms, "
                                        "speed-up all)")


def test_attribute_says_what_the_job_lacks(store):
    d, db = store
    r = run("attribute", "--db", db, "--job", "nogpu")
    assert r.exit_code == 1
    assert r.stderr.strip() == f"error: nogpu: nothing to attribute: {LACKS_GPU}"
    r = run("attribute", "--db", db, "--job", "zero")
    assert r.exit_code == 1
    assert r.stderr.strip() == ("error: zero: nothing to attribute: all 2 of its steps are zero-length "
                                "(ProfilerStep#N ranges with no duration): nothing falls inside a step")
    r = run("attribute", "--db", db, "--job", "nosuchjob")
    assert r.exit_code == 2 and not r.stdout
    assert r.stderr.strip() == (f"error: job 'nosuchjob' is not in the store {db} "
                                "(jobs: copies, nogpu, pending, zero)")
    r = run("attribute", "--db", d / "missing.duckdb")
    assert r.exit_code == 2 and not (d / "missing.duckdb").exists()


@pytest.mark.parametrize("cmd", READ_COMMANDS, ids=lambda c: c[0])
def test_read_commands_share_one_check(store, cmd, tmp_path):
    d, db = store
    extra = [tmp_path / a if a.endswith((".json", ".html")) else a for a in cmd[1:]]
    r = run(cmd[0], *extra, "--db", db, "--job", "nosuchjob")
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == (f"error: job 'nosuchjob' is not in the store {db} "
                                "(jobs: copies, nogpu, pending, zero)")
    missing = tmp_path / "missing.duckdb"
    r = run(cmd[0], *extra, "--db", missing, "--job", "copies")
    assert r.exit_code == 2 and not missing.exists()
    assert r.stderr.strip() == f"error: no store at {missing}: create it with `ninefold ingest TRACES --db {missing}`"
    if cmd[0] in ("efficiency", "report"):   # they read the job's GPU ops, not its ledgers
        return
    r = run(cmd[0], *extra, "--db", db, "--job", "nogpu")
    assert r.exit_code == 2 and r.stderr.strip() == f"error: job 'nogpu' has no attributable steps: {LACKS_GPU}"
    r = run(cmd[0], *extra, "--db", db, "--job", "pending")
    assert r.exit_code == 2
    assert r.stderr.strip() == (f"error: job 'pending' is not attributed yet: run `ninefold attribute --db {db} "
                                "--job pending` first")


def test_diff_checks_both_jobs(store):
    d, db = store
    r = run("diff", "--db", db, "copies", "zero")
    assert r.exit_code == 2 and r.stderr.strip().startswith("error: job 'zero' has no attributable steps: all 2 ")
    r = run("diff", "--db", db, "nosuchjob", "copies")
    assert r.exit_code == 2 and "error: job 'nosuchjob' is not in the store" in r.stderr


def test_waits_on_one_rank(store):
    d, db = store
    r = run("waits", "--db", db, "--job", "copies")
    assert r.exit_code == 0 and r.output.strip() == "one rank: no cross-rank waits"


def test_ledgers_on_a_file_that_is_not_a_store(tmp_path):
    bad = tmp_path / "notes.duckdb"
    bad.write_text("not a database\n")
    r = run("ledgers", "--db", bad, "--job", "j")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"error: cannot open {bad} as a ninefold store: ")


def test_failed_ingest_leaves_no_store(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    db = tmp_path / "nf.duckdb"
    r = run("ingest", bad, "--db", db, "--rank", "0")
    assert r.exit_code == 1 and "FAILED" in r.output
    assert not db.exists() and not Path(f"{db}.wal").exists()
    r = run("ingest", tmp_path / "nosuch", "--db", db)
    assert r.exit_code == 2 and not db.exists()
    # a store that was there before keeps everything it held
    _kineto(tmp_path / "ok")
    assert run("ingest", tmp_path / "ok", "--db", db, "--job", "ok", "--quiet").exit_code == 0
    assert run("ingest", bad, "--db", db, "--rank", "0").exit_code == 1
    assert db.exists() and "ok " in run("summary", "--db", db).output


def test_missing_path_is_a_usage_error_everywhere(tmp_path):
    for cmd in (["ingest", tmp_path / "nosuch", "--db", tmp_path / "x.duckdb"], ["inspect", tmp_path / "nosuch"]):
        r = run(*cmd)
        assert r.exit_code == 2, (cmd[0], r.output)
        assert f"{tmp_path / 'nosuch'}: no such file or directory" in r.output


def test_empty_directory_lists_only_what_is_read(tmp_path):
    (tmp_path / "empty").mkdir()
    r = run("ingest", tmp_path / "empty", "--db", tmp_path / "x.duckdb")
    assert r.exit_code == 2
    line = r.stderr.strip()
    listed = line[line.index("(") + 1:line.index(";")]
    assert "*.json" in listed and "*.sqlite" in listed and "nsys-rep" not in listed
    assert line.endswith("an Nsight Systems .nsys-rep is read once exported: nsys export --type sqlite "
                         "REPORT.nsys-rep)")


def test_compare_says_it_attributes_first(tmp_path):
    """On the project's generated job, as `make demo` runs it."""
    from sample_traces.generate import generate

    generate(tmp_path / "job", ranks=4, steps=3, seed=0)
    db = tmp_path / "nf.duckdb"
    assert run("ingest", tmp_path / "job", "--db", db, "--job", "sample_job", "--quiet").exit_code == 0
    cfg = ROOT / "sample_traces" / "configs" / "dp4.toml"
    r = run("compare", "--db", db, "--job", "sample_job", "--config", cfg)
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines()[0] == "attributing sample_job first…"
    r = run("compare", "--db", db, "--job", "sample_job", "--config", cfg)
    assert r.exit_code == 0 and "attributing" not in r.stderr


def test_report_honours_wait(store, tmp_path):
    """A store another process writes: `report --wait 1` waits about a second, says so, then says it is busy."""
    d, db = store
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(60)", str(db)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        r = run("--wait", "1", "report", "--db", db, "--job", "copies", "--out", tmp_path / "r.html")
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert r.exit_code == 2 and took < 8, (took, r.output)
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith(f"waiting for {db}: locked by ") and lines[0].endswith("(up to 1 s)")
    assert lines[-1].startswith(f"error: {db}: locked by ") and lines[-1].endswith(
        "gave up after 1 s (--wait SECONDS to wait longer)")
    assert not (tmp_path / "r.html").exists()


def test_app_views_say_why_a_job_has_no_ledgers(store):
    """The app's Overview and What if tabs say what the job lacks, or what to run, as the command line does."""
    from ninefold.web.data_store import read_connection
    from ninefold.dashboards.views import overview, whatif

    d, db = store
    with read_connection(db) as con:
        for job, want in (("nogpu", f"job 'nogpu' has no attributable steps: {LACKS_GPU}"),
                          ("pending", "job 'pending' is not attributed yet: run `ninefold attribute --job pending` "
                                      "first (or upload it again)")):
            for view in (overview, whatif):
                html = view.render(view.load(con, job))[0].text
                assert esc(want) in html, (view.__name__, job, html)


@needs_shared
def test_attribute_on_real_traces_without_gpu_work(tmp_path):
    """HTA's CPU-only rank (no GPU op) fails naming what it lacks; an NCCL log is skipped by a plain `attribute`
    and refused by `attribute --job`; the DeepSeek-V3 training rank beside them is attributed."""
    db = tmp_path / "r.duckdb"
    for path, job, extra in (("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", "cpu_only", []),
                             ("nccl_logs/nccl_issue1193_ray_allreduce_128ranks_COLL.log", "ncclonly", []),
                             ("deepseek/train.json", "deepseek", ["--rank", "0"])):
        assert run("ingest", SHARED_TRACES / path, "--db", db, "--job", job, "--quiet", *extra).exit_code == 0
    r = run("attribute", "--db", db)
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [f"error: cpu_only: nothing to attribute: {LACKS_GPU}",
                                     "ncclonly: skipped: it has no profiler trace (only logs or dumps): ingest its "
                                     "Kineto JSON or Nsight Systems SQLite files"]
    assert r.stdout.startswith("deepseek: ")
    r = run("attribute", "--db", db, "--job", "ncclonly")
    assert r.exit_code == 1 and "error: ncclonly: nothing to attribute: it has no profiler trace" in r.stderr
    r = run("waits", "--db", db, "--job", "deepseek")
    assert r.exit_code == 0 and r.output.strip() == "one rank: no cross-rank waits"


def test_breakdown_of_ledgers_without_drill_down_keys(store, tmp_path):
    """A store whose ledgers carry no drill-down tables (written by an older ninefold) is told to attribute
    again, not shown an empty table."""
    import duckdb

    d, db = store
    old = tmp_path / "old.duckdb"
    con = duckdb.connect(str(old))
    con.execute(f"ATTACH '{db}' AS src (READ_ONLY)")
    for t in ("jobs", "traces", "ledger_totals"):
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM src.{t} WHERE job = 'copies'")
    con.close()
    r = run("breakdown", "--db", old, "--job", "copies")
    assert r.exit_code == 2
    assert r.stderr.strip() == (f"error: job 'copies' in {old} has ledgers but no drill-down keys: run `ninefold "
                                f"attribute --db {old} --job copies` again")


@pytest.mark.parametrize("cmd", (["summary"], ["inspect"], ["hang", "--job", "j"], ["nccl"],
                                 ["predict", str(ROOT / "sample_traces" / "configs" / "dp4.toml"), "--job", "j"],
                                 ["compare", "--job", "j", "--config",
                                  str(ROOT / "sample_traces" / "configs" / "dp4.toml")]), ids=lambda c: c[0])
def test_a_missing_store_is_one_line_everywhere(cmd, tmp_path):
    missing = tmp_path / "missing.duckdb"
    r = run(*cmd, "--db", missing)
    assert r.exit_code == 2 and not missing.exists()
    assert r.stderr.strip() == f"error: no store at {missing}: create it with `ninefold ingest TRACES --db {missing}`"
