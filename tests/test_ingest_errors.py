"""Bad input: one clear line naming the file, nothing partial stored, other files still land."""
import gzip
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from ninefold.ingest.load import ingest_paths, load_kineto
from ninefold.store.errors import IngestConflict, TraceFormatError


def _event(i, ts_ns, dur_ns=1000, cat="kernel", name="k"):
    return (f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": 0, "tid": 7, '
            f'"ts": {ts_ns // 1000}.{ts_ns % 1000:03d}, "dur": {dur_ns // 1000}.{dur_ns % 1000:03d}, '
            f'"args": {{"correlation": {i}, "External id": {i}}}}}')


def _trace(rank=0, n=5, base=1735689600000000000, extra_tail=True):
    evs = ",\n".join(_event(i, 1_000_000 + i * 5_000) for i in range(n))
    tail = ',\n  "traceName": "x.json"' if extra_tail else ""
    return (f'{{\n  "schemaVersion": 1,\n  "distributedInfo": {{"rank": {rank}, "world_size": 2}},\n'
            f'  "baseTimeNanoseconds": {base},\n  "traceEvents": [\n{evs}\n  ]{tail}\n}}')


def test_exact_ns_for_absolute_epoch_microseconds(db, tmp_path):
    # 1712345678901234.567 µs does not fit a double; the stored ns must be exact.
    p = tmp_path / "rank-3.json"
    p.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, '
                 '"tid": "7", "ts": 1712345678901234.567, "dur": 0.001}]}')
    r = load_kineto(db, p, "j")
    assert r.rank == 3
    assert db.execute("SELECT start_ns, end_ns FROM gpu_ops").fetchone() == (1712345678901234567, 1712345678901234568)
    assert db.execute("SELECT time_mode FROM traces").fetchone()[0] == "absolute_us"


@pytest.mark.parametrize("ts, dur", [
    ("1099511627775.999", "0.001"),        # just below 2^40 µs: read as a double, rounded to the exact ns
    ("999999999999.999", "123456789.987"),
    ("1099511627776.001", "0.001"),        # 2^40 µs and past it: read again as DECIMAL
    ("4503599627370497.001", "2.999"),     # past 2^52: a double would lose even the µs
])
def test_exact_ns_for_relative_times_either_side_of_the_double_limit(db, tmp_path, ts, dur):
    p = tmp_path / "rank-0.json"
    base = 1735689600000000000
    p.write_text(f'{{"baseTimeNanoseconds": {base}, "traceEvents": [{{"ph": "X", "cat": "kernel", "name": "k", '
                 f'"pid": 0, "tid": 7, "ts": {ts}, "dur": {dur}}}, {{"ph": "X", "cat": "cpu_op", "name": "h", '
                 f'"pid": 0, "tid": 1, "ts": 0.001, "dur": 0.002}}]}}')
    assert load_kineto(db, p, "j", rank=0).status == "stored"
    want = base + int(ts.replace(".", ""))
    assert db.execute("SELECT start_ns, end_ns FROM gpu_ops").fetchone() == (want, want + int(dur.replace(".", "")))
    assert db.execute("SELECT start_ns, end_ns FROM host_ops").fetchone() == (base + 1, base + 3)


@pytest.mark.parametrize("head, ts", [
    ('"baseTimeNanoseconds": 1735689600000000000, ', "2.01e49"),     # no DECIMAL(24,3) holds it
    ('"baseTimeNanoseconds": 1735689600000000000, ', "9300000000000000.5"),   # fits the decimal, not int64 ns
    ("", "9300000000000000"),                                        # absolute µs past 2262 CE
    ('"baseTimeNanoseconds": 9223372036854775807, ', "1.0"),        # a base no sum fits beside
])
def test_times_out_of_range_fail_in_one_line_and_store_nothing(db, tmp_path, head, ts):
    p = tmp_path / "rank-0.json"
    p.write_text(f'{{{head}"traceEvents": [{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
                 f'"ts": {ts}, "dur": 1.0}}]}}')
    with pytest.raises(TraceFormatError) as e:
        load_kineto(db, p, "j", rank=0)
    assert "rank-0.json" in str(e.value) and "range" in str(e.value) and "\n" not in str(e.value)
    assert db.execute("SELECT count(*) FROM gpu_ops").fetchone()[0] == 0


