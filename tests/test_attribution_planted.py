"""Planted ground truth from the sample generator: each ledger finds exactly what was planted."""
import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.ingest.load import ingest_paths
from sample_traces.generate import generate
from sample_traces.pipeline import generate_1f1b
from ninefold.store.connection import connect


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("job")
    gt = generate(d / "dp", ranks=4, steps=4, seed=3)
    con = connect(d / "j.duckdb")
    res = ingest_paths(con, sorted((d / "dp").glob("rank-*.json")), job="dp")
    assert all(r.status == "stored" for r in res)
    attribute_job(con, "dp")
    yield con, gt
    con.close()


def charged(con, rank, ledger, a, b):
    return con.execute("""SELECT coalesce(sum(greatest(0, least(end_ns, ?) - greatest(start_ns, ?))), 0)
        FROM ledger_intervals WHERE job = 'dp' AND rank = ? AND ledger = ?""", [b, a, rank, ledger]).fetchone()[0]


def total(con, rank, step, ledger):
    return con.execute("SELECT ns FROM ledger_totals WHERE job = 'dp' AND rank = ? AND step = ? AND ledger = ?",
                       [rank, step, ledger]).fetchone()[0]


def test_a_straggler_wait_charged_to_the_others(job):
    con, gt = job
    s = gt["straggler"]
    coll = next(c for c in gt["collectives"] if c["step"] == s["step"])
    for r in range(gt["world_size"]):
        got = total(con, r, s["step"], "straggler")
        assert abs(got - coll["wait_ns"][r]) <= 1000, (r, got, coll["wait_ns"][r])
        if r == s["rank"]:
            assert got == 0
        else:
            assert got >= s["delay_ns"]
    resid = con.execute("SELECT max(residual_ns) FROM clock_offsets WHERE job = 'dp'").fetchone()[0]
    assert resid <= 1000


def test_planted_clock_offsets_recovered_to_the_nanosecond(tmp_path):
    # epoch-scale timestamps (~1.7e18 ns) are beyond float64's exact range (256 ns steps): the medians
    # behind the offsets must be taken in integers relative to the job, or the offsets come out rounded
    gt = generate(tmp_path / "dp8", ranks=8, steps=3, seed=5)
    con = connect(tmp_path / "o.duckdb")
    ingest_paths(con, [tmp_path / "dp8"], job="dp8")
    attribute_job(con, "dp8")
    got = dict(con.execute("SELECT rank, offset_ns FROM clock_offsets WHERE job = 'dp8'").fetchall())
    planted = {r["rank"]: r["clock_offset_ns"] for r in gt["ranks"]}
    for r, off in planted.items():
        assert abs(got[r] - (off - planted[0])) <= 1, (r, got[r], off - planted[0])


def _rewritten_job(tmp_path, edit):
    """The fixture's job generated again (the generator is seeded), each event passed through EDIT (return
    False to drop it), ingested into a database of its own."""
    import json

    generate(tmp_path / "orig", ranks=4, steps=4, seed=3)
    d = tmp_path / "edited"
    d.mkdir()
    for f in sorted((tmp_path / "orig").glob("rank-*.json")):
        doc = json.loads(f.read_text())
        doc["traceEvents"] = [ev for ev in doc["traceEvents"] if edit(ev) is not False]
        (d / f.name).write_text(json.dumps(doc))
    db = tmp_path / "edited.duckdb"
    con = connect(db)
    assert all(r.status == "stored" for r in ingest_paths(con, sorted(d.glob("rank-*.json")), job="dp"))
    return con, db


COLL_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name",
             "Process Group Description", "Process Group Ranks", "Rank", "Seq")


