"""ninefold export: a Chrome-trace JSON that ingests again with every nanosecond (round trip), whose ledger track
re-sums to ledger_totals and whose critical-path track is the stored path, with arrows where it changes rank."""
import gzip
import json
import subprocess
import sys

import pytest

from ninefold.analysis.attribution.attribute import attribute_job
from ninefold.analysis.critical_path import critical_path
from ninefold.analysis.export import ExportError, export_trace, write_trace
from conftest import ROOT, SHARED_TRACES, needs_shared
from ninefold.ingest.load import ingest_paths, load_kineto
from sample_traces.generate import generate
from ninefold.store.connection import connect


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    generate(d / "job", ranks=4, steps=3, seed=0)
    con = connect(d / "e.duckdb")
    ingest_paths(con, sorted((d / "job").glob("rank-*.json")), job="j")
    attribute_job(con, "j")
    critical_path(con, "j")
    con.close()
    return d


def test_ledger_track_re_sums_to_ledger_totals_and_path_track_is_the_path(store):
    con = connect(store / "e.duckdb", read_only=True)
    doc = json.loads(export_trace(con, "j"))
    ev = doc["traceEvents"]
    assert all({"ph", "pid", "tid", "name"} <= set(e) for e in ev)
    assert all("ts" in e for e in ev if e["ph"] != "M")
    led = {}
    for e in ev:
        if e.get("cat") == "ninefold_ledger":
            led[e["name"]] = led.get(e["name"], 0) + round(e["dur"] * 1000)
    tot = dict(con.execute("SELECT ledger, sum(ns) FROM ledger_totals WHERE job = 'j' AND ns > 0 GROUP BY ledger"
                           ).fetchall())
    assert led == tot
    cp = [e for e in ev if e.get("cat") == "ninefold_critical_path" and e["ph"] == "X"]
    n, length = con.execute("SELECT count(*), sum(aligned_end_ns - aligned_start_ns) FROM critical_path "
                            "WHERE job = 'j'").fetchone()
    assert len(cp) == n and sum(round(e["dur"] * 1000) for e in cp) == length
    # an arrow (a start and a finish with one id) wherever the path moves to another rank
    moves = con.execute("""SELECT count(*) FROM (SELECT rank, lead(rank) OVER (PARTITION BY step ORDER BY seq) AS nx
                           FROM critical_path WHERE job = 'j') WHERE nx IS NOT NULL AND nx <> rank""").fetchone()[0]
    starts = [e["id"] for e in ev if e.get("ph") == "s"]
    finishes = [e["id"] for e in ev if e.get("ph") == "f"]
    assert moves > 0 and len(starts) == moves and sorted(starts) == sorted(finishes)
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {f"rank {r} {w}" for r in range(4) for w in ("host", "GPU")}


@pytest.mark.parametrize("rank", [0, 3])
def test_a_rank_exported_ingests_again_with_every_nanosecond(store, tmp_path, rank):
    con = connect(store / "e.duckdb", read_only=True)
    out = write_trace(con, "j", tmp_path / f"r{rank}.json.gz", steps={11}, rank=rank)
    off = con.execute("SELECT offset_ns FROM clock_offsets WHERE job = 'j' AND rank = ?", [rank]).fetchone()[0]
    doc = json.loads(gzip.decompress(out.read_bytes()))
    ts = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    a = doc["baseTimeNanoseconds"] + min(round(e["ts"] * 1000) for e in ts) + off
    b = doc["baseTimeNanoseconds"] + max(round((e["ts"] + e["dur"]) * 1000) for e in ts) + off
    got = connect(tmp_path / "rt.duckdb")
    load_kineto(got, out, "rt")
    q = ("SELECT kind, name, stream, correlation, start_ns - ?, end_ns - ? FROM gpu_ops WHERE job = ? AND rank = ? "
         "AND start_ns >= ? AND end_ns <= ? ORDER BY start_ns, name")
    want = con.execute(q, [off, off, "j", rank, a, b]).fetchall()
    have = got.execute(q, [0, 0, "rt", rank, a - off, b - off]).fetchall()
    assert want and have == want
    hq = ("SELECT cat, name, correlation, start_ns - ?, end_ns - ? FROM host_ops WHERE job = ? AND rank = ? "
          "AND cat IN ('cpu_op', 'cuda_runtime', 'user_annotation') AND start_ns >= ? AND end_ns <= ? "
          "ORDER BY start_ns, name")
    assert got.execute(hq, [0, 0, "rt", rank, a - off, b - off]).fetchall() == \
        con.execute(hq, [off, off, "j", rank, a, b]).fetchall()
    # the rank's window of step 11 comes back (on the reference clock)
    w = con.execute("SELECT start_ns - ?, end_ns - ? FROM step_windows WHERE job = 'j' AND rank = ? AND step = 11",
                    [off, off, rank]).fetchone()
    attribute_job(got, "rt")
    assert got.execute("SELECT start_ns, end_ns FROM step_windows WHERE job = 'rt' AND step = 11").fetchone() == w


