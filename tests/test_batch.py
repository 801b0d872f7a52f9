"""`ninefold batch` over a real two-worker LocalCluster on loopback: nights, skips, failures, regressions."""
import json
import re
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.ledgers import LEDGERS
from ninefold.dashboards.style import esc
from ninefold.ingest.load import ingest_paths
from sample_traces.generate import generate
from sample_traces.pipeline import generate_1f1b
from ninefold.cli.main import cli
from ninefold.store.connection import connect
from tests.test_batch_index import index_text, index_texts, trend_lines

CHECKED = ["traces", "gpu_ops", "host_ops", "collectives", "steps", "flows", "diagnostics",
           "ledger_totals", "ledger_intervals", "step_windows", "clock_offsets"]


def make_dp_job(d: Path, seed: int, ranks: int = 2) -> Path:
    generate(d, ranks=ranks, steps=2, seed=seed)
    (d / "ground_truth.json").unlink()   # not a rank trace
    return d


def make_pp_job(d: Path, seed: int) -> Path:
    generate_1f1b(d, stages=2, microbatches=4, seed=seed)
    (d / "ground_truth.json").unlink()
    return d


def serial_store(path: Path, jobs: dict) -> Path:
    """The same jobs through the ordinary single-process ingest + attribute (no Dask, no Parquet)."""
    con = connect(path)
    for name, d in jobs.items():
        res = ingest_paths(con, [d], job=name)
        assert all(r.status == "stored" for r in res), [r.message for r in res]
        attribute_job(con, name)
    con.close()
    return path


def per_job_counts(db: Path, jobs) -> dict:
    con = duckdb.connect(str(db), read_only=True)
    out = {t: dict(con.execute(f"SELECT job, count(*) FROM {t} WHERE job IN ? GROUP BY job", [list(jobs)])
                   .fetchall()) for t in CHECKED}
    con.close()
    return out


def ledger_rows(db: Path, jobs) -> list:
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT job, rank, step, ledger, ns FROM ledger_totals WHERE job IN ? ORDER BY ALL",
                       [list(jobs)]).fetchall()
    con.close()
    return rows


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    yield c
    c.close()


@pytest.fixture(scope="module")
def nights(tmp_path_factory, cluster):
    """Night n1: three good jobs, a truncated one, a garbage one. Night n2: job-1 turned into a pipeline job."""
    base = tmp_path_factory.mktemp("batch")
    root = base / "drop"
    for i in range(3):
        make_dp_job(root / f"job-{i}", seed=i)
    make_dp_job(root / "truncated", seed=7)
    f = root / "truncated" / "rank-1.json"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    make_dp_job(root / "garbage", seed=8)
    (root / "garbage" / "rank-0.json").write_bytes(b"\x00\x17 this is not a trace \xff" * 200)
    db, reports = base / "store" / "catalog.duckdb", base / "reports"
    run = CliRunner()
    args = ["batch", str(root), "--db", str(db), "--reports", str(reports), "--scheduler",
            cluster.scheduler_address]
    n1 = run.invoke(cli, args + ["--night", "n1"])
    n1_summary = json.loads((reports / "summary.json").read_text())
    n1_index = (reports / "index.html").read_text()
    n1_counts = per_job_counts(db, ["job-0", "job-1", "job-2"])
    n1_ledgers = ledger_rows(db, ["job-0", "job-1", "job-2"])
    serial1 = serial_store(base / "serial1.duckdb", {f"job-{i}": root / f"job-{i}" for i in range(3)})

    shutil.rmtree(root / "truncated")
    shutil.rmtree(root / "garbage")
    shutil.rmtree(root / "job-1")
    make_pp_job(root / "job-1", seed=1)
    # a lenient threshold first: no regression; then the same night again with the default 5 points
    n2_lenient = run.invoke(cli, args + ["--night", "n2", "--regression-points", "99"])
    n2_lenient_summary = json.loads((reports / "summary.json").read_text())
    n2 = run.invoke(cli, args + ["--night", "n2"])
    serial2 = serial_store(base / "serial2.duckdb", {"job-1": root / "job-1"})
    return {"root": root, "db": db, "reports": reports, "n1": n1, "n1_summary": n1_summary,
            "n1_index": n1_index, "n1_counts": n1_counts, "n1_ledgers": n1_ledgers, "serial1": serial1,
            "n2_lenient": n2_lenient, "n2_lenient_summary": n2_lenient_summary, "n2": n2, "serial2": serial2,
            "args": args}