@pytest.mark.parametrize("strip", ["seq", "all"])
def test_collectives_without_sequence_numbers_match_by_order(job, tmp_path, strip):
    # older traces: no Seq (match by order within process group and collective type), or no collective
    # metadata at all (no record_param_comms, bare NCCL kernels typed by name): same waits as with Seq
    con, gt = job

    def edit(ev):
        if strip == "all" and ev.get("name") == "record_param_comms":
            return False
        a = ev.get("args")
        if isinstance(a, dict):
            for k in (("Seq",) if strip == "seq" else COLL_ARGS):
                a.pop(k, None)

    c2, _ = _rewritten_job(tmp_path, edit)
    if strip == "all":
        assert c2.execute("SELECT count(*) FROM collectives WHERE source = 'kernel'").fetchone()[0] == 0
    else:
        assert c2.execute("SELECT count(*) FROM collectives WHERE seq IS NOT NULL").fetchone()[0] == 0
    attribute_job(c2, "dp")
    q = "SELECT rank, step, ledger, ns FROM ledger_totals WHERE job = 'dp' ORDER BY ALL"
    assert c2.execute(q).fetchall() == con.execute(q).fetchall()
    q = "SELECT rank, offset_ns FROM clock_offsets WHERE job = 'dp' ORDER BY rank"
    assert c2.execute(q).fetchall() == con.execute(q).fetchall()
    assert c2.execute("SELECT count(*) FROM diagnostics WHERE code = 'unmatched_comm'").fetchone()[0] == 0
    s = gt["straggler"]
    assert sum(n for (n,) in c2.execute("SELECT ns FROM ledger_totals WHERE ledger = 'straggler' AND rank <> ? "
                                         "AND step = ?", [s["rank"], s["step"]]).fetchall()) > 0
    c2.close()


def test_b_pipeline_bubble_fraction(tmp_path):
    generate_1f1b(tmp_path / "pp", stages=4, microbatches=8, seed=1)
    con = connect(tmp_path / "pp.duckdb")
    res = ingest_paths(con, sorted((tmp_path / "pp").glob("stage-*.json")), job="pp")
    assert all(r.status == "stored" for r in res), res
    attribute_job(con, "pp")
    p, m = 4, 8
    want = (p - 1) / (m + p - 1)
    # Stage 0's window spans the whole schedule (first forward to last backward). Later stages' windows end at
    # their own last GPU activity, so in a one-step trace their tail wait falls outside any window.
    tot = dict(con.execute("SELECT ledger, sum(ns) FROM ledger_totals WHERE job = 'pp' AND rank = 0 "
                           "GROUP BY ledger").fetchall())
    frac = tot["bubble"] / sum(tot.values())
    assert abs(frac - want) <= 0.02, (frac, want, tot)
    assert tot["idle"] == 0 and tot["host"] == 0
    for st in range(1, p):  # every stage waits on its neighbours somewhere
        b = con.execute("SELECT sum(ns) FROM ledger_totals WHERE job = 'pp' AND rank = ? AND ledger = 'bubble'",
                        [st]).fetchone()[0]
        assert b > 0


def test_c_host_launch_gap(job):
    con, gt = job
    for rk in gt["ranks"]:
        for st in rk["steps"]:
            g = st["host_launch_gap"]
            assert charged(con, rk["rank"], "host", g["start_abs_ns"], g["end_abs_ns"]) == g["ns"] == 300_000


def test_d_dataloader_wait_is_io(job):
    con, gt = job
    for rk in gt["ranks"]:
        for st in rk["steps"][1:]:  # the first step's loader runs before any window opens
            dl = st["dataloader"]
            a = dl["start_abs_ns"]
            assert charged(con, rk["rank"], "io", a, a + dl["ns"]) == dl["ns"]


def test_e_recompute(job):
    con, gt = job
    for rk in gt["ranks"]:
        for st in rk["steps"]:
            assert total(con, rk["rank"], st["step"], "recompute") == st["recompute_kernel_ns"]