def test_relative_ts_adds_base(db, tmp_path):
    p = tmp_path / "t.json"
    p.write_text(_trace(rank=1))
    load_kineto(db, p, "j")
    assert db.execute("SELECT min(start_ns) FROM gpu_ops").fetchone()[0] == 1735689600000000000 + 1_000_000


def test_truncated_file_fails_with_offset_and_keeps_others(db, tmp_path):
    good = tmp_path / "rank-0.json"
    good.write_text(_trace(rank=0))
    text = _trace(rank=1, n=50)
    cut = tmp_path / "rank-1.json"
    cut.write_text(text[: len(text) // 2])
    res = ingest_paths(db, [tmp_path], job="j")
    by = {r.path.split("/")[-1]: r for r in res}
    assert by["rank-0.json"].status == "stored"
    assert by["rank-1.json"].status == "failed"
    msg = by["rank-1.json"].message
    assert "rank-1.json" in msg and "truncated" in msg and f"byte {len(text) // 2}" in msg and "\n" not in msg
    assert db.execute("SELECT count(*) FROM gpu_ops WHERE rank = 1").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM gpu_ops WHERE rank = 0").fetchone()[0] == 5


def test_salvage_keeps_complete_events(db, tmp_path):
    text = _trace(rank=1, n=50)
    cut_at = text.index(_event(30, 1_000_000 + 30 * 5_000)) + 20  # cut inside event 30
    p = tmp_path / "rank-1.json"
    p.write_text(text[:cut_at])
    r = load_kineto(db, p, "j", salvage=True)
    assert r.status == "stored" and r.counts["kernel"] == 30
    d = db.execute("SELECT code, count FROM diagnostics WHERE code = 'salvaged_truncated'").fetchone()
    assert d == ("salvaged_truncated", 30)


@pytest.mark.parametrize("content,needle", [
    (b"", "empty file"),
    (b"\x1f\x8b\x08\x00garbage-not-deflate", "corrupt gzip"),
    (b'{"hello": "world"}', "no \"traceEvents\""),
    (b"<html>", "not JSON"),
    (b'[{"ph": "X"}]', "bare JSON array"),
])
def test_bad_files_have_their_own_message(db, tmp_path, content, needle):
    p = tmp_path / "rank-0.json"
    p.write_bytes(content)
    with pytest.raises(TraceFormatError) as ei:
        load_kineto(db, p, "j")
    assert needle in str(ei.value) and str(p) in str(ei.value)
    assert db.execute("SELECT count(*) FROM traces").fetchone()[0] == 0


def test_malformed_event_reports_byte_offset(db, tmp_path):
    text = _trace(n=10).replace('"name": "k", "pid": 0, "tid": 7, "ts": 1025', '"name": "k" "pid": 0, "tid": 7, "ts": 1025')
    p = tmp_path / "rank-0.json"
    p.write_text(text)
    with pytest.raises(TraceFormatError) as ei:
        load_kineto(db, p, "j")
    assert "malformed JSON" in str(ei.value) and "byte " in str(ei.value)


def test_empty_directory(db, tmp_path):
    with pytest.raises(TraceFormatError, match="no trace files"):
        ingest_paths(db, [tmp_path])


def test_reingest_is_noop_and_conflicts_need_replace(db, tmp_path):
    a = tmp_path / "a" / "rank-0.json"
    a.parent.mkdir()
    a.write_text(_trace(rank=0))
    gz = tmp_path / "b.json.gz"
    gz.write_bytes(gzip.compress(_trace(rank=0, n=7).encode()))
    assert load_kineto(db, a, "j").status == "stored"
    assert load_kineto(db, a, "j").status == "unchanged"
    assert db.execute("SELECT count(*) FROM gpu_ops").fetchone()[0] == 5
    with pytest.raises(IngestConflict, match="--replace"):
        load_kineto(db, gz, "j")
    assert db.execute("SELECT count(*) FROM gpu_ops").fetchone()[0] == 5
    assert load_kineto(db, gz, "j", replace=True).status == "stored"
    assert db.execute("SELECT count(*) FROM gpu_ops").fetchone()[0] == 7
    assert db.execute("SELECT count(*) FROM traces").fetchone()[0] == 1


def test_missing_rank_asks_for_flag(db, tmp_path):
    p = tmp_path / "trace.json"
    p.write_text(_trace().replace('"distributedInfo": {"rank": 0, "world_size": 2},', ""))
    with pytest.raises(TraceFormatError, match="--rank"):
        load_kineto(db, p, "j")
    assert load_kineto(db, p, "j", rank=5).rank == 5


def test_cli_exit_codes(tmp_path):
    d = tmp_path / "job1"
    d.mkdir()
    (d / "rank-0.json").write_text(_trace(rank=0))
    (d / "rank-1.json").write_text(_trace(rank=1)[:150])
    run = lambda *a: subprocess.run([sys.executable, "-m", "ninefold.cli.main", *a], capture_output=True, text=True)
    r = run("ingest", str(d), "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 1
    assert "FAILED" in r.stdout and "job=job1" in r.stdout and "1 stored" in r.stdout
    r = run("ingest", str(d / "rank-0.json"), "--db", str(tmp_path / "x.duckdb"))
    assert r.returncode == 0 and "1 unchanged" in r.stdout


def test_directory_scan_skips_side_json_but_named_file_fails(tmp_path):
    from click.testing import CliRunner

    from ninefold.cli.main import cli

    d = tmp_path / "job"
    d.mkdir()
    (d / "rank-0.json").write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}))
    (d / "ground_truth.json").write_text(json.dumps({"seed": 1}))
    db = str(tmp_path / "x.duckdb")
    r = CliRunner().invoke(cli, ["ingest", str(d), "--db", db])
    assert r.exit_code == 0, r.output
    assert "SKIPPED" in r.output and "ground_truth.json" in r.output and "1 stored" in r.output
    r = CliRunner().invoke(cli, ["ingest", str(d / "ground_truth.json"), "--db", db])
    assert r.exit_code == 1 and "not a Kineto trace" in r.output


