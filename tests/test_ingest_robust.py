"""Bytes no format promises: text that is not UTF-8 in an nsys export, a fatal DuckDB error on one file, JSON
nested deeper than the parser goes. Each file lands or fails in one line; the others land; stored rows stay."""
import sqlite3
import subprocess
import sys


from conftest import ROOT, needs_shared
from ninefold.ingest.load import ingest_paths
from ninefold.store.connection import connect
from test_ingest_errors import _trace
from test_nsys_ingest import _synthetic

TABLES = ("traces", "gpu_ops", "host_ops", "steps", "collectives", "fr_dumps", "fr_entries")
DEEP = sys.getrecursionlimit() + 1000      # past what Python's JSON parser takes, whatever the stack holds
NESTED = "[" * DEEP + "]" * DEEP


def _counts(con, job):
    return {t: con.execute(f"SELECT count(*) FROM {t} WHERE job = ?", [job]).fetchone()[0] for t in TABLES}


def _store_with_old_job(tmp_path):
    """A store holding job 'old' (one Kineto rank), and its row counts."""
    old = tmp_path / "old" / "rank-0.json"
    old.parent.mkdir()
    old.write_text(_trace(rank=0))
    con = connect(tmp_path / "s.duckdb")
    assert [r.status for r in ingest_paths(con, [old])] == ["stored"]
    return con, _counts(con, "old")


def _bad_text(path, string_ids: dict):
    """Overwrite StringIds values with raw bytes (SQLite stores text unchecked)."""
    c = sqlite3.connect(path)
    for i, raw in string_ids.items():
        c.execute("UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id = ?", [raw, i])
    c.commit()
    c.close()


@needs_shared
def test_nsys_text_that_is_not_utf8_is_repaired_and_the_next_file_lands(tmp_path):
    con, before = _store_with_old_job(tmp_path)
    bad, good = tmp_path / "a" / "x.sqlite", tmp_path / "b" / "x.sqlite"
    for p in (bad, good):
        p.parent.mkdir()
        _synthetic(p)
    # a lone surrogate as CESU-8 in a kernel name, a cut character and a NUL in a CUDA API name
    _bad_text(bad, {1: b"ampere_\xed\xa0\x80sgemm", 3: b"cudaLaunch\xe2\x82Kernel\x00_v7000"})
    res = ingest_paths(con, [bad, good])
    assert [(r.job, r.status) for r in res] == [("a", "stored")] * 2 + [("b", "stored")] * 2, [r.message for r in res]
    names = {n for (n,) in con.execute("SELECT DISTINCT name FROM gpu_ops WHERE job = 'a'").fetchall()}
    assert "ampere_\ufffdsgemm" in names or "ampere_\ufffd\ufffd\ufffdsgemm" in names, names
    api = {n for (n,) in con.execute("SELECT DISTINCT name FROM host_ops WHERE job = 'a' AND cat = 'cuda_runtime'")
           .fetchall()}
    assert any("\ufffd" in n and n.startswith("cudaLaunch") for n in api), api
    (n,) = con.execute("SELECT sum(count) FROM diagnostics WHERE job = 'a' AND code = 'repaired_strings'").fetchone()
    assert n == 2
    assert _counts(con, "old") == before
    con.close()


@needs_shared
def test_a_fatal_duckdb_error_fails_its_file_in_one_line_and_the_store_is_reopened(tmp_path, monkeypatch):
    # the repair off: the bytes reach DuckDB, whose regexp_replace fails fatally and invalidates the database
    monkeypatch.setattr("ninefold.ingest.nsys_read._Src._valid_utf8", lambda self, col: col)
    con, before = _store_with_old_job(tmp_path)
    bad, good = tmp_path / "a" / "x.sqlite", tmp_path / "b" / "x.sqlite"
    for p in (bad, good):
        p.parent.mkdir()
        _synthetic(p)
    _bad_text(bad, {3: b"cudaLaunch\xed\xa0\x80Kernel_v7000"})
    res = ingest_paths(con, [bad, good])
    assert [(r.job, r.status) for r in res] == [("a", "failed"), ("b", "stored"), ("b", "stored")]
    msg = res[0].message
    assert str(bad) in msg and "\n" not in msg and "fatal" in msg, msg
    con = connect(tmp_path / "s.duckdb")
    assert _counts(con, "old") == before
    assert not any(_counts(con, "a").values())
    assert _counts(con, "b")["gpu_ops"] > 0
    con.close()