def test_export_cli_and_refusals(store, tmp_path):
    con = connect(store / "e.duckdb", read_only=True)
    with pytest.raises(ExportError, match="no rank 9"):
        export_trace(con, "j", rank=9)
    with pytest.raises(ExportError, match="no step 99"):
        export_trace(con, "j", steps={99})
    with pytest.raises(ExportError, match="run `ninefold attribute` first"):
        export_trace(con, "nope")
    con.close()
    r = subprocess.run([sys.executable, "-m", "ninefold.cli.main", "export", "--db", str(store / "e.duckdb"), "--job", "j",
                        "--step", "12", "--out", str(tmp_path / "s.json")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Perfetto" in r.stdout and json.loads((tmp_path / "s.json").read_text())["ninefold"]["steps"] == [12]


def test_one_trace_writer_formats_exact_microseconds():
    """The writer both the export and the sample generators use: integer ns to µs text with no float on the way
    (an epoch time in ns is beyond what a double holds to the nanosecond)."""
    import json as _json

    from ninefold.analysis.chrome_trace import event, fmt_us
    from sample_traces import kineto_writer

    assert kineto_writer.fmt_us is fmt_us
    assert fmt_us(1735689602000000001) == "1735689602000000.001"
    assert fmt_us(-1) == "-0.001" and fmt_us(0) == "0.000" and fmt_us(999) == "0.999"
    ev = _json.loads(event("X", "kernel", 'a "quoted" \\ name', 1, 7, 1234567, 89, args='{"k": 1}'))
    assert ev == {"ph": "X", "cat": "kernel", "name": 'a "quoted" \\ name', "pid": 1, "tid": 7,
                  "ts": 1234.567, "dur": 0.089, "args": {"k": 1}}


def _kineto_files():
    """Every Kineto trace of the shared corpus: a JSON object whose first MiB names its traceEvents."""
    if not SHARED_TRACES.is_dir():
        return []
    out = []
    for p in sorted(SHARED_TRACES.rglob("*")):
        if not p.name.endswith((".json", ".json.gz")):
            continue
        try:
            with (gzip.open(p, "rb") if p.name.endswith(".gz") else open(p, "rb")) as f:
                head = f.read(1 << 20)
        except OSError:
            continue
        if head.lstrip().startswith(b"{") and b'"traceEvents"' in head:
            out.append(p)
    return out


def _export_round_trip(con, job, rank, out, tmp_path):
    """Export JOB's RANK to OUT: the text parses as JSON, and ingests again with the same GPU ops (relative to the
    rank's first one) and the same host threads, string thread ids included."""
    write_trace(con, job, out, rank=rank)
    doc = json.loads(out.read_text())
    assert doc["distributedInfo"]["rank"] == rank
    back = connect(tmp_path / f"back{rank}.duckdb")
    load_kineto(back, out, "back")
    q = ("SELECT kind, name, stream, end_ns - start_ns, start_ns - min(start_ns) OVER () FROM gpu_ops "
         "WHERE job = ? AND rank = ? ORDER BY ALL")
    assert back.execute(q, ["back", rank]).fetchall() == con.execute(q, [job, rank]).fetchall()
    tq = ("SELECT DISTINCT tid FROM host_ops WHERE job = ? AND rank = ? AND NOT starts_with(cat, 'ninefold_') "
          "ORDER BY 1")
    assert back.execute(tq, ["back", rank]).fetchall() == con.execute(tq, [job, rank]).fetchall()
    back.close()
    return doc


@needs_shared
@pytest.mark.parametrize("path", _kineto_files(), ids=lambda p: str(p.relative_to(SHARED_TRACES)))
def test_export_of_every_shared_kineto_trace_is_json_that_ingests_again(tmp_path, path):
    con = connect(tmp_path / "s.duckdb")
    load_kineto(con, path, "s", rank=0)
    attribute_job(con, "s")
    if not con.execute("SELECT count(*) FROM step_windows WHERE job = 's'").fetchone()[0]:
        with pytest.raises(ExportError, match="no attributed step windows"):
            export_trace(con, "s")
        return
    _export_round_trip(con, "s", 0, tmp_path / "s.json", tmp_path)
    con.close()


@needs_shared
@pytest.mark.parametrize("rank", [0, 1])
def test_export_of_a_2023_job_with_string_thread_ids(tmp_path, rank):
    """2 ranks of a 2023 TorchRec job, whose Kineto writes "tid": "PyTorch Profiler" for its own thread: each rank
    exports as JSON with that tid a string, and ingests again."""
    con = connect(tmp_path / "t.duckdb")
    for r in (0, 1):
        load_kineto(con, SHARED_TRACES / f"hta/trace_filter/sampled_rank-{r}.json.gz", "torchrec")
    attribute_job(con, "torchrec")
    doc = _export_round_trip(con, "torchrec", rank, tmp_path / f"r{rank}.json", tmp_path)
    assert "PyTorch Profiler" in {e.get("tid") for e in doc["traceEvents"]}
    con.close()


def test_event_writes_any_value_a_trace_carried_as_json():
    from ninefold.analysis.chrome_trace import event, meta

    odd = ["PyTorch Profiler", "", None, 7, -1, 2 ** 70, 1.5, True, 'quote " and \\ and \x01 and \u2028']
    for v in odd:
        ev = json.loads(event("X", v if isinstance(v, str) else "cpu_op", v, v, v, 1001, 2, args={"k": v},
                              extra={"id": v}))
        assert (ev["pid"], ev["tid"], ev["id"], ev["args"]["k"], ev["ts"], ev["dur"]) == (v, v, v, v, 1.001, 0.002)
        assert ev["name"] == v
        assert json.loads(meta(v, v, "thread_name", str(v)))["tid"] == v