@pytest.mark.parametrize("gz", [False, True])
def test_a_big_side_json_is_skipped_too_whatever_its_size(tmp_path, gz):
    """A ground truth of a long generated run is megabytes: still a side file; a big trace whose traceEvents key
    comes after megabytes of metadata is still a trace."""
    import gzip as gzip_

    from ninefold.ingest.load import discover

    d = tmp_path / "job"
    d.mkdir()
    (d / "rank-0.json").write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": []}))
    side = json.dumps({"steps": [{"step": i, "window_ns": [i, i + 1], "note": "x" * 40} for i in range(60_000)]})
    late = json.dumps({"distributedInfo": {"rank": 1}, "deviceProperties": [{"pad": "y" * (3 << 20)}],
                       "traceEvents": []})
    assert len(side) > 3 << 20
    for name, text in (("ground_truth.json", side), ("rank-1.json", late)):
        if gz:
            with gzip_.open(d / (name + ".gz"), "wt") as fh:
                fh.write(text)
        else:
            (d / name).write_text(text)
    skipped = []
    kept = [f.name for f, _ in discover([d], skipped=skipped)]
    ext = ".gz" if gz else ""
    assert kept == ["rank-0.json", f"rank-1.json{ext}"]
    assert [f.name for f, _, _ in skipped] == [f"ground_truth.json{ext}"]


def test_side_json_left_out_by_every_directory_scan(tmp_path):
    """The shared discovery drops side JSON files, so the nightly batch does not fail a job for them."""
    from ninefold.ingest.load import discover
    from ninefold.batch.nightly import discover_jobs

    d = tmp_path / "root" / "job"
    d.mkdir(parents=True)
    (d / "rank-0.json").write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": []}))
    (d / "ground_truth.json").write_text(json.dumps({"seed": 1}))
    (d / "rank-1.json").write_text('{"traceEvents": [{"ph": ')          # broken: kept, fails on its own
    skipped = []
    assert [f.name for f, _ in discover([d], skipped=skipped)] == ["rank-0.json", "rank-1.json"]
    assert [(f.name, j) for f, j, _ in skipped] == [("ground_truth.json", "job")]
    jobs = discover_jobs(tmp_path / "root")
    assert [(j.name, [f.name for f in j.files], j.error) for j in jobs] == [("job", ["rank-0.json", "rank-1.json"], None)]


