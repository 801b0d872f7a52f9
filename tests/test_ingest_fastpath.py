"""The faster ingest path stores exactly what the plain one did.

* Chunk files copied in the kernel (copy_file_range) equal those copied by reading and writing, also when the
  kernel copy stops part way.
* The depth window partitioned by a thread number gives the same depths as the one partitioned by the
  (pid, tid) strings, on every Kineto trace of the shared corpus.
* The hash computed beside the sniff still answers "unchanged" before the file's own errors.
* STAGES, when set, gets the seconds of each stage.
"""
import gzip
import json

import pytest

import ninefold.ingest.kineto as kineto
import ninefold.ingest.load as load
from conftest import SHARED_TRACES, needs_shared
from ninefold.ingest.kineto import sniff_kineto
from ninefold.ingest.load import ingest_paths, load_kineto
from ninefold.store.errors import TraceFormatError
from test_ingest_chunks import _trace


def _chunk_bytes(km):
    return [open(p, "rb").read() for p, _ in km.chunks], [off for _, off in km.chunks]


@pytest.mark.parametrize("mode", ["raises", "partial"])
def test_kernel_copy_equals_read_write_copy(tmp_path, monkeypatch, mode):
    p = _trace(tmp_path / "rank-0.json", n=2000)
    monkeypatch.setattr(kineto, "MIN_CHUNK", 1 << 12)
    km = sniff_kineto(p, n_chunks=4)
    fast = _chunk_bytes(km)
    km.cleanup()
    assert len(fast[0]) == 4
    real = kineto.os.copy_file_range

    def broken(src, dst, count, offset_src=None, *a):
        if mode == "partial" and count > 100:
            return real(src, dst, 100, offset_src)  # copies a little, then fails on the next call
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(kineto.os, "copy_file_range", broken)
    km = sniff_kineto(p, n_chunks=4)
    slow = _chunk_bytes(km)
    km.cleanup()
    assert slow == fast
    # and the chunks still hold exactly the events of the file
    evs = [e for part in fast[0] for e in json.loads(part)]
    assert evs == json.loads(p.read_bytes())["traceEvents"]


def _kineto_files():
    """The corpus files that look like Kineto traces (a traceEvents key near the top); the test itself takes a
    refusal of the loader as an answer."""
    if not SHARED_TRACES.is_dir():
        return []
    out = []
    for p in sorted(SHARED_TRACES.rglob("*")):
        if not p.is_file() or not p.name.endswith((".json", ".json.gz")):
            continue
        try:
            with (gzip.open if p.name.endswith(".gz") else open)(p, "rb") as f:
                head = f.read(8 << 20)
        except (OSError, EOFError):
            continue
        if b'"traceEvents"' in head:
            out.append(p)
    return out


# the depth window as it was: partitioned by the pid and tid strings
STRING_DEPTH = """
    WITH h AS (SELECT pid, tid, start_ns, end_ns FROM host_ops WHERE job = 'j'),
    pts AS (SELECT pid, tid, start_ns AS t, 1 AS d, end_ns AS e, start_ns AS s0 FROM h
            UNION ALL SELECT pid, tid, end_ns, -1, end_ns, NULL FROM h)
    SELECT pid, tid, s0, e, depth FROM (
        SELECT pid, tid, s0, e, d, sum(d) OVER (PARTITION BY pid, tid ORDER BY t, d, e DESC
                                                ROWS UNBOUNDED PRECEDING) - 1 AS depth FROM pts) WHERE d = 1
    ORDER BY ALL"""


@needs_shared
@pytest.mark.parametrize("path", _kineto_files(), ids=lambda p: str(p.relative_to(SHARED_TRACES)))
def test_depth_by_thread_number_matches_string_partition(db, path):
    try:
        r = load_kineto(db, path, "j", rank=0)
    except TraceFormatError as e:       # a Kineto-shaped file the loader refuses: nothing stored
        assert "\n" not in str(e)
        return
    assert r.status == "stored"
    have = db.execute("SELECT pid, tid, start_ns, end_ns, depth FROM host_ops WHERE job = 'j' "
                      "ORDER BY ALL").fetchall()
    want = db.execute(STRING_DEPTH).fetchall()
    assert have == want


def test_depth_across_threads_of_equal_strings(db, tmp_path):
    """pid/tid strings and ints that read alike, null pids and tids: the depths of the string partition."""
    evs = []
    for pid, tid in ((1, 1), ("1", "1"), (1, None), (None, 1), (2, "x"), ("2", "x")):
        evs += [{"ph": "X", "cat": "cpu_op", "name": "outer", "pid": pid, "tid": tid, "ts": 10, "dur": 100},
                {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": pid, "tid": tid, "ts": 20, "dur": 10},
                {"ph": "X", "cat": "cpu_op", "name": "zero", "pid": pid, "tid": tid, "ts": 30, "dur": 0}]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"baseTimeNanoseconds": 1, "traceEvents": evs}))
    assert load_kineto(db, p, "j", rank=0).status == "stored"
    have = db.execute("SELECT pid, tid, start_ns, end_ns, depth FROM host_ops ORDER BY ALL").fetchall()
    assert have == db.execute(STRING_DEPTH).fetchall()
    # pid 1 and "1" are one thread (both read as the string '1'); a null pid or tid is a thread of its own
    assert db.execute("SELECT count(DISTINCT (pid, tid)) FROM host_ops").fetchone()[0] == 4