def test_broken_jobs_fail_alone_and_exit_4(nights):
    r, s = nights["n1"], nights["n1_summary"]
    assert r.exit_code == 4, r.output
    assert s["exit_code"] == 4
    assert s["jobs"]["processed"] == ["job-0", "job-1", "job-2"]
    failed = {f["job"]: f for f in s["jobs"]["failed"]}
    assert set(failed) == {"truncated", "garbage"}
    assert "truncated/rank-1.json" in failed["truncated"]["error"] and "truncated" in failed["truncated"]["error"]
    assert "garbage/rank-0.json" in failed["garbage"]["error"]
    for job, f in failed.items():
        log = Path(f["log"]).read_text()
        assert f["error"].splitlines()[0] in log and "FAILED" in log
        assert not (nights["reports"] / f"{job}.html").exists()
    # each processed job's kernels by lost time came back from its attribute task on the cluster
    assert set(s["lost_time"]) == {"job-0", "job-1", "job-2"}
    assert all(v["rows"] and all(r["lost_ns"] > 0 for r in v["rows"]) for v in s["lost_time"].values())
    # the index tags the failed jobs and shows their errors
    text = index_text(nights["n1_index"])
    for job, f in failed.items():
        head = next(t for t in index_texts(nights["n1_index"]) if f"<h2 id='job-{job}'>" in t)
        assert "<span class='tag fail'>failed</span>" in head and f"<a href='logs/{job}.log'>log</a>" in head
        assert "<p class='failed'>" + esc(f["error"]).splitlines()[0] in head
    assert text.index("<h2 id='job-garbage'>") < text.index("<h2 id='job-job-0'>")
    # progress: one line per job with the overall counter
    assert len(re.findall(r"^\[\d/5\] ", r.output, re.M)) == 5, r.output
    assert re.search(r"^\[\d/5\] job-0 attributed \(2 ranks.*\d+\.\ds\)$", r.output, re.M), r.output


def test_catalog_equals_a_serial_ingest(nights):
    jobs = ["job-0", "job-1", "job-2"]
    assert nights["n1_counts"] == per_job_counts(nights["serial1"], jobs)
    assert nights["n1_counts"]["gpu_ops"]["job-0"] > 0 and nights["n1_counts"]["ledger_totals"]["job-2"] > 0
    assert nights["n1_ledgers"] == ledger_rows(nights["serial1"], jobs)
    # the broken jobs left nothing in the catalog
    con = duckdb.connect(str(nights["db"]), read_only=True)
    assert con.execute("SELECT count(*) FROM traces WHERE job IN ('truncated', 'garbage')").fetchone()[0] == 0
    con.close()


def test_parquet_store_is_hive_partitioned_without_duplicates(nights):
    proot = nights["db"].parent / "parquet"
    parts = list(proot.rglob("*.parquet"))
    assert parts
    per_dir: dict = {}
    for p in parts:
        rel = p.relative_to(proot).parts
        assert rel[1].startswith("job=") and (len(rel) == 3 or rel[2].startswith("rank=")), rel
        per_dir.setdefault(p.parent, []).append(p.name)
    # one part per (table, job, rank): superseded content was removed once the new rows were committed
    dup = {str(k): v for k, v in per_dir.items() if len(v) > 1}
    assert not dup
    assert not list(proot.rglob(".*.tmp-*"))
    con = duckdb.connect(str(nights["db"]), read_only=True)
    for t in ["gpu_ops", "host_ops", "ledger_totals", "traces"]:
        via_glob = dict(duckdb.sql(f"SELECT job, count(*) FROM read_parquet('{proot}/{t}/**/*.parquet', "
                                   f"hive_partitioning = false) GROUP BY job").fetchall())
        in_catalog = dict(con.execute(f"SELECT job, count(*) FROM {t} GROUP BY job").fetchall())
        assert via_glob == in_catalog, t
    con.close()


