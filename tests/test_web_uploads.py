"""Uploads: content-addressed storage, the manifest, the background writer and the read path beside it."""
import gzip
import threading
import time
from pathlib import Path

import duckdb
import pytest

from ninefold.web import data_store
from ninefold.dashboards import queries
from sample_traces.demo_store import sample_files
from ninefold.web.server import ServeConfig, check_config
from ninefold.web.uploads import ChunkWriter, UploadStore, Writer, safe_name
from ninefold.store.errors import NinefoldError


def _wait(writer, timeout=60):
    t0 = time.monotonic()
    while not writer.idle():
        assert time.monotonic() - t0 < timeout, "writer did not finish"
        time.sleep(0.05)


def test_upload_is_stored_by_sha256_ingested_and_attributed(tmp_path):
    db = tmp_path / "s.duckdb"
    store = UploadStore(db)
    writer = Writer(store).start()
    files = sample_files("dp4")
    entries = []
    for f in files:
        w = ChunkWriter(store, f.name, "dp4up")
        data = f.read_bytes()
        for i in range(0, len(data), 7000):  # arrives in chunks
            w.write(data[i:i + 7000])
        entries.append(w.finish())
        writer.submit(entries[-1])
    _wait(writer)
    import hashlib

    for f, e in zip(files, entries):
        sha = hashlib.sha256(f.read_bytes()).hexdigest()
        assert e["sha256"] == sha
        assert (tmp_path / "uploads" / sha / f.name).read_bytes() == f.read_bytes()
    latest = store.entries()
    assert [e["status"] for e in latest] == ["attributed"] * 4
    # each upload says what its trace supports, and what to change where it does not (as `ninefold inspect`)
    assert all("this trace supports: ledgers yes" in e["message"] for e in latest)
    assert all("memory_ledger no (torch.profiler.profile(profile_memory=True))" in e["message"] for e in latest)
    assert not list((tmp_path / "uploads" / ".partial").iterdir())
    with data_store.read_connection(db) as con:
        j = queries.jobs(con)
        assert j.filter(j["job"] == "dp4up")["status"][0] == "attributed"
        assert j.filter(j["job"] == "dp4up")["n_ranks"][0] == 4
        up = con.execute("SELECT status, count(*) FROM uploads GROUP BY status").fetchall()
        assert up == [("attributed", 4)]
    # the same bytes again: stored once, ingest is a no-op
    again = store.store_bytes(files[0].name, files[0].read_bytes(), "dp4up")
    writer.submit(again)
    _wait(writer)
    assert [e["status"] for e in store.entries() if e["sha256"] == again["sha256"]] == ["unchanged"]
    writer.stop()


def test_broken_upload_fails_with_a_message_and_stores_nothing(tmp_path):
    db = tmp_path / "s.duckdb"
    store = UploadStore(db)
    writer = Writer(store).start()
    good = gzip.decompress(sample_files("dp4")[0].read_bytes())
    e = store.store_bytes("rank-0.json", good[: len(good) // 2], "cut")
    writer.submit(e)
    _wait(writer)
    last = store.entries()[-1]
    assert last["status"] == "failed"
    assert "rank-0.json" in last["message"] and "truncated" in last["message"]
    with data_store.read_connection(db) as con:
        assert con.execute("SELECT count(*) FROM traces WHERE job = 'cut'").fetchall()[0][0] == 0
        j = queries.jobs(con)
        assert j.filter(j["job"] == "cut")["status"][0] == "failed"
    writer.stop()


def test_finished_uploads_survive_a_restart(tmp_path):
    db = tmp_path / "s.duckdb"
    store = UploadStore(db)
    e = store.store_bytes("rank-1.json.gz", sample_files("dp4")[1].read_bytes(), "later")
    assert store.entries()[-1]["status"] == "queued"   # recorded before any ingest
    # a new server process: the manifest is read back and the queued upload is processed
    store2 = UploadStore(db)
    assert [x["sha256"] for x in store2.entries()] == [e["sha256"]]
    writer = Writer(store2).start()
    _wait(writer)
    assert store2.entries()[-1]["status"] == "attributed"
    writer.stop()


def test_upload_limits_and_names(tmp_path):
    store = UploadStore(tmp_path / "s.duckdb", max_bytes=10_000)
    w = ChunkWriter(store, "rank-0.json", "j")
    w.write(b"x" * 6_000)
    with pytest.raises(NinefoldError, match="larger than this server's upload limit of 10000 bytes"):
        w.write(b"x" * 6_000)
    assert not list((tmp_path / "uploads" / ".partial").iterdir())
    with pytest.raises(NinefoldError, match="evil.exe: not a trace file"):
        ChunkWriter(store, "evil.exe", "j")
    with pytest.raises(NinefoldError, match="a job name is needed"):
        ChunkWriter(store, "a.json", "  ")
    assert safe_name("../../etc/rank-0.json") == "rank-0.json"
    assert safe_name("..\\x\\.hidden.json") == "hidden.json"


def test_reads_wait_for_the_writer_instead_of_failing(tmp_path):
    """In one process a read-only and a read-write connection cannot coexist: reads queue behind the writer."""
    db = tmp_path / "s.duckdb"
    from ninefold.store.connection import connect

    connect(db).close()
    got = []
    with data_store.GATE.write():
        con = connect(db)
        t = threading.Thread(target=lambda: got.append(data_store.cached(db, queries.jobs).height))
        t.start()
        time.sleep(0.3)
        assert not got  # blocked while the writer holds the store
        con.execute("INSERT INTO jobs (job, world_size) VALUES ('w', 1)")
        con.close()
        data_store.bump_generation()
    t.join(10)
    assert got == [1]


def test_read_of_a_store_locked_by_another_process_gives_up_with_a_message(tmp_path):
    import subprocess
    import sys

    db = tmp_path / "s.duckdb"
    duckdb.connect(str(db)).close()
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(db)!r}); "
                               "print('locked', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(data_store.StoreBusy, match="locked by another process"):
            with data_store.read_connection(db, wait_s=0.5):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_serve_config_refusals():
    with pytest.raises(NinefoldError, match="refusing to serve on non-loopback address 0.0.0.0 without "
                                            "authentication"):
        check_config(ServeConfig(db="x", host="0.0.0.0"))
    check_config(ServeConfig(db="x", host="0.0.0.0", token="s3cret-token"))
    check_config(ServeConfig(db="x", host="127.0.0.1"))
    check_config(ServeConfig(db="x", host="::1"))
    with pytest.raises(NinefoldError, match="USER:PASS"):
        check_config(ServeConfig(db="x", host="10.0.0.1", basic_auth="nopass"))
    with pytest.raises(NinefoldError, match="either --token or --basic-auth"):
        check_config(ServeConfig(db="x", token="abcdefgh1", basic_auth="a:b"))


