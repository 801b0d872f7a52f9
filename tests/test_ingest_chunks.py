"""A trace is parsed as several chunk files in parallel; the rows must equal an unsplit parse."""
import json

import pytest

import ninefold.ingest.kineto as kineto
from ninefold.ingest.kineto import sniff_kineto
from ninefold.ingest.load import load_kineto
from ninefold.store.connection import connect

TABLES = {
    "gpu_ops": "kind, name, start_ns, end_ns, correlation, external_id, stream, args",
    "host_ops": "tid, cat, name, start_ns, end_ns, depth, external_id, correlation",
    "steps": "step, start_ns, end_ns",
    "collectives": "coll, seq, start_ns, end_ns, bytes",
}


def _trace(path, n=400, nested_lists=False):
    """Kineto's own layout: one key per line, nested args objects, two-space indented events."""
    evs = []
    for i in range(n):
        ts = 1000 + i * 10
        evs.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1, "ts": ts,
                    "dur": 4.5, "args": {"External id": i, "Input Dims": [[4, 4], [4]]}})
        args = {"External id": i, "correlation": 10_000 + i, "device": 0, "stream": 7,
                "grid": [1, 2, 3], "block": [128, 1, 1]}
        if nested_lists:  # objects inside a list, each on its own line: a split point that is not an event end
            args["parts"] = [{"a": 1}, {"b": 2}]
        evs.append({"ph": "X", "cat": "kernel", "name": f"gemm_{i % 3}", "pid": 0, "tid": 7, "ts": ts + 2,
                    "dur": 3.25, "args": args})
    evs.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 900,
                "dur": n * 10 + 200})
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1},
           "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": evs, "traceName": "x"}
    path.write_text(json.dumps(doc, indent=2))
    return path


def _rows(con, table):
    return con.execute(f"SELECT {TABLES[table]} FROM {table} ORDER BY ALL").fetchall()


@pytest.mark.parametrize("nested", [False, True])
def test_chunked_parse_equals_unsplit(tmp_path, monkeypatch, nested):
    p = _trace(tmp_path / "rank-0.json", nested_lists=nested)
    monkeypatch.setattr(kineto, "MIN_CHUNK", 1)
    km = sniff_kineto(p, n_chunks=5)
    try:
        assert len(km.chunks) > 1, "the test trace must actually be split"
    finally:
        km.cleanup()

    one = connect(tmp_path / "one.duckdb")
    monkeypatch.setattr(kineto, "_default_chunks", lambda: 1)
    assert load_kineto(one, p, "j").status == "stored"
    many = connect(tmp_path / "many.duckdb")
    monkeypatch.setattr(kineto, "_default_chunks", lambda: 5)
    assert load_kineto(many, p, "j").status == "stored"
    for t in TABLES:
        a, b = _rows(one, t), _rows(many, t)
        assert a == b, t
    assert len(_rows(many, "gpu_ops")) == 400
    # document order survives the split: depth of nested host ops and ord-dependent ties are identical
    assert many.execute("SELECT max(depth) FROM host_ops").fetchone()[0] == 1


def test_chunked_truncated_file_reports_document_offset(tmp_path, monkeypatch):
    p = _trace(tmp_path / "rank-0.json")
    text = p.read_text()
    bad = text.replace('"dur": 3.25', '"dur": 3.25 oops', 1)   # garbage inside an event of the first half
    p.write_text(bad)
    monkeypatch.setattr(kineto, "MIN_CHUNK", 1)
    from ninefold.store.errors import TraceFormatError
    msgs = []
    for n in (1, 4):
        monkeypatch.setattr(kineto, "_default_chunks", lambda: n)
        con = connect(tmp_path / f"x{n}.duckdb")
        with pytest.raises(TraceFormatError) as ei:
            load_kineto(con, p, "j")
        assert con.execute("SELECT count(*) FROM gpu_ops").fetchone()[0] == 0
        msgs.append(str(ei.value))
    # the split parse reports the same document byte offset as the unsplit one
    assert msgs[0] == msgs[1]
    msg = msgs[1]
    assert "rank-0.json" in msg and "malformed JSON" in msg and "\n" not in msg
    off = int(msg.split("byte ")[1].split(":")[0].split()[0])
    event_start = bad.rindex("{", 0, bad.index("oops"))
    assert event_start - 200 <= off <= bad.index("oops"), (off, event_start)


def test_prefetched_multi_file_ingest_equals_serial(tmp_path, monkeypatch):
    """Files parsed ahead on other cursors land exactly as when read one by one, each in its own transaction."""
    import ninefold.ingest.load as load
    from ninefold.ingest.load import ingest_paths
    from sample_traces.generate import generate

    generate(tmp_path / "job", ranks=4, steps=2, seed=5)
    files = sorted((tmp_path / "job").glob("rank-*.json*"))
    bad = tmp_path / "job" / "rank-9.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}, {"ph": ')   # truncated
    got = {}
    for mode, limit in (("serial", 0), ("prefetch", load.PREFETCH_MAX_BYTES)):
        monkeypatch.setattr(load, "PREFETCH_MAX_BYTES", limit)
        con = connect(tmp_path / f"{mode}.duckdb")
        res = ingest_paths(con, files + [bad], job="j")
        assert [r.status for r in res] == ["stored"] * 4 + ["failed"], res
        assert "rank-9.json" in res[-1].message and "truncated" in res[-1].message
        got[mode] = {t: _rows(con, t) for t in TABLES}
        # again: every file unchanged, nothing left in a scratch database
        res = ingest_paths(con, files, job="j")
        assert [r.status for r in res] == ["unchanged"] * 4
        assert con.execute("SELECT count(*) FROM duckdb_databases() WHERE database_name = 'nf_scratch'"
                           ).fetchone()[0] == 0
        con.close()
    assert got["serial"] == got["prefetch"]
    assert len(got["serial"]["gpu_ops"]) > 100
