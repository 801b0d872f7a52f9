"""nccl-tests result tables: the real interleaved log, generated healthy/degraded runs, bad input."""
import re

import pytest

from ninefold.ingest import nccl_tests
from ninefold.ingest.load import ingest_paths
from ninefold.ingest.registry import head_bytes, loader_for
from ninefold.store.errors import IngestConflict, TraceFormatError
from tests.conftest import SHARED_TRACES, needs_shared

TIMEZ = SHARED_TRACES / "nccl_logs_repo" / "Timez-zx_nccl-tests" / "nccl.log"
HEADER = ("#                                                              out-of-place                       in-place\n"
          "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
          "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n")


def _independent_rows(text):
    """Rows rebuilt without the loader from the file's own layout: each row's head ("size count type redop root")
    starts a line and runs into an NCCL prefix ("-1mew0:..."); its two halves ("time algbw busbw #wrong") start
    later lines, the first also followed by an NCCL prefix."""
    fixed = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)mew0:", text, re.M)
    halves = re.findall(r"^\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+)(?:mew0:.*)?$", text, re.M)
    assert len(halves) == 2 * len(fixed)
    return [(int(s), int(c), t, r, int(ro), *map(float, halves[2 * i][:3]), *map(float, halves[2 * i + 1][:3]))
            for i, (s, c, t, r, ro) in enumerate(fixed)]


@needs_shared
def test_timez_table_is_reassembled_from_interleaved_fragments(db):
    text = TIMEZ.read_text()
    res = nccl_tests.load(db, TIMEZ, "t")
    assert [r.status for r in res] == ["stored", "stored"]      # the table and the NCCL lines of the file
    exp = _independent_rows(text)
    assert len(exp) == 11
    got = db.execute("""SELECT o.size_bytes, o.count, o.dtype, o.redop, o.root, o.time_us, o.algbw_gbs, o.busbw_gbs,
                               i.time_us, i.algbw_gbs, i.busbw_gbs
                        FROM nccl_tests_results o JOIN nccl_tests_results i USING (job, path, block, size_bytes)
                        WHERE o.placement = 'out' AND i.placement = 'in' ORDER BY o.size_bytes""").fetchall()
    assert got == exp
    avg = float(re.search(r"# Avg bus bandwidth\s*:\s*(\S+)", text).group(1))
    run = db.execute("SELECT test, op, nranks, n_gpus, min_bytes, max_bytes, iters, avg_busbw_gbs, out_of_bounds "
                     "FROM nccl_tests_runs").fetchone()
    assert run == ("all_reduce_perf", "AllReduce", 2, 2, 8388608, 8589934592, 20, avg, 0)
    # nccl-tests' average is the mean busbw over both placements of every row
    assert db.execute("SELECT avg(busbw_gbs) FROM nccl_tests_results").fetchone()[0] == pytest.approx(avg, abs=5e-3)
    assert db.execute("SELECT count(*) FROM nccl_colls").fetchone()[0] == 990
    assert nccl_tests.load(db, TIMEZ, "t").status == "unchanged"
    assert db.execute("SELECT count(*) FROM nccl_tests_results").fetchone()[0] == 22


@needs_shared
def test_registry_routes_the_timez_log_to_nccl_tests(db):
    assert loader_for(TIMEZ).name == "nccl_tests"
    res = ingest_paths(db, [TIMEZ], job="t")
    assert [r.status for r in res] == ["stored", "stored"]
    assert db.execute("SELECT count(*) FROM nccl_log_files").fetchone()[0] == 1