def test_abandoned_partials_are_swept_and_capped(tmp_path):
    import subprocess
    import sys

    db = tmp_path / "s.duckdb"
    store = UploadStore(db, max_bytes=10_000)
    # a partial of a server process that is gone is removed at the next start; our own in-flight one stays
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (store.partial / f"{dead.pid}-1-2-rank-0.json").write_bytes(b"x" * 5000)
    w = ChunkWriter(store, "rank-1.json", "j")
    w.write(b"{" * 100)
    store2 = UploadStore(db, max_bytes=10_000)
    assert sorted(p.name for p in store2.partial.iterdir()) == [w.tmp.name]
    # an aborted upload (the browser session ended) leaves nothing and frees its bytes
    w.abort()
    assert not list(store.partial.iterdir()) and store.partial_bytes == 0
    # all uploads in flight together hold at most PARTIAL_FACTOR x max_bytes
    open_ = [ChunkWriter(store, f"rank-{i}.json", "j") for i in range(5)]
    for x in open_[:4]:
        x.write(b" " * 9_000)
    with pytest.raises(NinefoldError, match="uploads in progress already hold 36000 bytes"):
        open_[4].write(b" " * 9_000)
    assert not open_[4].tmp.exists()
    for x in open_[:4]:
        x.abort()
    assert store.partial_bytes == 0 and not list(store.partial.iterdir())


def test_an_upload_meeting_a_locked_store_waits_and_lands(tmp_path, monkeypatch):
    import subprocess
    import sys

    import ninefold.web.uploads as up
    import ninefold.store.connection

    monkeypatch.setattr(ninefold.store.connection, "WAIT_SECONDS", 0.3)
    monkeypatch.setattr(up, "RETRY_BASE_S", 0.5)
    db = tmp_path / "s.duckdb"
    from ninefold.store.connection import connect

    connect(db).close()
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('locked', flush=True); time.sleep(3)", str(db)], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "locked"
    store = UploadStore(db)
    writer = Writer(store).start()
    f = sample_files("dp4")[0]
    writer.submit(store.store_bytes(f.name, f.read_bytes(), "lk"))
    seen = set()
    t0 = time.monotonic()
    while not writer.idle() or time.monotonic() - t0 < 0.5:
        seen |= {e["status"] for e in store.entries()}
        assert time.monotonic() - t0 < 60
        time.sleep(0.05)
    holder.wait()
    writer.stop()
    (e,) = store.entries()
    assert "waiting" in seen and e["status"] == "attributed", (seen, e)
    # a restart resumes an upload left waiting
    store.record(sha256=e["sha256"], name=e["name"], job=e["job"], path=e["path"], bytes=e["bytes"],
                 status="waiting", message="retry 1")
    w2 = Writer(store).start()
    _wait(w2)
    w2.stop()
    assert store.entries()[0]["status"] in ("attributed", "unchanged")