def test_f_offload_copy_is_memcpy(job):
    con, gt = job
    for rk in gt["ranks"]:
        for st in rk["steps"]:
            c = st["memcpy_dtoh"]
            assert charged(con, rk["rank"], "memcpy", c["start_abs_ns"], c["end_abs_ns"]) == c["ns"]


def test_ledgers_csv_cli(job, tmp_path):
    import subprocess
    import sys

    con, gt = job
    path = str(tmp_path / "copy.duckdb")
    con.execute(f"ATTACH '{path}' AS cp")
    con.execute("CREATE TABLE cp.ledger_totals AS SELECT * FROM ledger_totals")
    con.execute("DETACH cp")
    con.execute("CHECKPOINT")
    r = subprocess.run([sys.executable, "-m", "ninefold.cli.main", "ledgers", "--db", path, "--job", "dp", "--format", "csv"],
                       capture_output=True, text=True)
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "rank,step,ledger,ns"
    assert len(lines) == 1 + 4 * 4 * 9


def test_intervals_carry_drill_down_keys(job):
    """Straggler time names the collective (process group, sequence) it waited in; compute names its kernel;
    a host or io gap names the op that ended it."""
    con, gt = job
    s = gt["straggler"]
    coll = next(c for c in gt["collectives"] if c["step"] == s["step"])
    for r in range(gt["world_size"]):
        if r == s["rank"]:
            continue
        keys = con.execute("""SELECT DISTINCT pg_name, seq, op_name FROM ledger_intervals
            WHERE job = 'dp' AND rank = ? AND step = ? AND ledger = 'straggler'""", [r, s["step"]]).fetchall()
        assert keys == [(coll["process_group"], coll["seq"], coll["kernel_name"])], (r, keys)
    # every interval but an idle tail has an op; compute intervals name a non-communication kernel
    missing = con.execute("""SELECT count(*) FROM ledger_intervals WHERE job = 'dp' AND op_name IS NULL
                             AND ledger <> 'idle'""").fetchone()[0]
    assert missing == 0
    comm_named = con.execute("""SELECT count(*) FROM ledger_intervals WHERE job = 'dp' AND ledger = 'compute'
                                AND op_name LIKE 'nccl%'""").fetchone()[0]
    assert comm_named == 0
    # per (rank, step), intervals still tile the window exactly
    bad = con.execute("""SELECT count(*) FROM (
        SELECT rank, step, sum(end_ns - start_ns) AS n FROM ledger_intervals WHERE job = 'dp' GROUP BY ALL) i
        JOIN step_windows w USING (rank, step) WHERE w.job = 'dp' AND n <> w.end_ns - w.start_ns""").fetchone()[0]
    assert bad == 0