def test_reports_logs_and_ledgers_command(nights):
    reports = nights["reports"]
    for i in range(3):
        html = (reports / f"job-{i}.html").read_text()
        assert f"ninefold report: job-{i}" in html
        assert not re.search(r"<script[^>]+src=", html)
        log = (reports / "logs" / f"job-{i}.log").read_text()
        assert "attributed 2 ranks x 2 steps" in log and "parsed " in log and "catalog: loaded" in log
    r = CliRunner().invoke(cli, ["ledgers", "--db", str(nights["db"]), "--job", "job-2", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    rows = doc["ledgers"]
    assert {d["rank"] for d in doc["comm_compute_overlap"]} == {0, 1}
    assert {(d["rank"], d["step"]) for d in rows} == {(0, 10), (0, 11), (1, 10), (1, 11)}
    assert sum(d["ns"] for d in rows) == sum(x[4] for x in nights["n1_ledgers"] if x[0] == "job-2")


def test_shares_are_window_fractions(nights):
    shares = nights["n1_summary"]["shares_pct"]
    con = duckdb.connect(str(nights["serial1"]), read_only=True)
    for job, sh in shares.items():
        # each share is rounded to 4 decimals in the summary: the sum is 100 within half a unit per ledger
        assert abs(sum(sh.values()) - 100) <= len(sh) * 0.5e-4 + 1e-9
        # the planted straggler and dataloader show up as their ledgers
        assert sh["straggler"] > 0 and sh["io"] > 0 and sh["compute"] > 50
        windows = con.execute("SELECT rank, step, end_ns - start_ns FROM step_windows WHERE job = ?",
                              [job]).fetchall()
        tot = {(r, s, led): ns for r, s, led, ns in con.execute(
            "SELECT rank, step, ledger, ns FROM ledger_totals WHERE job = ?", [job]).fetchall()}
        for led, pct in sh.items():
            expect = 100 * sum(tot.get((r, s, led), 0) / w for r, s, w in windows) / len(windows)
            assert abs(pct - expect) < 1e-3, (job, led)
    con.close()


def test_second_night_skips_unchanged_and_flags_the_regression(nights):
    # job-1 turned from a data-parallel job into a pipeline job: its step is significantly longer than on n1,
    # whatever --regression-points says (that threshold only reports raw share moves now)
    lenient, s1 = nights["n2_lenient"], nights["n2_lenient_summary"]
    assert lenient.exit_code == 3, lenient.output
    assert s1["jobs"]["processed"] == ["job-1"]
    assert s1["jobs"]["skipped"] == [{"job": "job-0", "last_night": "n1"}, {"job": "job-2", "last_night": "n1"}]
    assert s1["share_moves"] == [] and s1["regressions"]
    assert set(s1["diffs"]) == {"job-1"}
    r = nights["n2"]
    assert r.exit_code == 3, r.output
    s = json.loads((nights["reports"] / "summary.json").read_text())
    assert s["jobs"]["processed"] == ["job-1"] and s["jobs"]["failed"] == []
    assert s["regressions"] == s1["regressions"]   # the rerun of the night compares the same samples
    for reg in s["regressions"]:
        assert reg["job"] == "job-1" and reg["previous_night"] == "n1"
        assert reg["delta_ns"] > 0 and reg["ci_low_ns"] > 0
    d = s["diffs"]["job-1"]
    assert d["regression"] and d["top"] and d["steps"][0] == 2
    [move] = s["share_moves"]
    assert move["job"] == "job-1" and move["ledger"] == "bubble" and move["previous_night"] == "n1"
    assert move["previous_pct"] == 0 and move["delta_points"] > 5
    assert abs(move["current_pct"] - s["shares_pct"]["job-1"]["bubble"]) < 1e-2
    # the rerun of the same night did no work again
    log = (nights["reports"] / "logs" / "job-1.log").read_text()
    assert "already processed this night" in log and "share move: bubble" in log and "REGRESSION: " in log
    page = (nights["reports"] / "index.html").read_text()
    text = index_text(page)      # (and BokehJS inline: no external script or stylesheet)
    assert "regression: " in text and "http" not in text
    # a trend figure per job, one line per ledger, one point per night of the job
    for j in ("job-0", "job-1", "job-2"):
        lines = trend_lines(page, j)
        assert list(lines) == list(LEDGERS)
        assert all(xs == (["n1", "n2"] if j == "job-1" else ["n1"]) for xs, _ in lines.values()), j
    assert "tonight's diff" in text
    # job-1 in the catalog is now exactly the pipeline job, its old rows and parts gone
    assert per_job_counts(nights["db"], ["job-1"]) == per_job_counts(nights["serial2"], ["job-1"])
    assert ledger_rows(nights["db"], ["job-1"]) == ledger_rows(nights["serial2"], ["job-1"])
    con = duckdb.connect(str(nights["db"]), read_only=True)
    assert con.execute("SELECT count(*) FROM traces WHERE job = 'job-1' AND path LIKE '%stage-%'").fetchone()[0] == 2
    hist = con.execute("SELECT night, job, status FROM batch_runs WHERE job LIKE 'job-%' ORDER BY ALL").fetchall()
    con.close()
    assert hist == [("n1", "job-0", "ok"), ("n1", "job-1", "ok"), ("n1", "job-2", "ok"), ("n2", "job-1", "ok")]
    assert per_job_counts(nights["db"], ["job-0", "job-2"]) == {
        t: {j: n for j, n in v.items() if j != "job-1"} for t, v in nights["n1_counts"].items()}


def test_manifest_serial_since_and_usage_errors(nights, tmp_path):
    root = nights["root"]
    man = tmp_path / "m.json"
    man.write_text(json.dumps({"jobs": {"from-manifest": [str(p) for p in sorted((root / "job-2").iterdir())],
                                        "missing": [str(root / "nope" / "rank-0.json")]}}))
    db, rep = tmp_path / "c.duckdb", tmp_path / "rep"
    # (and without Dask: every task in this process)
    r = CliRunner().invoke(cli, ["batch", str(root), "--db", str(db), "--reports", str(rep), "--manifest", str(man),
                                 "--scheduler", "serial", "--night", "m1"])
    assert r.exit_code == 4, r.output
    s = json.loads((rep / "summary.json").read_text())
    assert s["jobs"]["processed"] == ["from-manifest"]
    assert [f["job"] for f in s["jobs"]["failed"]] == ["missing"] and "nope/rank-0.json" in s["jobs"]["failed"][0]["error"]
    # same rows as the directory's job-2, under the manifest's name
    c = per_job_counts(db, ["from-manifest"])
    assert {t: v.get("from-manifest") for t, v in c.items()} == {
        t: v.get("job-2") for t, v in nights["n1_counts"].items()}
    # --since in the future: nothing to do, exit 0
    r = CliRunner().invoke(cli, ["batch", str(root), "--db", str(db), "--reports", str(rep), "--since", "2999-01-01",
                                 "--scheduler", "serial", "--night", "m2"])
    assert r.exit_code == 0, r.output
    assert json.loads((rep / "summary.json").read_text())["counts"]["jobs"] == 0
    for bad in (["--since", "yesterday"], ["--manifest", str(tmp_path / "absent.json")]):
        r = CliRunner().invoke(cli, ["batch", str(root), "--db", str(db), "--reports", str(rep)] + bad)
        assert r.exit_code == 2 and "error:" in r.output, r.output
    r = CliRunner().invoke(cli, ["batch", str(tmp_path / "no-root"), "--db", str(db), "--reports", str(rep)])
    assert r.exit_code == 2 and "no such directory" in r.output
    r = CliRunner().invoke(cli, ["batch", str(root), "--db", str(db), "--reports", str(rep), "--workers", "0"])
    assert r.exit_code == 2 and "--workers" in r.output


def test_reports_and_catalog_inside_root_are_not_jobs(tmp_path):
    root = tmp_path / "drop"
    make_dp_job(root / "only-job", seed=3)
    r = CliRunner().invoke(cli, ["batch", str(root), "--db", str(root / "store" / "c.duckdb"), "--reports",
                                 str(root / "www"), "--scheduler", "serial", "--night", "a"])
    assert r.exit_code == 0, r.output
    # the second night sees index.html / summary.json / the catalog under ROOT and still only one job
    r = CliRunner().invoke(cli, ["batch", str(root), "--db", str(root / "store" / "c.duckdb"), "--reports",
                                 str(root / "www"), "--scheduler", "serial", "--night", "b"])
    assert r.exit_code == 0, r.output
    s = json.loads((root / "www" / "summary.json").read_text())
    assert s["counts"] == {"jobs": 1, "processed": 0, "skipped": 1, "failed": 0}