def test_a_long_name_keeps_its_suffix_and_lands(tmp_path):
    long = "rank-0-" + "x" * 300 + ".json.gz"
    short = safe_name(long)
    assert len(short) == 200 and short.endswith(".json.gz") and short.startswith("rank-0-xxx")
    assert safe_name("a" * 250 + ".nsys-rep.sqlite").endswith(".nsys-rep.sqlite")
    assert safe_name("a" * 250 + ".JSON").endswith(".JSON")
    db = tmp_path / "s.duckdb"
    store = UploadStore(db)
    writer = Writer(store).start()
    writer.submit(store.store_bytes(long, sample_files("dp4")[0].read_bytes(), "longname"))
    _wait(writer)
    last = store.entries()[-1]
    assert last["status"] == "attributed" and last["name"] == short, last
    writer.stop()


def test_failed_uploads_say_what_to_do_in_the_browser_and_keep_no_bytes(tmp_path):
    from sample_traces.generate import generate

    db = tmp_path / "s.duckdb"
    store = UploadStore(db)
    writer = Writer(store).start()
    # cut short: the reader's CLI advice (--salvage) becomes what the person uploading can do
    good = gzip.decompress(sample_files("dp4")[0].read_bytes())
    cut = store.store_bytes("rank-0.json", good[: len(good) // 2], "cut")
    writer.submit(cut)
    _wait(writer)
    last = store.entries()[-1]
    assert last["status"] == "failed" and "truncated" in last["message"], last
    assert "upload the complete file again" in last["message"] and "use --salvage" not in last["message"]
    # its bytes are gone, the record of the failure stays
    assert not (tmp_path / "uploads" / cut["sha256"]).exists()
    assert last["sha256"] == cut["sha256"] and last["bytes"] == len(good) // 2 and last["name"] == "rank-0.json"
    assert store.stored_bytes == 0
    # a second file for a rank the job already has: --replace becomes "another job name"
    first = store.store_bytes("rank-0.json.gz", sample_files("dp4")[0].read_bytes(), "twice")
    writer.submit(first)
    _wait(writer)
    generate(tmp_path / "other", ranks=2, steps=1, seed=3)
    other = store.store_bytes("rank-0.json", (tmp_path / "other" / "rank-0.json").read_bytes(), "twice")
    writer.submit(other)
    _wait(writer)
    by_sha = {e["sha256"]: e for e in store.entries()}
    assert by_sha[first["sha256"]]["status"] == "attributed"
    msg = by_sha[other["sha256"]]["message"]
    assert by_sha[other["sha256"]]["status"] == "failed" and "upload it under another job name" in msg, msg
    assert "pass --replace" not in msg
    assert Path(first["path"]).exists() and not Path(other["path"]).exists()
    assert store.stored_bytes == Path(first["path"]).stat().st_size
    writer.stop()


def test_a_failed_upload_of_bytes_another_job_uses_keeps_them(tmp_path):
    db = tmp_path / "s.duckdb"
    store = UploadStore(db)
    data = sample_files("dp4")[1].read_bytes()
    a = store.store_bytes("rank-1.json.gz", data, "a")
    store.record(**dict(a, status="attributed"))
    b = store.store_bytes("rank-1.json.gz", data, "b")
    assert not store.discard(dict(b, status="failed")) and Path(a["path"]).exists()
    store.record(**dict(a, status="failed"))
    assert store.discard(dict(b, status="failed")) and not Path(a["path"]).exists()


def test_the_uploads_folder_has_a_total_cap(tmp_path):
    db = tmp_path / "s.duckdb"
    store = UploadStore(db, max_bytes=10_000, max_total_bytes=25_000)
    for i in range(2):
        store.store_bytes(f"rank-{i}.json", bytes([i]) * 10_000, "j")
    assert store.stored_bytes == 20_000
    w = ChunkWriter(store, "rank-2.json", "j")
    w.write(b"2" * 4_000)
    with pytest.raises(NinefoldError, match=r"the uploads folder is full: it holds 20000 bytes of stored uploads "
                                            r"and 4000 arriving, and this server keeps at most 25000 \(serve "
                                            r"--max-uploads-total-bytes\)"):
        w.write(b"2" * 4_000)
    assert not list(store.partial.iterdir()) and store.partial_bytes == 0
    # a restarted server counts what is on disk
    store2 = UploadStore(db, max_bytes=10_000, max_total_bytes=25_000)
    assert store2.stored_bytes == 20_000
    with pytest.raises(NinefoldError, match="the uploads folder is full"):
        store2.store_bytes("rank-3.json", b"3" * 6_000, "j")
    first = store2.entries()[0]
    assert store2.discard(dict(first, status="failed"))
    store2.store_bytes("rank-3.json", b"3" * 6_000, "j")
    assert store2.stored_bytes == 16_000
    with pytest.raises(NinefoldError, match="--max-uploads-total-bytes"):
        check_config(ServeConfig(db="x", max_upload_bytes=10, max_uploads_total_bytes=5))