def test_user_patterns_mark_recompute_and_io_regions(job, tmp_path):
    # the same job with its checkpoint and dataloader annotations renamed: the built-in rules no longer see
    # them; --recompute-pattern / --io-pattern bring the planted ledgers back exactly
    import subprocess
    import sys

    con, gt = job
    rename = {"CheckpointFunctionBackward": "my_recompute_region",
              "autograd::engine::evaluate_function: CheckpointFunctionBackward": "my_recompute_wrapper",
              "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__": "fetch_batch_from_store"}

    def edit(ev):
        if ev.get("name") in rename:
            ev["name"] = rename[ev["name"]]

    c2, db = _rewritten_job(tmp_path, edit)
    attribute_job(c2, "dp")
    q = "SELECT coalesce(sum(ns), 0) FROM ledger_totals WHERE job = 'dp' AND ledger = ?"
    assert c2.execute(q, ["recompute"]).fetchone()[0] == 0 and c2.execute(q, ["io"]).fetchone()[0] == 0
    c2.close()
    cmd = [sys.executable, "-m", "ninefold.cli.main", "attribute", "--db", str(db), "--job", "dp"]
    r = subprocess.run(cmd + ["--recompute-pattern", "^my_recompute", "--io-pattern", "^fetch_batch"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    c2 = connect(db)
    totals = "SELECT rank, step, ledger, ns FROM ledger_totals WHERE job = 'dp' ORDER BY ALL"
    assert c2.execute(totals).fetchall() == con.execute(totals).fetchall()
    c2.close()
    bad = subprocess.run(cmd + ["--io-pattern", "(unclosed"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--io-pattern" in bad.stderr and "not a regular expression" in bad.stderr


def test_drilldown_view_carries_the_ledgers_keys(job, tmp_path):
    # LEDGERS drill-down keys on every charged interval: kernel class, collective type, process group axis,
    # message bytes, copy direction
    con, gt = job
    rows = con.execute("""SELECT ledger, kclass, coll, axis, copy_kind, bytes FROM ledger_drilldown
                          WHERE job = 'dp'""").fetchall()
    assert len(rows) == con.execute("SELECT count(*) FROM ledger_intervals WHERE job = 'dp'").fetchone()[0]
    strag = [r for r in rows if r[0] == "straggler"]
    assert strag and all(r[1] == "allreduce" and r[2] == "allreduce" and r[3] == "dp" and r[5] > 0 for r in strag)
    assert {r[1] for r in rows if r[0] == "compute"} >= {"gemm", "elementwise"}
    assert "DtoH" in {r[4] for r in rows if r[0] == "memcpy"}     # the planted offload copy
    assert con.execute("SELECT axis FROM pg_axes WHERE job = 'dp'").fetchall() == [("dp",)]
    assert con.execute("""SELECT DISTINCT k.family FROM kernel_classes k JOIN gpu_ops g ON g.job = k.job
                          AND g.name = k.name WHERE k.job = 'dp' AND g.kind IN ('memcpy', 'memset')""").fetchall() == [
        ("copy",)]
    gen = generate_1f1b(tmp_path / "pp", stages=4, microbatches=8, seed=1)
    c2 = connect(tmp_path / "pp.duckdb")
    ingest_paths(c2, [tmp_path / "pp"], job="pp")
    attribute_job(c2, "pp")
    bub = c2.execute("SELECT DISTINCT coll, axis FROM ledger_drilldown WHERE ledger = 'bubble' AND coll IS NOT NULL"
                     ).fetchall()
    assert bub and {a for _, a in bub} == {"pp"} and {c for c, _ in bub} <= {"send", "recv"}
    assert len(c2.execute("SELECT * FROM pg_axes").fetchall()) == gen["stages"] - 1
    c2.close()


def test_breakdown_cli(job, tmp_path):
    import json
    import subprocess
    import sys

    con, gt = job
    path = str(tmp_path / "copy.duckdb")
    con.execute(f"ATTACH '{path}' AS cp")
    for t in ("jobs", "ledger_totals", "ledger_intervals", "kernel_classes", "pg_axes", "collectives", "step_windows"):
        con.execute(f"CREATE TABLE cp.{t} AS SELECT * FROM {t}")
    con.execute("DETACH cp")
    r = subprocess.run([sys.executable, "-m", "ninefold.cli.main", "breakdown", "--db", path, "--job", "dp", "--top", "100",
                        "--format", "json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert abs(sum(d["share"] for d in rows) - 1) < 1e-9
    strag = [d for d in rows if d["ledger"] == "straggler"]
    assert [d["key"] for d in strag] == ["allreduce (dp)"]
    n = con.execute("SELECT count(*) FROM step_windows WHERE job = 'dp'").fetchone()[0]
    want = con.execute("SELECT sum(ns) FROM ledger_totals WHERE job = 'dp' AND ledger = 'straggler'").fetchone()[0]
    assert abs(strag[0]["ns_per_rank_step"] - want / n) <= 1
    r = subprocess.run([sys.executable, "-m", "ninefold.cli.main", "breakdown", "--db", path, "--job", "nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and f"error: job 'nope' is not in the store {path} (jobs: " in r.stderr
