"""NCCL debug logs: counts on the real shared logs, fused/truncated/prefixed lines, bad input, desync, linking."""
import random
import re

import pytest
from click.testing import CliRunner

from ninefold.ingest import nccl_log
from ninefold.ingest.load import ingest_paths
from ninefold.ingest.nccl_link import collective_detail, link_profiler_collectives
from ninefold.store.connection import connect
from ninefold.store.errors import IngestConflict, TraceFormatError
from tests.conftest import SHARED_TRACES, needs_shared

LOGS = SHARED_TRACES / "nccl_logs"
REPO = SHARED_TRACES / "nccl_logs_repo"
TIMEZ = REPO / "Timez-zx_nccl-tests" / "nccl.log"
COLL_RE = re.compile(r"[A-Z][A-Za-z]+: opCount [0-9a-f]+ ")
NCCL_TABLES = ("nccl_log_files", "nccl_colls", "nccl_comms", "nccl_topology", "nccl_events")


def _all_logs():
    return sorted(LOGS.glob("*.log")) + [TIMEZ, REPO / "RADDet" / "nccl_debug.log"]


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory):
    if not SHARED_TRACES.is_dir():
        pytest.skip("no shared corpus")
    con = connect(tmp_path_factory.mktemp("nl") / "s.duckdb")
    for f in _all_logs():
        r = nccl_log.load(con, f, "shared")
        assert r.status == "stored", r
    yield con
    con.close()


def _file(p):
    return str(p.resolve())


def _n(con, table, job=None):
    if job is None:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    return con.execute(f"SELECT count(*) FROM {table} WHERE job = ?", [job]).fetchone()[0]


# ------------------------------------------------------------------ real logs
@needs_shared
def test_coll_line_counts_equal_an_independent_grep_on_every_shared_log(shared_db):
    seen = 0
    for f in _all_logs():
        expected = len(COLL_RE.findall(f.read_text(errors="replace")))
        got = shared_db.execute("SELECT count(*) FROM nccl_colls WHERE file = ?", [_file(f)]).fetchone()[0]
        assert got == expected, f.name
        n_lines = f.read_text(errors="replace").count("\n")
        assert shared_db.execute("SELECT n_lines, n_colls FROM nccl_log_files WHERE path = ?",
                                 [_file(f)]).fetchone() == (n_lines, expected)
        seen += expected
    assert shared_db.execute("SELECT count(*) FROM nccl_colls WHERE file = ?", [_file(TIMEZ)]).fetchone()[0] == 990
    assert seen == _n(shared_db, "nccl_colls")


@needs_shared
def test_timez_colls_get_rank_comm_and_tuning(shared_db):
    text = TIMEZ.read_text()
    tuning = re.findall(r"AllReduce: (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}", text)
    assert len(tuning) == 495 and {t[1:] for t in tuning} == {("RING", "SIMPLE", "0", "23")}
    inits = re.findall(r"comm (0x[0-9a-f]+) rank (\d+) nranks 2 cudaDev \d+ nvmlDev \d+ busId \w+ commId (0x[0-9a-f]+)"
                       r" - Init COMPLETE", text)
    rows = shared_db.execute("""SELECT comm, rank, comm_id, count(*), count(*) FILTER (algorithm = 'RING' AND
                                protocol = 'SIMPLE' AND n_channels = 24), count(*) FILTER (bytes = count * 4),
                                count(DISTINCT nranks), min(dtype)
                                FROM nccl_colls WHERE file = ? GROUP BY ALL ORDER BY rank""", [_file(TIMEZ)]).fetchall()
    assert [(c, r, i) for c, r, i, *_ in rows] == sorted([(c, int(r), i) for c, r, i in inits], key=lambda x: x[1])
    for _, _, _, n, tuned, sized, nr, dt in rows:
        assert (n, tuned, sized, nr, dt) == (495, 495, 495, 1, "float32")
    # each launch's TUNING byte count is the op's: count x 4 bytes
    assert shared_db.execute("""SELECT sum(bytes) FROM nccl_colls WHERE file = ? AND rank = 0""",
                             [_file(TIMEZ)]).fetchone()[0] == sum(int(t[0]) for t in tuning)
    assert shared_db.execute("SELECT nccl_version FROM nccl_log_files WHERE path = ?",
                             [_file(TIMEZ)]).fetchone()[0] == "2.27.7+cuda13.0"


