"""Defects found under bad input and hostile use, each pinned: out-of-range ranks, lone surrogates, control and
bidi characters in names, negative timestamps, and `attribute` killed mid-way."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from ingest.load import ingest_paths
from sample_traces.alltoall2023 import generate_a2a


@pytest.fixture
def two_ranks(tmp_path):
    generate_a2a(tmp_path / "j", ranks=2, steps=1, seed=0)
    return tmp_path / "j"


def _edit(path, fn):
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("rank, world, why", [
    (2147483648, 8, "rank 2147483648 is out of range"), (2**63, 8, "out of range"), (10**30, 8, "out of range"),
    (-5, 8, "rank -5 is out of range"), (3, 2**40, "world_size 1099511627776 is out of range"),
    (3, 0, "world_size 0 is out of range"), (9, 8, "rank 9 is not below distributedInfo.world_size 8")])
def test_out_of_range_rank_is_one_line_and_stores_nothing(db, two_ranks, rank, world, why):
    assert all(r.status == "stored" for r in ingest_paths(db, [two_ranks / "rank-1.json"], job="j"))
    p = two_ranks / "rank-0.json"
    _edit(p, lambda d: d["distributedInfo"].update(rank=rank, world_size=world))
    (r,) = ingest_paths(db, [p], job="j")
    assert r.status == "failed" and why in r.message and str(p) in r.message and "\n" not in r.message
    assert db.execute("SELECT count(*) FROM traces").fetchone()[0] == 1  # the earlier rank is untouched
    assert db.execute("SELECT count(*) FROM gpu_ops WHERE rank <> 1").fetchone()[0] == 0


def test_negative_rank_option_is_refused(tmp_path, two_ranks):
    p = two_ranks / "rank-0.json"
    _edit(p, lambda d: d.pop("distributedInfo"))
    r = subprocess.run([sys.executable, "-m", "service.cli", "ingest", str(p), "--db", str(tmp_path / "x.duckdb"),
                        "--rank", "-5"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "rank -5 is out of range" in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_lone_surrogate_is_repaired_not_refused_and_odd_names_never_reach_a_page_raw(db, tmp_path, two_ranks):
    evil = "<script>alert(1)</script>\\u0000\\u202e\\udcff"
    for r in (0, 1):
        p = two_ranks / f"rank-{r}.json"
        p.write_text(p.read_text().replace('"name": "sm90_xmma', f'"name": "{evil}sm90_xmma')
                     .replace('"name": "aten::mm"', f'"name": "aten::mm{evil}"'))
    res = ingest_paths(db, sorted(two_ranks.glob("rank-*.json")), job="j")
    assert [r.status for r in res] == ["stored", "stored"], [r.message for r in res]
    names = {n for (n,) in db.execute("SELECT DISTINCT name FROM gpu_ops WHERE name LIKE '%sm90_xmma%'").fetchall()}
    assert names and all(n.startswith("<script>alert(1)</script>\x00\u202e\ufffdsm90_xmma") for n in names)
    d = dict(db.execute("SELECT rank, count FROM diagnostics WHERE code = 'repaired_surrogates'").fetchall())
    assert d and all(v > 0 for v in d.values())
    from analysis.attribution import attribute_job
    from dashboards.report import write_report

    attribute_job(db, "j")
    db.close()
    out = tmp_path / "r.html"
    write_report(tmp_path / "t.duckdb", "j", out)
    html = out.read_text(encoding="utf-8")
    assert "\x00" not in html and "\u202e" not in html and "<script>alert(1)" not in html
    from dashboards.style import esc, html_table

    cell = html_table(["k"], [[names.pop()]])
    assert "\\u0000" in cell and "\\u202e" in cell and "&lt;script&gt;" in cell and "\x00" not in cell
    assert esc("a\u2066b\x9bc") == "a\\u2066b\\u009bc"


def test_negative_ts_gets_a_diagnostic(db, two_ranks):
    p = two_ranks / "rank-0.json"

    def shift(d):
        d["baseTimeNanoseconds"] += 10**12
        for e in d["traceEvents"]:
            if "ts" in e and e.get("ph") == "X":
                e["ts"] = round(e["ts"] - 10**9, 3)
    _edit(p, shift)
    (r,) = ingest_paths(db, [p], job="j")
    assert r.status == "stored"
    n = db.execute("SELECT count FROM diagnostics WHERE code = 'negative_ts'").fetchone()
    assert n is not None and n[0] > 0


def _big_job(path, ranks=16, per=40_000):
    from store.connection import connect

    con = connect(path)
    con.execute(f"""INSERT INTO traces (job, rank, path, sha256, format, world_size)
        SELECT 'b', r, 'p' || r, 's' || r, 'kineto', {ranks} FROM range({ranks}) t(r)""")
    con.execute(f"""INSERT INTO gpu_ops (job, rank, device, stream, kind, name, start_ns, end_ns, correlation)
        SELECT 'b', r, 0, 7 + (i % 2), 'kernel', CASE i % 3 WHEN 0 THEN 'sm90_xmma_gemm' WHEN 1 THEN
               'ncclDevKernel_AllReduce_Sum_bf16_RING_LL' ELSE 'vectorized_elementwise' END,
               i * 10000 + (hash(i, r) % 3000), i * 10000 + (hash(i, r) % 3000) + 4000 + (hash(r, i) % 9000),
               r * {per} + i
        FROM range({ranks}) a(r), range({per}) b(i)""")
    con.execute("""INSERT INTO host_ops (job, rank, pid, tid, cat, name, start_ns, end_ns, correlation)
        SELECT 'b', rank, '1', '1', 'cuda_runtime', 'cudaLaunchKernel', start_ns - 5000, start_ns - 4000, correlation
        FROM gpu_ops""")
    con.execute(f"""INSERT INTO collectives (job, rank, pg_name, seq, coll, group_size, start_ns, end_ns, source,
                                            kernel_name)
        SELECT job, rank, '0', (correlation - rank * {per}) // 3, 'allreduce', {ranks}, start_ns, end_ns, 'kernel',
               name FROM gpu_ops WHERE name LIKE 'nccl%'""")
    con.execute(f"""INSERT INTO steps SELECT 'b', r, s, s * {per // 10} * 10000, (s + 1) * {per // 10} * 10000
        FROM range({ranks}) a(r), range(10) b(s)""")
    con.close()


def _state(path):
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        have = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        n = {t: (con.execute(f"SELECT count(*) FROM {t} WHERE job = 'b'").fetchone()[0] if t in have else 0)
             for t in ("step_windows", "ledger_totals", "ledger_intervals", "clock_offsets", "collective_matches")}
        sums = None
        if n["step_windows"]:
            sums = con.execute("""SELECT (SELECT sum(end_ns - start_ns) FROM step_windows WHERE job = 'b'),
                                         (SELECT sum(ns) FROM ledger_totals WHERE job = 'b'),
                                         (SELECT sum(end_ns - start_ns) FROM ledger_intervals WHERE job = 'b')""").fetchone()
        return n, sums
    finally:
        con.close()


def test_attribute_killed_at_any_point_leaves_the_old_results_or_the_new(tmp_path):
    db = tmp_path / "k.duckdb"
    _big_job(db)
    cmd = [sys.executable, "-m", "service.cli", "attribute", "--db", str(db), "--job", "b"]
    t = time.monotonic()
    full = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    took = time.monotonic() - t
    assert full.returncode == 0, full.stderr
    done, sums = _state(db)
    assert all(done.values()) and sums[0] == sums[1] == sums[2]
    for first_run in (True, False):
        for frac in (0.35, 0.55, 0.7, 0.8, 0.9, 0.97):
            if first_run:  # a store never attributed: after the kill it has no results at all, or all of them
                import duckdb
                c = duckdb.connect(str(db))
                for tb in done:
                    c.execute(f"DELETE FROM {tb} WHERE job = 'b'")
                c.close()
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(took * frac)
            p.send_signal(signal.SIGKILL)
            p.wait()
            n, s = _state(db)
            if first_run and not any(n.values()):
                continue
            assert n == done, (first_run, frac, n)  # every table whole, never a mix
            assert s == sums
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