def test_ingest_shows_a_bar_on_a_terminal_one_line_per_file_otherwise_and_quiet_silences_it(tmp_path):
    import os
    import pty

    from conftest import ROOT

    d = tmp_path / "job"
    for r in range(3):
        (d / f"rank-{r}.json").parent.mkdir(exist_ok=True)
        (d / f"rank-{r}.json").write_text(json.dumps({"distributedInfo": {"rank": r, "world_size": 3},
                                                      "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k",
                                                                       "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}))
    (d / "ground_truth.json").write_text(json.dumps({"seed": 1}))
    cli = [sys.executable, "-m", "ninefold.cli.main", "ingest", str(d)]
    plain = subprocess.run(cli + ["--db", str(tmp_path / "a.duckdb")], cwd=ROOT, capture_output=True, text=True)
    lines = plain.stdout.splitlines()
    assert plain.returncode == 0 and sum(x.startswith("STORED") for x in lines) == 3, plain.stdout
    assert plain.stderr == ""  # no bar where nobody watches
    quiet = subprocess.run(cli + ["--db", str(tmp_path / "b.duckdb"), "--quiet"], cwd=ROOT, capture_output=True,
                           text=True)
    assert quiet.returncode == 0 and quiet.stdout.splitlines() == [quiet.stdout.strip()]
    assert "3 stored" in quiet.stdout and "1 skipped" in quiet.stdout
    m, s = pty.openpty()  # stderr a terminal: a bar counts the four files, the skip is still printed
    p = subprocess.run(cli + ["--db", str(tmp_path / "c.duckdb")], cwd=ROOT, stdout=subprocess.PIPE, stderr=s)
    os.close(s)
    err = b""
    while True:
        try:
            chunk = os.read(m, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(m)
    out = p.stdout.decode()
    assert p.returncode == 0 and "SKIPPED" in out and "STORED" not in out and "3 stored" in out
    assert b"ingest" in err and b"4/4" in err and b"5/4" not in err, err


def test_out_of_memory_fails_each_file_in_one_line_and_keeps_the_store(db, tmp_path):
    # DuckDB refusing memory is the machine's limit, not the file's fault: each file fails in one line naming
    # it and the limit, its transaction rolled back, the rows already stored kept; with the limit lifted the
    # same files load
    from sample_traces.generate import generate
    from ninefold.store.schema import PER_TRACE

    keep = sorted((ROOT / "sample_traces" / "dp4").glob("rank-*.json.gz"))[:1]
    assert [r.status for r in ingest_paths(db, keep, job="keep")] == ["stored"]
    before = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in PER_TRACE + ["traces"]}
    generate(tmp_path / "big", ranks=2, steps=3, seed=2, target_mb=12)
    files = sorted((tmp_path / "big").glob("rank-*.json"))
    db.execute("SET memory_limit = '48MB'")
    res = ingest_paths(db, files, job="big")
    assert [r.status for r in res] == ["failed", "failed"]
    for f, r in zip(files, res):
        assert r.message.startswith(f"{f}: out of memory while ingesting (") and "memory_limit is" in r.message
        assert "\n" not in r.message
    assert {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in before} == before
    db.execute("RESET memory_limit")
    assert [r.status for r in ingest_paths(db, files, job="big")] == ["stored", "stored"]


def test_cli_says_out_of_memory_in_one_line(monkeypatch, tmp_path):
    import duckdb
    from click.testing import CliRunner

    import ninefold.analysis.attribution.attribute
    from ninefold.cli.main import cli

    def oom(*a, **k):
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate data of size 128.0 MiB\nhints")

    monkeypatch.setattr(ninefold.analysis.attribution.attribute, "attribute_job", oom)
    db = str(tmp_path / "o.duckdb")
    r0 = CliRunner().invoke(cli, ["ingest", str(ROOT / "sample_traces" / "dp4"), "--job", "j", "--db", db])
    assert r0.exit_code == 0, r0.output
    r = CliRunner().invoke(cli, ["attribute", "--db", db, "--quiet"])
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert lines == ["error: out of memory in DuckDB (Out of Memory Error: failed to allocate data of size 128.0 MiB); "
                     "nothing was half-written: free memory or run with fewer jobs at once"]