def _table(op, n, alpha_us, beta_gbs, sizes, factor, dtype="float", wrong="0"):
    """nccl-tests text for t(S) = alpha + S/beta, busbw = algbw * factor, as src/common.cu prints it."""
    rows = []
    for s in sizes:
        t = alpha_us + s / (beta_gbs * 1e3)
        cells = []
        for tt in (t, t * 1.01):
            a = s / 1e3 / tt
            cells.append(f"  {tt:7.2f}  {a:6.2f}  {a * factor:6.2f}  {wrong:>6s}")
        rows.append(f"  {s:12d}  {s // 4:12d}  {dtype:>8s}  {'sum':>6s}  {-1:6d}" + "".join(cells))
    body = "\n".join(rows)
    ranks = "".join(f"#  Rank {r:2d} Group  0 Pid  {100 + r:5d} on   node{r // 8} device {r % 8:2d} [0x{r:02x}] "
                    f"NVIDIA H100\n" for r in range(n))
    test = {"AllReduce": "all_reduce_perf", "AllGather": "all_gather_perf"}[op]
    return (f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: 2(factor) warmup iters: 5 iters: 20 "
            f"agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n{ranks}#\n{HEADER}{body}\n"
            f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.0 \n#\n# Collective test concluded: {test}\n#\n")


SIZES = [1 << k for k in range(20, 31)]


def test_healthy_vs_degraded_calibration(db, tmp_path):
    f = 2 * 7 / 8
    healthy = tmp_path / "healthy.log"
    healthy.write_text(_table("AllReduce", 8, 25.0, 178.0, SIZES, f))
    degraded = tmp_path / "degraded.log"
    degraded.write_text(_table("AllReduce", 8, 60.0, 28.0, SIZES, f))
    for p, j in ((healthy, "h"), (degraded, "d")):
        r = nccl_tests.load(db, p, j)
        assert r.status == "stored" and r.counts["nccl_tests_rows"] == len(SIZES)
    fits = {j: nccl_tests.fit_alpha_beta(db, j)[0] for j in ("h", "d")}
    assert fits["h"]["beta_alg_gbs"] == pytest.approx(178.0, rel=0.01)
    assert fits["d"]["beta_alg_gbs"] == pytest.approx(28.0, rel=0.01)
    assert fits["h"]["alpha_us"] == pytest.approx(25.0, abs=2.0)
    assert fits["h"]["nranks"] == 8
    top = db.execute("""SELECT job, max(busbw_gbs) FROM nccl_tests_results WHERE placement = 'out'
                        GROUP BY job ORDER BY job""").fetchall()
    assert top[0][0] == "d" and top[0][1] < top[1][1] / 5


def test_two_tables_scientific_notation_and_na(db, tmp_path):
    t1 = _table("AllReduce", 2, 10.0, 100.0, SIZES[:3], 1.0)
    t2 = _table("AllGather", 2, 10.0, 100.0, SIZES[:2], 0.5, wrong="N/A")   # run with -c 0
    # a time too wide for its column prints as %.1e
    t2 = re.sub(r"(\n\s+%d\s+\d+\s+float\s+sum\s+-1\s+)(\S+)" % SIZES[1], lambda m: m.group(1) + "1.2e+05", t2)
    p = tmp_path / "two.txt"
    p.write_text("# Collective test starting: all_reduce_perf\n" + t1 + "# Collective test starting: all_gather_perf\n" + t2)
    nccl_tests.load(db, p, "x")
    runs = db.execute("SELECT block, test, op, n_rows FROM nccl_tests_runs ORDER BY block").fetchall()
    assert runs == [(0, "all_reduce_perf", "AllReduce", 3), (1, "all_gather_perf", "AllGather", 2)]
    assert db.execute("SELECT time_us FROM nccl_tests_results WHERE block = 1 AND placement = 'out' AND size_bytes = ?",
                      [SIZES[1]]).fetchone()[0] == 1.2e5
    assert db.execute("SELECT count(*) FILTER (wrong IS NULL), count(*) FROM nccl_tests_results WHERE block = 1"
                      ).fetchone() == (4, 4)


def test_truncated_table_keeps_complete_rows_and_reports_the_rest(db, tmp_path):
    text = _table("AllReduce", 2, 10.0, 100.0, SIZES, 1.0)
    cut_at = text.index(f"{SIZES[6]:12d}") + 30      # in the middle of the 7th row
    p = tmp_path / "cut.log"
    p.write_text(text[:cut_at])
    nccl_tests.load(db, p, "c")
    assert db.execute("SELECT n_rows, avg_busbw_gbs FROM nccl_tests_runs").fetchone() == (6, None)
    codes = dict(db.execute("SELECT code, count FROM diagnostics WHERE source = 'nccl_tests'").fetchall())
    assert codes == {"unparsed_table_text": 1, "no_avg_busbw": 1}


@needs_shared
def test_wrong_inputs_fail_with_one_line_and_store_nothing(db, tmp_path):
    k = SHARED_TRACES / "hta" / "call_stack" / "backward_thread.json"
    assert not nccl_tests.sniff(k, head_bytes(k))
    for bad, why in ((k, "no nccl-tests result table"),
                     (SHARED_TRACES / "nccl_logs" / "nccl_issue584_p2p_send_recv_hang_COLL.log", "no nccl-tests result table")):
        with pytest.raises(TraceFormatError) as ei:
            nccl_tests.load(db, bad, "w")
        assert why in str(ei.value) and str(bad) in str(ei.value) and "\n" not in str(ei.value)
    bin_ = tmp_path / "bin.log"
    bin_.write_bytes(HEADER.encode() + bytes(range(256)) * 4)
    with pytest.raises(TraceFormatError, match="binary data"):
        nccl_tests.load(db, bin_, "w")
    for t in ("nccl_tests_runs", "nccl_tests_results", "nccl_colls", "nccl_log_files", "diagnostics"):
        assert db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 0, t


def test_changed_file_needs_replace(db, tmp_path):
    p = tmp_path / "run.log"
    p.write_text(_table("AllReduce", 2, 10.0, 100.0, SIZES[:4], 1.0))
    nccl_tests.load(db, p, "r")
    p.write_text(_table("AllReduce", 2, 10.0, 100.0, SIZES[:5], 1.0))
    with pytest.raises(IngestConflict):
        nccl_tests.load(db, p, "r")
    assert db.execute("SELECT count(*) FROM nccl_tests_results").fetchone()[0] == 8
    nccl_tests.load(db, p, "r", replace=True)
    assert db.execute("SELECT count(*) FROM nccl_tests_results").fetchone()[0] == 10
