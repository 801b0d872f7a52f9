"""Nsight Systems SQLite exports: every shared export ingests with exact counts and times, attribution runs
on them, bad files fail in one line with nothing stored, and re-ingesting is a no-op."""
import os
import re
import shutil
import sqlite3

import pytest
from click.testing import CliRunner

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.classify import classify_kernel
from ninefold.analysis.intervals import union
from conftest import SHARED_TRACES, needs_shared
from ninefold.ingest.load import ingest_paths
from ninefold.ingest.nsys import load
from ninefold.ingest.registry import loader_for
from ninefold.store.errors import IngestConflict, TraceFormatError

NSYS_DIRS = ["pipit_nsys", "nsys_misc"]
EXPORTS = sorted(p.relative_to(SHARED_TRACES).as_posix() for d in NSYS_DIRS if (SHARED_TRACES / d).is_dir()
                 for p in (SHARED_TRACES / d).rglob("*.sqlite")) if SHARED_TRACES.is_dir() else []
TEMPLATE = "nsys_misc/fuser/report1.sqlite"
SAXPY = "pipit_nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite"


def _raw(path):
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


def _tables(raw):
    return {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _expected_counts(path):
    """{globalPid: (kernels, memcpys, memsets)} straight from the file."""
    raw = _raw(path)
    have = _tables(raw)
    out = {}
    for i, t in enumerate(("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")):
        if t not in have:
            continue
        for g, n in raw.execute(f"SELECT globalPid, count(*) FROM {t} GROUP BY globalPid"):
            out.setdefault(g, [0, 0, 0])[i] = n
    raw.close()
    return {g: tuple(v) for g, v in out.items()}


def _rank_of_gpid(db, job):
    """globalPid → rank, from the diagnostic the loader writes for every rank."""
    rows = db.execute("SELECT rank, example FROM diagnostics WHERE job = ? AND code LIKE 'rank_%'", [job]).fetchall()
    return {int(re.search(r"globalPid (\d+)", ex).group(1)): r for r, ex in rows}


def _snapshot(db):
    return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("jobs", "traces", "gpu_ops", "host_ops", "steps", "collectives", "diagnostics")}


# ------------------------------------------------------------------------------------------ real exports