@needs_shared
def test_a_fatal_error_in_an_in_memory_store_names_the_files_it_could_not_try(tmp_path, monkeypatch):
    import duckdb

    from ninefold.store.schema import create_all

    monkeypatch.setattr("ninefold.ingest.nsys_read._Src._valid_utf8", lambda self, col: col)
    bad, good = tmp_path / "a" / "x.sqlite", tmp_path / "b" / "x.sqlite"
    for p in (bad, good):
        p.parent.mkdir()
        _synthetic(p)
    _bad_text(bad, {3: b"cudaLaunch\xed\xa0\x80Kernel_v7000"})
    con = duckdb.connect()          # as inspect reads files: nothing to reopen
    create_all(con)
    res = ingest_paths(con, [bad, good])
    assert [(r.job, r.status) for r in res] == [("a", "failed"), ("b", "failed")]
    assert "fatal" in res[0].message and res[1].message.startswith(f"{good}: not attempted"), res[1].message
    assert all("\n" not in r.message for r in res)


def _deep_files(d):
    """(directory, the file nested too deep, the valid rank file beside it) for each JSON reader."""
    out = {}
    for name in ("kineto_head", "kineto_tail", "fr", "fr_ranks", "side"):
        (d / name).mkdir()
    out["kineto_head"] = d / "kineto_head" / "rank-1.json"
    out["kineto_head"].write_text(_trace(rank=1).replace('"schemaVersion": 1', f'"schemaVersion": 1, "x": {NESTED}'))
    out["kineto_tail"] = d / "kineto_tail" / "rank-1.json"
    out["kineto_tail"].write_text(_trace(rank=1)[:-1] + f', "x": {NESTED}}}')
    out["fr"] = d / "fr" / "rank-1.fr.json"
    out["fr"].write_text(f'{{"entries": [], "version": "2.4", "pg_config": {{"0": {NESTED}}}}}')
    out["fr_ranks"] = d / "fr_ranks" / "rank-1.fr.json"      # a group's ranks: a JSON string to parse again
    out["fr_ranks"].write_text('{"entries": [], "version": "2.4", "pg_config": {"0": {"name": "0", "ranks": "'
                               + NESTED + '"}}}')
    out["side"] = d / "side" / "manifest.json"
    out["side"].write_text(f'{{"x": {NESTED}}}')
    for name in out:
        (d / name / "rank-0.json").write_text(_trace(rank=0))
    return out


def test_json_nested_too_deep_is_one_line_per_file_and_the_rank_beside_it_lands(tmp_path):
    files = _deep_files(tmp_path)
    con = connect(tmp_path / "s.duckdb")
    for name, deep in files.items():
        res = {r.path: r for r in ingest_paths(con, [deep.parent])}
        assert res[str(deep.parent / "rank-0.json")].status == "stored", name
        r = res[str(deep)]
        if name == "fr_ranks":    # the group's members cannot be read: the dump lands without them
            assert r.status == "stored", (name, r.message)
            continue
        assert r.status == ("skipped" if name == "side" else "failed"), (name, r.status, r.message)
        assert r.message.startswith(str(deep)) and "JSON nested deeper than" in r.message, (name, r.message)
        assert "\n" not in r.message
        assert not con.execute("SELECT count(*) FROM traces WHERE job = ? AND rank = 1", [name]).fetchone()[0]
    con.close()


def test_inspect_and_ingest_say_one_line_for_a_deep_file(tmp_path):
    files = _deep_files(tmp_path)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    for cmd in (["inspect", str(files["kineto_head"].parent)],
                ["ingest", str(files["fr"].parent), "--db", str(tmp_path / "c.duckdb")]):
        p = subprocess.run([sys.executable, "-m", "ninefold.cli.main", *cmd], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
        out = p.stdout + p.stderr
        assert "Traceback" not in out, out
        assert [ln for ln in out.splitlines() if "JSON nested deeper than" in ln], out
    assert p.returncode == 1, out       # ingest: one file failed, the other stored
