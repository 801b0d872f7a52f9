"""Readers while a writer works: `ninefold ledgers` in a loop, in two processes at once, while another process
re-ingests a job from other traces and re-attributes it, again and again. Every read completes (waiting for the
writer's lock where it must), with no traceback, and shows the job's ledgers as they were before a write or after
it, never a mix; every write completes too, though readers hold the file whenever it is free."""
import subprocess
import sys
import threading

from conftest import ROOT
from sample_traces.alltoall2023 import generate_a2a

CLI = [sys.executable, "-m", "ninefold.cli.main", "--wait", "120"]


def _run(*args):
    return subprocess.run(CLI + [str(a) for a in args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _ledgers(db):
    return _run("ledgers", "--db", db, "--job", "j", "--format", "csv")


def test_readers_see_old_or_new_ledgers_while_a_writer_ingests_and_attributes(tmp_path):
    versions = {}
    for seed in (0, 1):
        d = tmp_path / f"v{seed}"
        generate_a2a(d, ranks=2, steps=2, seed=seed)
        ref = tmp_path / f"ref{seed}.duckdb"
        assert _run("ingest", d, "--db", ref, "--job", "j").returncode == 0
        assert _run("attribute", "--db", ref, "--job", "j").returncode == 0
        r = _ledgers(ref)
        assert r.returncode == 0 and r.stdout.startswith("rank,step,ledger,ns"), r.stderr
        versions[seed] = (d, r.stdout)
    assert versions[0][1] != versions[1][1]  # the two states are told apart by what a reader prints
    db = tmp_path / "live.duckdb"
    assert _run("ingest", versions[0][0], "--db", db, "--job", "j").returncode == 0
    assert _run("attribute", "--db", db, "--job", "j").returncode == 0

    writes, reads = [], []
    done = threading.Event()

    def writer():
        try:
            for seed in (1, 0, 1):
                writes.append(_run("ingest", versions[seed][0], "--db", db, "--job", "j", "--replace"))
                writes.append(_run("attribute", "--db", db, "--job", "j"))
        finally:
            done.set()

    def reader():
        while not done.is_set():
            reads.append(_ledgers(db))

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads)
    for w in writes:
        assert w.returncode == 0 and "Traceback" not in w.stderr, w.stderr
    assert len(reads) >= 4, len(reads)
    for r in reads:
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == 0, r.stderr
        assert r.stdout in (versions[0][1], versions[1][1]), r.stdout[:400]
    final = _ledgers(db)
    assert final.returncode == 0 and final.stdout == versions[1][1]