@needs_shared
def test_launcher_prefixes_are_stripped(shared_db):
    ray = LOGS / "nccl_issue1193_ray_allreduce_128ranks_COLL.log"
    exp = [(h, int(p), int(oc, 16)) for h, p, oc in
           re.findall(r"^\(RayTrainWorker pid=\d+, ip=[\d.]+\) ([\w-]+):(\d+):\d+ \[\d+\] NCCL INFO AllReduce: "
                      r"opCount ([0-9a-f]+)", ray.read_text(), re.M)]
    got = shared_db.execute("SELECT host, pid, op_count FROM nccl_colls WHERE file = ? ORDER BY line_no",
                            [_file(ray)]).fetchall()
    assert got == exp and len(exp) == 4
    tagged = LOGS / "nccl_issue1453_h100_24rank_3node_NVLS_INIT.log"
    assert shared_db.execute("SELECT host, rank, nranks, nnodes, local_ranks FROM nccl_comms WHERE file = ?",
                             [_file(tagged)]).fetchall() == [("h100clust-worker-1", 0, 24, 3, 8)]
    heads = re.findall(r"NVLS Head\s+(\d+):\s+([\d ]+)", tagged.read_text())
    assert shared_db.execute("SELECT channel, peers FROM nccl_topology WHERE file = ? AND kind = 'nvls' ORDER BY channel",
                             [_file(tagged)]).fetchall() == [(int(h), " ".join(p.split())) for h, p in heads]
    stamped = LOGS / "nccl_issue1610_alltoall_watchdog_timeout_torch.log"
    ev = shared_db.execute("""SELECT rank, level, seq, op_type, last_enqueued, last_completed FROM nccl_events
                              WHERE file = ? AND origin = 'torch' ORDER BY line_no""", [_file(stamped)]).fetchall()
    assert ev == [(13, "watchdog", 216, "ALLTOALL_BASE", None, None), (13, "watchdog", 216, None, 220, 215),
                  (15, "watchdog", 57, "ALLREDUCE", None, None), (15, "watchdog", 57, None, 57, 56)]
    errs = shared_db.execute("SELECT host, location FROM nccl_events WHERE file = ? AND level = 'ERROR' ORDER BY line_no",
                             [_file(stamped)]).fetchall()
    assert errs == [("ncivki7qpk7pmo1btv0h0", f"misc/socket.cc:{n}") for n in (47, 550, 573)]


@needs_shared
def test_fused_lines_are_cut_apart_and_continuations_rejoined(shared_db):
    bc = LOGS / "nccl_issue147_turn2_broadcast_8rank_COLL_interleaved.log"
    rows = shared_db.execute("SELECT pid, device, op_count, count, recovered FROM nccl_colls WHERE file = ? "
                             "ORDER BY line_no, pid", [_file(bc)]).fetchall()
    assert len(rows) == len(COLL_RE.findall(bc.read_text()))
    # line 1 is "[2] NCCL INFO <[7]'s whole line>"; rank [2]'s text is the bare "Broadcast: opCount 1 ..." of line 6
    assert [r for r in rows if r[4]] == [(32619, 2, 1, 25503912, True)]
    ring = LOGS / "nccl_issue147_turn0_ring_8rank_INIT_interleaved.log"
    links = re.findall(r"Ring (\d+) : (\d+)\[\d+\] -> (\d+)\[\d+\] via P2P/IPC", ring.read_text())
    got = shared_db.execute("SELECT channel, src_rank, dst_rank, pid, device FROM nccl_topology WHERE file = ? "
                            "AND kind = 'ring' ORDER BY line_no, src_rank", [_file(ring)]).fetchall()
    assert sorted((c, s, d) for c, s, d, _, _ in got) == sorted((int(c), int(s), int(d)) for c, s, d in links)
    assert all(dev == s for _, s, _, _, dev in got)   # every link landed on its own process's prefix
    assert shared_db.execute("SELECT count FROM diagnostics WHERE code = 'interleaved_recovered' AND "
                             "starts_with(example, ?)", [_file(ring)]).fetchone()[0] == 2
    raddet = REPO / "RADDet" / "nccl_debug.log"
    assert shared_db.execute("SELECT pid, rank, nranks, comm_id, status, bus_id FROM nccl_comms WHERE file = ? "
                             "ORDER BY rank", [_file(raddet)]).fetchall() == [
        (803563, 0, 2, "0x245d75cdaf12704b", "COMPLETE", "2000"), (803564, 1, 2, "0x245d75cdaf12704b", "COMPLETE", "3000")]
    assert shared_db.execute("SELECT DISTINCT host FROM nccl_topology WHERE file = ?", [_file(raddet)]).fetchall() == [("ljm",)]