def test_unchanged_answer_comes_before_the_files_own_error(db, tmp_path):
    p = _trace(tmp_path / "rank-0.json", n=50)
    data = p.read_bytes()
    cut = data[: data.rindex(b"{", 0, len(data) - 200)]
    p.write_bytes(cut)
    with pytest.raises(TraceFormatError, match="truncated"):
        load_kineto(db, p, "j", rank=0)
    assert load_kineto(db, p, "j", rank=0, salvage=True).status == "stored"
    r = load_kineto(db, p, "j", rank=0)     # stored before (salvaged): the same bytes are not read again
    assert r.status == "unchanged"
    with pytest.raises(TraceFormatError, match="truncated"):
        load_kineto(db, p, "other", rank=0)
    missing = tmp_path / "rank-9.json"
    with pytest.raises(TraceFormatError, match="no such file"):
        load_kineto(db, missing, "j", rank=9)


def test_stages_are_recorded_when_asked(db, tmp_path, monkeypatch):
    p = _trace(tmp_path / "rank-0.json", n=50)
    q = _trace(tmp_path / "rank-1.json", n=60)
    q.write_text(q.read_text().replace('"rank": 0', '"rank": 1').replace('"world_size": 1', '"world_size": 2'))
    monkeypatch.setattr(load, "STAGES", {})
    assert load_kineto(db, p, "j", rank=0).status == "stored"
    assert set(load.STAGES) == {"read", "parse", "build", "write"}
    assert all(v >= 0 for v in load.STAGES.values())
    monkeypatch.setattr(load, "STAGES", {})
    res = ingest_paths(db, [p, q], job="k")
    assert [r.status for r in res] == ["stored", "stored"]
    assert set(load.STAGES) == {"read", "parse", "build", "write"}
    monkeypatch.setattr(load, "STAGES", None)
    assert load_kineto(db, p, "m", rank=0).status == "stored"


@pytest.mark.parametrize("inflate", ["isal", "zlib"])
def test_gz_stores_what_the_plain_file_stores_and_bad_streams_fail_in_one_line(db, tmp_path, monkeypatch, inflate):
    if inflate == "zlib":
        monkeypatch.setattr(kineto, "_gzip", gzip)
    p = _trace(tmp_path / "rank-0.json", n=300)
    data = p.read_bytes()
    g = tmp_path / "gz" / "rank-0.json.gz"
    g.parent.mkdir()
    g.write_bytes(gzip.compress(data, 1) + gzip.compress(b"", 1))   # two members, as cat a.gz b.gz makes
    assert load_kineto(db, p, "a", rank=0).status == "stored"
    assert load_kineto(db, g, "b", rank=0).status == "stored"
    for t in ("gpu_ops", "host_ops", "steps", "flows", "collectives"):
        rows = [db.execute(f"SELECT * EXCLUDE (job) FROM {t} WHERE job = ? ORDER BY ALL", [j]).fetchall()
                for j in ("a", "b")]
        assert rows[0] == rows[1], t
    z = gzip.compress(data, 1)
    flipped = bytearray(z)
    flipped[len(z) // 2] ^= 0xFF
    for i, bad in enumerate((z[:-40], z[:len(z) // 2], bytes(flipped), z + b"junk")):
        f = tmp_path / f"bad{i}" / "rank-0.json.gz"
        f.parent.mkdir()
        f.write_bytes(bad)
        try:
            r = load_kineto(db, f, f"bad{i}", rank=0)
        except TraceFormatError as e:
            assert str(f) in str(e) and "\n" not in str(e)
        else:
            assert r.status == "stored"   # a flipped byte can land in a string: the stream still inflates


def test_a_run_of_files_checkpoints_once_and_restores_the_threshold(tmp_path):
    from ninefold.store.connection import connect

    d = tmp_path / "job"
    d.mkdir()
    for r in range(3):
        q = _trace(d / f"rank-{r}.json", n=100 + r)
        q.write_text(q.read_text().replace('"rank": 0', f'"rank": {r}').replace('"world_size": 1', '"world_size": 3'))
    con = connect(tmp_path / "s.duckdb")
    before = con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]
    res = ingest_paths(con, [d], job="j")
    assert [r.status for r in res] == ["stored"] * 3
    assert con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0] == before
    wal = tmp_path / "s.duckdb.wal"
    assert not wal.exists() or wal.stat().st_size < 1 << 16     # folded into the database file
    n = con.execute("SELECT count(*) FROM host_ops").fetchone()[0]
    con.close()
    con = connect(tmp_path / "s.duckdb")
    assert con.execute("SELECT count(*) FROM host_ops").fetchone()[0] == n == sum(100 + r + 1 for r in range(3))
    assert [r.status for r in ingest_paths(con, [d], job="j")] == ["unchanged"] * 3
    con.close()