@needs_shared
def test_the_corpus_has_exports_of_several_schema_versions():
    versions = set()
    for rel in EXPORTS:
        raw = _raw(SHARED_TRACES / rel)
        t = "META_DATA_EXPORT" if "META_DATA_EXPORT" in _tables(raw) else "EXPORT_META_DATA"
        versions.add(raw.execute(f"SELECT value FROM {t} WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()[0])
    assert {"2.9.1", "3.13.2", "3.17.1"} <= versions


# the depth rule of NVTX ranges as the SQL window over a thread's start (+1) and end (-1) points
NVTX_WINDOW_DEPTH = """
    WITH h AS (SELECT rank, pid, tid, start_ns, end_ns FROM host_ops WHERE job = 'j' AND cat = 'user_annotation'),
    pts AS (SELECT rank, pid, tid, start_ns AS t, 1 AS d, end_ns AS e, start_ns AS s0 FROM h
            UNION ALL SELECT rank, pid, tid, end_ns, -1, end_ns, NULL FROM h)
    SELECT rank, pid, tid, s0, e, depth FROM (
        SELECT *, sum(d) OVER (PARTITION BY rank, pid, tid ORDER BY t, d, e DESC ROWS UNBOUNDED PRECEDING) - 1
               AS depth FROM pts) WHERE d = 1
    ORDER BY ALL"""


@needs_shared
@pytest.mark.parametrize("rel", EXPORTS)
def test_shared_export_nvtx_depths_follow_the_window_rule(db, rel):
    load(db, SHARED_TRACES / rel, "j")
    have = db.execute("SELECT rank, pid, tid, start_ns, end_ns, depth FROM host_ops WHERE job = 'j' "
                      "AND cat = 'user_annotation' ORDER BY ALL").fetchall()
    assert have == db.execute(NVTX_WINDOW_DEPTH).fetchall()


@needs_shared
@pytest.mark.parametrize("rel", EXPORTS)
def test_shared_export_counts_and_times_are_exact(db, rel):
    path = SHARED_TRACES / rel
    res = load(db, path, "j")
    expected = _expected_counts(path)
    assert len(res) == len(expected) and all(r.status == "stored" for r in res)
    ranks = _rank_of_gpid(db, "j")
    assert set(ranks) == set(expected)
    for gpid, (k, m, s) in expected.items():
        got = db.execute("""SELECT count(*) FILTER (kind = 'kernel'), count(*) FILTER (kind = 'memcpy'),
                            count(*) FILTER (kind = 'memset') FROM gpu_ops WHERE rank = ?""", [ranks[gpid]]).fetchone()
        assert got == (k, m, s)

    raw = _raw(path)
    base = raw.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    meta = "META_DATA_EXPORT" if "META_DATA_EXPORT" in _tables(raw) else "EXPORT_META_DATA"
    version = raw.execute(f"SELECT value FROM {meta} WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()[0]
    assert db.execute("SELECT DISTINCT format, time_mode, base_ns, schema_version FROM traces").fetchall() == [
        ("nsys", "session_start", base, version)]
    # absolute integer ns: raw start/end + the session's UTC start, for the first, a middle and the last kernel
    rows = raw.execute('SELECT start, "end", globalPid, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL '
                       "ORDER BY start").fetchall()
    for s, e, g, c in (rows[0], rows[len(rows) // 2], rows[-1]):
        got = db.execute("SELECT start_ns, end_ns FROM gpu_ops WHERE kind = 'kernel' AND rank = ? AND correlation = ? "
                         "AND start_ns = ?", [ranks[g], c, s + base]).fetchall()
        assert got == [(s + base, e + base)]
    assert db.execute("SELECT typeof(start_ns) FROM gpu_ops LIMIT 1").fetchone()[0] == "BIGINT"

    # copy kinds decoded from the file's own ENUM table (the 2.9.1 export has none: CUPTI numbering)
    if "ENUM_CUDA_MEMCPY_OPER" in _tables(raw):
        names = dict(raw.execute("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER"))
    else:
        names = {1: "CUDA_MEMCPY_KIND_HTOD", 2: "CUDA_MEMCPY_KIND_DTOH", 8: "CUDA_MEMCPY_KIND_DTOD"}
        assert db.execute("SELECT count(*) FROM diagnostics WHERE code = 'enum_table_missing:ENUM_CUDA_MEMCPY_OPER'"
                          ).fetchone()[0] == 1

    def spelled(n):  # CUDA_MEMCPY_KIND_HTOD -> HtoD
        x = n.removeprefix("CUDA_MEMCPY_KIND_")
        return x[0] + "to" + x[-1] if re.fullmatch(r"[A-Z]TO[A-Z]", x) else None

    want = {}
    for ck, n in raw.execute("SELECT copyKind, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"):
        want[spelled(names[ck])] = n
    assert dict(db.execute("SELECT copy_kind, count(*) FROM gpu_ops WHERE kind = 'memcpy' GROUP BY 1").fetchall()) == want

    # CUDA API calls: every runtime/driver row except nsys' backtrace duplicates, with correlation ids
    api = raw.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1) AND "
                      f"(globalTid / {1 << 24}) * {1 << 24} IN ({', '.join(map(str, expected))})").fetchone()[0]
    assert db.execute("SELECT count(*) FROM host_ops WHERE cat IN ('cuda_runtime', 'cuda_driver') "
                      "AND correlation IS NOT NULL").fetchone()[0] == api
    launched = db.execute("""SELECT count(*) FROM gpu_ops g JOIN host_ops h ON h.rank = g.rank
                             AND h.correlation = g.correlation AND h.cat = 'cuda_runtime'
                             WHERE g.kind = 'kernel' AND h.name = 'cudaLaunchKernel'""").fetchone()[0]
    assert launched > 0
    # NVTX ranges → user_annotation, names through StringIds or text
    if "NVTX_EVENTS" in _tables(raw):
        n_rng = raw.execute('SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND "end" IS NOT NULL'
                            ).fetchone()[0]
        assert db.execute("SELECT count(*) FROM host_ops WHERE cat = 'user_annotation'").fetchone()[0] == n_rng
        assert db.execute("SELECT count(*) FROM host_ops WHERE cat = 'user_annotation' AND name = ''"
                          ).fetchone()[0] == 0
    raw.close()


@needs_shared
def test_saxpy_rank_from_nvtx_and_steps_from_its_repeated_range(db):
    load(db, SHARED_TRACES / SAXPY, "j")
    d = db.execute("SELECT rank, code FROM diagnostics WHERE code LIKE 'rank_%'").fetchall()
    assert d == [(0, "rank_from_nvtx")]      # the thread is named "MPI Rank 0"
    steps = db.execute("SELECT step, start_ns, end_ns FROM steps ORDER BY step").fetchall()
    raw = _raw(SHARED_TRACES / SAXPY)
    base = raw.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    saxpy = raw.execute("""SELECT start, "end" FROM NVTX_EVENTS WHERE text = 'saxpy' ORDER BY start""").fetchall()
    assert steps == [(i, s + base, e + base) for i, (s, e) in enumerate(saxpy)]
    assert db.execute("SELECT example FROM diagnostics WHERE code = 'steps_from_repeated_range'").fetchone()[0] \
        .endswith(": saxpy")
    # the MPI ranges carry their NVTX domain
    assert db.execute("SELECT DISTINCT args->>'domain' FROM host_ops WHERE name = 'MPI_Send'").fetchall() == [("MPI",)]


@needs_shared
def test_cloverleaf_rank_from_launch_environment_and_no_steps(db):
    load(db, SHARED_TRACES / "pipit_nsys/perlmutter-cloverleaf-cuda.sqlite", "j")
    assert db.execute("SELECT code, example LIKE '%PMI_RANK%' FROM diagnostics WHERE code LIKE 'rank_%'"
                      ).fetchall() == [("rank_from_env", True)]
    assert db.execute("SELECT count(*) FROM steps").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM diagnostics WHERE code = 'no_steps'").fetchone()[0] == 1
    syncs = db.execute("SELECT DISTINCT name FROM gpu_ops WHERE kind = 'sync'").fetchall()
    raw = _raw(SHARED_TRACES / "pipit_nsys/perlmutter-cloverleaf-cuda.sqlite")
    want = raw.execute("SELECT DISTINCT e.label FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION s "
                       "JOIN ENUM_CUPTI_SYNC_TYPE e ON e.id = s.syncType").fetchall()
    assert sorted(syncs) == sorted(want)


@needs_shared
@pytest.mark.parametrize("rel", [SAXPY, TEMPLATE, "pipit_nsys/perlmutter-cloverleaf-cuda.sqlite"])
def test_attribution_conserves_every_step_window(db, rel):
    load(db, SHARED_TRACES / rel, "j")
    attribute_job(db, "j")
    wins = db.execute("SELECT step, start_ns, end_ns FROM step_windows WHERE job = 'j' ORDER BY step").fetchall()
    n_steps = db.execute("SELECT count(*) FROM steps").fetchone()[0]
    assert len(wins) == max(n_steps, 1) or (n_steps and 0 < len(wins) <= n_steps)
    ops = db.execute("SELECT name, start_ns, end_ns FROM gpu_ops WHERE kind = 'kernel'").fetchall()
    comp = [(s, e) for n, s, e in ops if classify_kernel(n)[0] == "compute"]
    for step, w0, w1 in wins:
        tot = dict(db.execute("SELECT ledger, ns FROM ledger_totals WHERE step = ?", [step]).fetchall())
        assert len(tot) == 9
        assert sum(tot.values()) == w1 - w0
        assert min(tot.values()) >= 0
        us, ue = union([max(s, w0) for s, e in comp], [min(e, w1) for s, e in comp])
        assert tot["compute"] + tot["recompute"] == int((ue - us).clip(min=0).sum())


@needs_shared
def test_reingest_is_a_noop_and_another_file_cannot_take_the_rank(db):
    p = SHARED_TRACES / TEMPLATE
    first = load(db, p, "j")
    before = _snapshot(db)
    again = load(db, p, "j")
    assert [r.status for r in first] == ["stored"] and [r.status for r in again] == ["unchanged"]
    assert _snapshot(db) == before
    with pytest.raises(IngestConflict, match="already has rank 0"):
        load(db, SHARED_TRACES / SAXPY, "j")
    assert _snapshot(db) == before
    r = load(db, SHARED_TRACES / SAXPY, "j", replace=True)
    assert r[0].status == "stored"
    assert db.execute("SELECT count(*) FROM gpu_ops WHERE kind = 'kernel'").fetchone()[0] == 5
    assert db.execute("SELECT count(*) FROM traces").fetchone()[0] == 1


@needs_shared
def test_cli_ingests_an_export_and_explains_a_report(tmp_path):
    from ninefold.cli.main import cli

    rep = SHARED_TRACES / "nsys_misc/fuser/report2.nsys-rep"
    out = CliRunner().invoke(cli, ["ingest", str(SHARED_TRACES / TEMPLATE), str(rep), "--db", str(tmp_path / "x.duckdb")])
    lines = out.output.splitlines()
    assert any(ln.startswith("STORED") and "kernels=18 memcpy=3 memset=3" in ln for ln in lines)
    fail = [ln for ln in lines if ln.startswith("FAILED")]
    assert fail == [f"FAILED  {rep}: an Nsight Systems report is binary; export it first with: "
                    f"nsys export --type sqlite --output {rep.with_suffix('.sqlite')} {rep}"]
    assert out.exit_code == 1


# ------------------------------------------------------------------------------------------ bad files

@needs_shared
@pytest.mark.parametrize("kind", ["truncated", "random", "not_nsys", "fake_report", "empty", "no_gpu"])
def test_mangled_files_fail_in_one_line_and_store_nothing(db, tmp_path, kind):
    load(db, SHARED_TRACES / SAXPY, "j")          # something already stored must stay as it was
    before = _snapshot(db)
    src = SHARED_TRACES / TEMPLATE
    if kind == "truncated":
        p = tmp_path / "cut.sqlite"
        shutil.copy(src, p)
        os.truncate(p, p.stat().st_size // 2)
        needle = "truncated"
    elif kind == "random":
        p = tmp_path / "noise.sqlite"
        p.write_bytes(os.urandom(50_000))
        needle = "not a SQLite database"
    elif kind == "not_nsys":
        p = tmp_path / "other.sqlite"
        c = sqlite3.connect(p)
        c.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        c.executemany("INSERT INTO t VALUES (?, ?)", [(i, str(i)) for i in range(100)])
        c.commit()
        c.close()
        needle = "not an Nsight Systems export"
    elif kind == "fake_report":
        p = tmp_path / "run.nsys-rep"
        p.write_bytes(os.urandom(1000))
        needle = f"nsys export --type sqlite --output {tmp_path / 'run.sqlite'} {p}"
    elif kind == "empty":
        p = tmp_path / "empty.sqlite"
        p.write_bytes(b"")
        needle = "empty file"
    else:  # an nsys-shaped file whose CUPTI tables hold nothing
        p = tmp_path / "idle.sqlite"
        c = sqlite3.connect(p)
        raw = _raw(src)
        for name, sql in raw.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"):
            c.execute(sql)
        c.commit()
        c.close()
        needle = "no GPU activity"
    assert loader_for(p).name == "nsys"
    res = ingest_paths(db, [p], job="j")
    assert len(res) == 1 and res[0].status == "failed"
    msg = res[0].message
    assert "\n" not in msg and str(p) in msg and needle in msg
    with pytest.raises(TraceFormatError):
        load(db, p, "j")
    assert _snapshot(db) == before


@needs_shared
def test_damaged_copies_store_whole_or_fail_in_one_line(db, tmp_path):
    # seeded damage in the b-tree pages SQLite must walk (a run of bytes overwritten inside the file's
    # used pages): every copy either lands as one file or is refused in one line naming it, never a
    # traceback and never part of a file; the rows already stored stay as they were
    import random

    load(db, SHARED_TRACES / SAXPY, "keep")
    src = (SHARED_TRACES / TEMPLATE).read_bytes()
    page = int.from_bytes(src[16:18], "big") or 65536
    rng = random.Random(7)
    failed = 0
    for i in range(24):
        buf = bytearray(src)
        pg = rng.randrange(1, len(src) // page)
        at = pg * page + rng.randrange(0, 16)          # a page header or its first cell pointers
        buf[at:at + 4] = bytes(rng.randrange(256) for _ in range(4))
        f = tmp_path / f"damaged-{i}.sqlite"
        f.write_bytes(bytes(buf))
        before = _snapshot(db)
        res = ingest_paths(db, [f], job=f"d{i}")
        assert len(res) == 1 and res[0].status in ("stored", "failed"), res
        if res[0].status == "failed":
            failed += 1
            assert "\n" not in res[0].message and str(f) in res[0].message
            assert _snapshot(db) == before
            for t in ("gpu_ops", "host_ops", "steps", "traces"):
                assert db.execute(f"SELECT count(*) FROM {t} WHERE job = ?", [f"d{i}"]).fetchone()[0] == 0
        else:
            n = db.execute("SELECT count(*) FROM traces WHERE job = ?", [f"d{i}"]).fetchone()[0]
            assert n >= 1
    assert failed >= 1   # the damage does reach pages SQLite reads
    keep = db.execute("SELECT count(*) FROM gpu_ops WHERE job = 'keep'").fetchone()[0]
    assert keep > 0


# ------------------------------------------------------------------------------------------ synthetic multi-process

GP = [(7 << 48) | (4242 << 24), (7 << 48) | (4241 << 24)]     # two processes, given out of PID order
BASE = 1_700_000_000_000_000_000


def _synthetic(path, with_marks=False, comm="ncclDevKernel_AllReduce_Sum_f32_RING_LL"):
    """Two processes on the template's schema: ProfilerStep ranges (or marks), kernels, a communication kernel
    (COMM, launched inside an NCCL-domain ncclAllReduce range), copies."""
    c = sqlite3.connect(path)
    raw = _raw(SHARED_TRACES / TEMPLATE)
    for name, sql in raw.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"):
        c.execute(sql)
        if name.startswith("ENUM_") or name == "META_DATA_EXPORT":
            rows = raw.execute(f"SELECT * FROM {name}").fetchall()
            if rows:
                c.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    raw.close()
    c.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME (utcEpochNs) VALUES (?)", [BASE])
    names = ["ampere_sgemm_128x64_nn", comm, "cudaLaunchKernel_v7000",
             "ProfilerStep#1", "ProfilerStep#2", "ncclAllReduce", "NCCL"]
    c.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names, start=1)))
    kcols = ("start, \"end\", deviceId, contextId, streamId, correlationId, globalPid, demangledName, shortName, "
             "registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, "
             "dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId")
    for p, g in enumerate(GP):
        tid = g + 100 + p
        off = p * 50
        ker, api = [], []
        for i in range(10):
            corr = i + 1
            name = 2 if i == 5 else 1
            s = 1000 + i * 1000 + off
            ker.append((s, s + 600, p, 1, 7, corr, g, name, name, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, i))
            api.append((s - 300, s - 100, 0, tid, corr, 3, 0))
        c.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({kcols}) VALUES ({', '.join('?' * 21)})", ker)
        c.executemany('INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, "end", eventClass, globalTid, correlationId, '
                      "nameId, returnValue) VALUES (?, ?, ?, ?, ?, ?, ?)", api)
        c.execute('INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, "end", deviceId, contextId, streamId, correlationId, '
                  "globalPid, bytes, copyKind, srcKind, dstKind) VALUES (?, ?, ?, 1, 8, 99, ?, 4096, 10, 2, 2)",
                  [2650 + off, 2700 + off, p, g])
        if with_marks:
            c.executemany("INSERT INTO NVTX_EVENTS (start, eventType, textId, globalTid) VALUES (?, 34, ?, ?)",
                          [(500 + off, 4, tid), (5500 + off, 5, tid)])
        else:
            c.executemany('INSERT INTO NVTX_EVENTS (start, "end", eventType, textId, globalTid) VALUES (?, ?, 59, ?, ?)',
                          [(500 + off, 5500 + off, 4, tid), (5500 + off, 11000 + off, 5, tid)])
        # the NCCL domain and its API range around the AllReduce launch
        c.execute("INSERT INTO NVTX_EVENTS (start, eventType, textId, globalTid, domainId) VALUES (0, 75, 7, ?, 3)",
                  [tid])
        c.execute('INSERT INTO NVTX_EVENTS (start, "end", eventType, textId, globalTid, domainId) '
                  "VALUES (?, ?, 59, 6, ?, 3)", [5650 + off, 5950 + off, tid])
    c.commit()
    c.close()


@needs_shared
def test_two_processes_become_two_ranks_in_pid_order(db, tmp_path):
    p = tmp_path / "two.sqlite"
    _synthetic(p)
    res = load(db, p, "j")
    assert [(r.rank, r.status) for r in res] == [(0, "stored"), (1, "stored")]
    # no rank in NVTX or environment: enumerated by PID (4241 first although it is listed second)
    assert _rank_of_gpid(db, "j") == {GP[1]: 0, GP[0]: 1}
    assert db.execute("SELECT DISTINCT code FROM diagnostics WHERE code LIKE 'rank_%'").fetchall() == [
        ("rank_enumerated",)]
    assert db.execute("SELECT rank, count(*) FROM gpu_ops WHERE kind = 'kernel' GROUP BY 1 ORDER BY 1").fetchall() == [
        (0, 10), (1, 10)]
    # rank 1 is pid 4242, whose rows are offset by 0 ns; rank 0 (pid 4241) by 50 ns
    assert db.execute("SELECT min(start_ns) FROM gpu_ops WHERE rank = 1").fetchone()[0] == BASE + 1000
    assert db.execute("SELECT min(start_ns) FROM gpu_ops WHERE rank = 0").fetchone()[0] == BASE + 1050
    assert db.execute("SELECT DISTINCT pid FROM host_ops WHERE rank = 0").fetchall() == [("4241",)]
    assert db.execute("SELECT rank, step, start_ns, end_ns FROM steps ORDER BY 1, 2").fetchall() == [
        (0, 1, BASE + 550, BASE + 5550), (0, 2, BASE + 5550, BASE + 11050),
        (1, 1, BASE + 500, BASE + 5500), (1, 2, BASE + 5500, BASE + 11000)]
    assert db.execute("SELECT rank, coll, kernel_name, start_ns, source FROM collectives ORDER BY 1").fetchall() == [
        (0, "allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", BASE + 6050, "kernel"),
        (1, "allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", BASE + 6000, "kernel")]
    assert db.execute("SELECT DISTINCT copy_kind, name FROM gpu_ops WHERE kind = 'memcpy'").fetchall() == [
        ("PtoP", "Memcpy PtoP (Device -> Device)")]
    # the copy has no launching call in the file: flagged, not dropped
    assert db.execute("SELECT rank, count FROM diagnostics WHERE code = 'gpu_op_without_correlation' ORDER BY 1"
                      ).fetchall() == [(0, 1), (1, 1)]
    # runtime calls sit inside the step ranges: depth 1; the AllReduce launch also inside ncclAllReduce: 2
    assert db.execute("""SELECT h.depth, count(*) FROM host_ops h JOIN gpu_ops g ON g.rank = h.rank
                         AND g.correlation = h.correlation AND g.kind = 'kernel' WHERE h.cat = 'cuda_runtime'
                         GROUP BY 1 ORDER BY 1""").fetchall() == [(1, 18), (2, 2)]
    assert db.execute("""SELECT DISTINCT g.name FROM host_ops h JOIN gpu_ops g ON g.rank = h.rank
                         AND g.correlation = h.correlation WHERE h.depth = 2""").fetchall() == [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL",)]
    assert db.execute("SELECT DISTINCT depth, args->>'domain' FROM host_ops WHERE name = 'ncclAllReduce'"
                      ).fetchall() == [(1, "NCCL")]
    attribute_job(db, "j")
    for r, step, w0, w1 in db.execute("SELECT rank, step, start_ns, end_ns FROM step_windows").fetchall():
        tot = db.execute("SELECT sum(ns), min(ns) FROM ledger_totals WHERE rank = ? AND step = ?", [r, step]).fetchone()
        assert tot[0] == w1 - w0 and tot[1] >= 0
    # one 600 ns AllReduce kernel per rank, overlapping no compute. Both processes are in one export (one
    # clock): the 50 ns between their starts is not read as a clock offset (it is within any completion skew)
    # but as rank 1 waiting 50 ns for rank 0
    tot = dict(db.execute("SELECT ledger, sum(ns) FROM ledger_totals WHERE ledger IN ('exposed_comm', "
                          "'straggler') GROUP BY 1").fetchall())
    assert tot == {"exposed_comm": 2 * 600 - 50, "straggler": 50}
    assert db.execute("SELECT offset_ns, applied FROM clock_offsets WHERE rank = 1").fetchone() == (0, False)


@needs_shared
@pytest.mark.parametrize("comm,coll", [
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*)", "alltoall"),  # named by its rule
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "allreduce"),  # by the ncclAllReduce range
    ("void (anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8, true, false>", "reducescatter"),
])
def test_every_communication_kernel_becomes_a_collective(db, tmp_path, comm, coll):
    p = tmp_path / "two.sqlite"
    _synthetic(p, comm=comm)
    load(db, p, "j")
    assert db.execute("SELECT rank, coll, kernel_name FROM collectives ORDER BY 1").fetchall() == [
        (0, coll, comm), (1, coll, comm)]


@needs_shared
def test_given_rank_and_step_marks(db, tmp_path):
    p = tmp_path / "marks.sqlite"
    _synthetic(p, with_marks=True)
    res = load(db, p, "j", rank=4)
    assert sorted(r.rank for r in res) == [4, 5]
    assert db.execute("SELECT DISTINCT code FROM diagnostics WHERE code LIKE 'rank_%'").fetchall() == [("rank_given",)]
    # step 1 runs from its mark to the next; the last to the rank's last activity
    assert db.execute("SELECT step, start_ns, end_ns FROM steps WHERE rank = 5 ORDER BY step").fetchall() == [
        (1, BASE + 500, BASE + 5500), (2, BASE + 5500, BASE + 10600)]
    assert db.execute("SELECT DISTINCT code FROM diagnostics WHERE code LIKE 'steps_%'").fetchall() == [
        ("steps_from_marks",)]
    assert db.execute("SELECT count(*) FROM host_ops WHERE cat = 'user_annotation' AND name LIKE 'ProfilerStep%'"
                      ).fetchone()[0] == 0