@needs_shared
def test_truncated_rccl_lines_keep_the_fields_before_the_cut(shared_db):
    f = LOGS / "primus_readme_llama3_70B_rccl_COLL_truncated_lines.log"
    assert shared_db.execute("""SELECT op, op_count, count, dtype, reduction, root, comm, nranks, truncated
                                FROM nccl_colls WHERE file = ? ORDER BY line_no""", [_file(f)]).fetchall() == [
        ("ReduceScatter", 0xce3, 106956800, "bfloat16", "avg", 0, None, None, True),
        ("AllGather", 0xc97, 106956800, "bfloat16", "sum", 0, None, None, True)]
    assert shared_db.execute("SELECT count FROM diagnostics WHERE code = 'truncated_coll' AND starts_with(example, ?)",
                             [_file(f)]).fetchone()[0] == 2


@needs_shared
def test_watchdog_lines_and_warns(shared_db):
    f = LOGS / "llamafactory_issue7396_allreduce_watchdog_timeout_torch.log"
    text = f.read_text()
    exp = [(int(r), int(s)) for r, s in re.findall(r"\[rank(\d+)\]:.*?(?:SeqNum=|at work: )(\d+)", text)]
    got = shared_db.execute("SELECT rank, seq FROM nccl_events WHERE file = ? AND level = 'watchdog' ORDER BY line_no",
                            [_file(f)]).fetchall()
    assert got == exp and len(got) == 4
    one = LOGS / "single_rank_socket_fallback_INIT_2.10.3.log"
    assert shared_db.execute("SELECT level, location, message FROM nccl_events WHERE file = ?", [_file(one)]).fetchall() == [
        ("WARN", "ofi_init:1134", "NET/OFI Only EFA provider is supported")]
    assert shared_db.execute("SELECT count(*) FROM nccl_topology WHERE file = ? AND kind = 'ring'",
                             [_file(one)]).fetchone()[0] == len(re.findall(r"Channel \d+/32 :", one.read_text()))


# ------------------------------------------------------------------ mangled copies
@needs_shared
def test_log_truncated_mid_line_keeps_the_rest_and_flags_the_cut(db, tmp_path):
    text = TIMEZ.read_text()
    at = text.index("count 1073741824 datatype 7", len(text) // 2)   # cut inside a COLL line
    cut = tmp_path / "cut.log"
    cut.write_text(text[:at])
    r = nccl_log.load(db, cut, "j")
    assert r.status == "stored"
    assert _n(db, "nccl_colls") == len(COLL_RE.findall(text[:at]))
    last = db.execute("SELECT truncated, count, comm FROM nccl_colls ORDER BY line_no DESC LIMIT 1").fetchone()
    assert last == (True, None, None)
    assert db.execute("SELECT count FROM diagnostics WHERE code = 'truncated_coll'").fetchone()[0] == 1


@needs_shared
def test_binary_garbage_fails_whole_file_unless_salvaged(db, tmp_path):
    lines = TIMEZ.read_text().split("\n")
    rng = random.Random(3)
    junk = [bytes(rng.randrange(256) for _ in range(60)) + b"\x00\x01" for _ in range(3)]
    bad = tmp_path / "garbage.log"
    bad.write_bytes(("\n".join(lines[:1000]) + "\n").encode() + b"\n".join(junk) + b"\n"
                    + "\n".join(lines[1000:]).encode())
    with pytest.raises(TraceFormatError) as ei:
        nccl_log.load(db, bad, "j")
    msg = str(ei.value)
    assert str(bad) in msg and "binary data" in msg and "line 1001" in msg and "\n" not in msg
    for t in NCCL_TABLES + ("diagnostics",):
        assert _n(db, t) == 0, t
    r = nccl_log.load(db, bad, "j", salvage=True)
    assert r.status == "stored" and "salvaged" in r.message
    assert _n(db, "nccl_colls") == 990
    n_junk_lines = sum(j.count(b"\n") + 1 for j in junk)
    assert db.execute("SELECT count FROM diagnostics WHERE code = 'binary_garbage'").fetchone()[0] == n_junk_lines


@needs_shared
def test_kineto_json_is_not_an_nccl_log(db):
    k = SHARED_TRACES / "hta" / "call_stack" / "backward_thread.json"
    assert not nccl_log.sniff(k, k.read_bytes()[:65536])
    with pytest.raises(TraceFormatError) as ei:
        nccl_log.load(db, k, "j")
    assert "not an NCCL debug log" in str(ei.value) and str(k) in str(ei.value)
    for t in NCCL_TABLES:
        assert _n(db, t) == 0


def test_empty_and_text_files_are_refused(db, tmp_path):
    e = tmp_path / "empty.log"
    e.write_text("")
    with pytest.raises(TraceFormatError, match="empty file"):
        nccl_log.load(db, e, "j")
    t = tmp_path / "notes.txt"
    t.write_text("training started\nloss 1.0\n")
    with pytest.raises(TraceFormatError, match="not an NCCL debug log"):
        nccl_log.load(db, t, "j")


# ------------------------------------------------------------------ idempotence, replace, transactions
def _synthetic_log(path, rank, world=4, ops=None, host="node0", comm_id="0x7d3a51e2c0ffee01", prefix="",
                   tuning=None, opcount_moves=True, extra_comm=False):
    """An NCCL 2.21-style INFO log of one rank: init, then one COLL line (+ TUNING) per op in OPS."""
    pid, comm = 4100 + rank, f"0x5555{rank:04x}a000"
    p = f"{prefix}{host}:{pid}:{pid} [{rank}] NCCL INFO "
    out = [f"{prefix}{host}:{pid}:{pid} [{rank}] NCCL INFO NCCL version 2.21.5+cuda12.4" if rank == 0 else None,
           p + f"ncclCommInitRank comm {comm} rank {rank} nranks {world} cudaDev {rank} nvmlDev {rank} "
               f"busId {rank + 1}0000 commId {comm_id} - Init COMPLETE"]
    if extra_comm:
        out.append(p + f"ncclCommSplit comm 0x6666{rank:04x}b000 rank {rank % 2} nranks 2 cudaDev {rank} nvmlDev {rank} "
                       f"busId {rank + 1}0000 parent {comm} color 1 key 0 commId 0x1111 - Init COMPLETE")
    for i, (op, count, dt) in enumerate(ops or []):
        oc = i if opcount_moves else 0
        out.append(p + f"{op}: opCount {oc:x} sendbuff 0x7f00{i:04x}0000 recvbuff 0x7f00{i:04x}0000 count {count} "
                       f"datatype {dt} op 0 root 0 comm {comm} [nranks={world}] stream 0x5600aa00")
        if tuning and i in tuning:
            algo, proto, ch = tuning[i]
            size = {9: 2, 7: 4}[dt] * count
            out.append(p + f"{op}: {size} Bytes -> Algo {algo} proto {proto} channel{{Lo..Hi}}={{0..{ch - 1}}}")
        if extra_comm and i == 0:
            out.append(p + f"AllGather: opCount 0 sendbuff 0x1 recvbuff 0x2 count 1024 datatype 7 op 0 root 0 "
                           f"comm 0x6666{rank:04x}b000 [nranks=2] stream 0x5600bb00")
    path.write_text("\n".join(x for x in out if x is not None) + "\n")
    return path


def test_same_file_twice_is_a_noop_and_a_changed_file_needs_replace(db, tmp_path):
    f = _synthetic_log(tmp_path / "r0.log", 0, ops=[("AllReduce", 1024, 7)] * 3)
    assert nccl_log.load(db, f, "j").status == "stored"
    before = [_n(db, t) for t in NCCL_TABLES]
    assert nccl_log.load(db, f, "j").status == "unchanged"
    assert [_n(db, t) for t in NCCL_TABLES] == before
    _synthetic_log(f, 0, ops=[("AllReduce", 1024, 7)] * 5)
    with pytest.raises(IngestConflict, match="--replace"):
        nccl_log.load(db, f, "j")
    assert _n(db, "nccl_colls") == 3
    assert nccl_log.load(db, f, "j", replace=True).status == "stored"
    assert _n(db, "nccl_colls") == 5 and _n(db, "nccl_log_files") == 1


def test_a_failure_while_writing_leaves_nothing(db, tmp_path, monkeypatch):
    f = _synthetic_log(tmp_path / "r0.log", 0, ops=[("AllReduce", 1024, 7)] * 3)
    real = nccl_log.insert_staged

    def boom(con, *a, **k):
        real(con, *a, **k)
        raise RuntimeError("disk full")
    monkeypatch.setattr(nccl_log, "insert_staged", boom)
    with pytest.raises(RuntimeError):
        nccl_log.load(db, f, "j")
    for t in NCCL_TABLES:
        assert _n(db, t) == 0, t


# ------------------------------------------------------------------ desync
def test_desync_allreduce_vs_allgather_at_one_opcount_is_flagged(db, tmp_path):
    ops = [("AllReduce", 4096, 9)] * 8
    for r in range(4):
        mine = list(ops)
        if r == 2:
            mine[5] = ("AllGather", 1024, 9)   # rank 2 runs another collective at opCount 5
        nccl_log.load(db, _synthetic_log(tmp_path / f"rank{r}.log", r, ops=mine), "d")
    found = nccl_log.desync(db, "d")
    assert len(found) == 1
    d = found[0]
    assert (d["kind"], d["op_count"], d["ops"], d["communicator"]) == ("op_mismatch", 5, ["AllGather", "AllReduce"],
                                                                       "0x7d3a51e2c0ffee01")
    assert sorted((m["rank"], m["op"]) for m in d["members"]) == [(0, "AllReduce"), (1, "AllReduce"),
                                                                  (2, "AllGather"), (3, "AllReduce")]


@needs_shared
def test_desync_query_on_real_excerpts(shared_db):
    ds = nccl_log.desync(shared_db, "shared")
    # issue 147: at opCount 0 rank [0] broadcasts 25503912 fp16 elements while [1], [5], [7] broadcast 53 int64
    assert [(d["kind"], d["op_count"], d["counts"], d["dtypes"]) for d in ds] == [
        ("size_mismatch", 0, [53, 25503912], ["float16", "int64"])]
    assert {m["pid"] for m in ds[0]["members"]} == {32615, 32617, 32625, 32629}


# ------------------------------------------------------------------ linking to profiler collectives
PLANTED = {1: ("RING", "LL", 16), 2: ("TREE", "LL128", 8), 3: ("RING", "SIMPLE", 24)}


def _dp4_job(tmp_path, opcount_moves):
    from sample_traces.generate import generate

    gt = generate(tmp_path / "dp4", ranks=4, steps=3, seed=0)
    db = connect(tmp_path / "link.duckdb")
    ranks = sorted((tmp_path / "dp4").glob("rank-*.json"))
    assert [r.status for r in ingest_paths(db, ranks, job="dp4")] == ["stored"] * 4
    nel = gt["collectives"][0]["nelems"]
    # the log covers more than the profiler window: an init broadcast before, loss all-reduces after
    ops = [("Broadcast", 4, 7)] + [("AllReduce", nel, 9)] * 3 + [("AllReduce", 1, 7)] * 2
    logs = tmp_path / "logs"
    logs.mkdir()
    tuning = {i: PLANTED[i] for i in (1, 2, 3)}
    for r in range(4):
        _synthetic_log(logs / f"rank{r}.log", r, ops=ops, tuning=tuning, opcount_moves=opcount_moves,
                       prefix=f"[1,{r}]<stdout>:" if r == 3 else "", extra_comm=(r < 2))
    res = ingest_paths(db, [logs], job="dp4")
    assert [r.status for r in res] == ["stored"] * 4
    return db, gt


@pytest.mark.parametrize("moves,method", [(True, "seq_opcount"), (False, "order")])
def test_profiler_collectives_link_to_their_nccl_lines(tmp_path, moves, method):
    db, gt = _dp4_job(tmp_path, moves)
    out = link_profiler_collectives(db, "dp4")
    prof = db.execute("SELECT count(*) FROM collectives WHERE job = 'dp4'").fetchone()[0]
    assert prof == 12 and out["links"] == 12
    rows = db.execute("SELECT rank, seq, algorithm, protocol, n_channels, method, comm FROM nccl_coll_links "
                      "ORDER BY rank, seq").fetchall()
    assert [(r, s) for r, s, *_ in rows] == [(r, s) for r in range(4) for s in (1, 2, 3)]
    for r, s, algo, proto, ch, m, comm in rows:
        assert (algo, proto, ch, m) == (*PLANTED[s], method)
        assert comm == f"0x5555{r:04x}a000"            # never the 2-rank split communicator
    d = collective_detail(db, "dp4", 3, "0", 2)
    assert (d["algorithm"], d["protocol"], d["n_channels"], d["count"], d["dtype"]) == (
        "TREE", "LL128", 8, gt["collectives"][1]["nelems"], "bfloat16")
    # the ledger drill-down shows each comm interval's algorithm, protocol and channels
    from ninefold.analysis.attribution.attribute import attribute_job

    attribute_job(db, "dp4")
    got = db.execute("""SELECT DISTINCT seq, algorithm, protocol, n_channels FROM ledger_drilldown
                        WHERE job = 'dp4' AND ledger IN ('exposed_comm', 'straggler') ORDER BY seq""").fetchall()
    assert got and all((a, p, c) == PLANTED[sq] for sq, a, p, c in got)
    db.close()


# ------------------------------------------------------------------ CLI
@needs_shared
def test_nccl_command_prints_per_communicator_summary(tmp_path):
    from ninefold.cli.main import cli

    dbp = tmp_path / "c.duckdb"
    con = connect(dbp)
    nccl_log.load(con, TIMEZ, "t")
    nccl_log.load(con, LOGS / "single_rank_socket_fallback_INIT_2.10.3.log", "t")
    con.close()
    res = CliRunner().invoke(cli, ["nccl", "--db", str(dbp), "--job", "t"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if "0x54fe282d32a87d85" in x)
    assert line.split()[1:5] == ["2", "AllReduce", "2", "990"] and "RING/SIMPLE" in line
    assert "WARN 1" in res.output
    bad = CliRunner().invoke(cli, ["nccl", "--db", str(dbp), "--job", "nope"])
    assert bad.exit_code == 2 and "no NCCL logs" in bad.output


def test_numbers_too_large_for_64_bits_are_null_with_a_diagnostic(db, tmp_path):
    """A 41-digit rank, device, channel or byte count (a corrupted or hostile log) was a ConversionException
    traceback; now the line is kept with the field NULL and a 'number_out_of_range' diagnostic names the line."""
    big = "9" * 41
    log = tmp_path / "big.log"
    log.write_text("\n".join([
        f"h:1:2 [0] NCCL INFO ncclCommInitRank comm 0xaa rank {big} nranks {big} cudaDev {big} nvmlDev 0 "
        "busId 1000 commId 0x1 - Init COMPLETE",
        f"h:1:2 [0] NCCL INFO comm 0xaa rank {big} nRanks 2 nNodes {big} localRanks 2 localRank 0 MNNVL 0",
        f"h:1:2 [0] NCCL INFO Channel {big}/24 : 0 1",
        "h:1:2 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7 recvbuff 0x9 count 16 datatype 7 op 0 root 0 "
        "comm 0xaa [nranks=2] stream 0x5",
        f"h:1:2 [0] NCCL INFO AllReduce: {big} Bytes -> Algo RING proto SIMPLE channel{{Lo..Hi}}={{0..23}}",
        "h:1:2 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x7 recvbuff 0x9 count 16 datatype 7 op 0 root 0 "
        "comm 0xaa [nranks=2] stream 0x5",
    ]) + "\n")
    r = nccl_log.load(db, log, "j")
    assert r.status == "stored"
    assert _n(db, "nccl_colls") == 2
    assert db.execute("SELECT rank, nranks, nnodes FROM nccl_comms").fetchall() == [(None, 2, None)]
    n, ex = db.execute("SELECT count, example FROM diagnostics WHERE code = 'number_out_of_range'").fetchone()
    assert n == 4 and "big.log:1:" in ex
