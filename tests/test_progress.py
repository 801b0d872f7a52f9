"""Long work shows progress: `ninefold attribute` draws a bar over each job's ranks on a terminal, prints one line
per job otherwise, nothing with --quiet; attribute_job reports each group of ranks it has written."""
import os
import pty
import subprocess
import sys

from conftest import ROOT


def _job(tmp_path, ranks=4):
    out = tmp_path / "job"
    subprocess.run([sys.executable, "-m", "sample_traces.generate", str(out), "--ranks", str(ranks), "--steps", "2"],
                   cwd=ROOT, check=True, capture_output=True)
    db = tmp_path / "nf.duckdb"
    subprocess.run([sys.executable, "-m", "ninefold.cli.main", "ingest", str(out), "--db", str(db), "--quiet"],
                   cwd=ROOT, check=True, capture_output=True)
    return db


def _read_all(fd) -> bytes:
    got = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got


def test_attribute_progress_bar_lines_and_quiet(tmp_path):
    db = _job(tmp_path)
    cli = [sys.executable, "-m", "ninefold.cli.main", "attribute", "--db", str(db)]
    plain = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True)
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr  # no bar where nobody watches
    assert len(plain.stdout.splitlines()) == 1 and plain.stdout.startswith("job: ")
    quiet = subprocess.run(cli + ["--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    m, s = pty.openpty()
    p = subprocess.run(cli, cwd=ROOT, stdout=subprocess.PIPE, stderr=s)
    os.close(s)
    err = _read_all(m)
    os.close(m)
    assert p.returncode == 0 and p.stdout.decode().startswith("job: ")
    assert b"attribute job" in err and b"4/4" in err and b"5/4" not in err, err


def test_attribute_job_reports_each_group_and_groups_change_nothing(tmp_path, monkeypatch):
    from ninefold.analysis.attribution import attribute as attribution
    from ninefold.analysis.attribution.rank_pass import rank_groups
    from ninefold.store.connection import connect

    db = _job(tmp_path, ranks=3)
    con = connect(str(db))
    seen = []
    attribution.attribute_job(con, "job", progress=lambda d, n: seen.append((d, n)))
    whole = con.execute("SELECT rank, step, ledger, ns FROM ledger_totals ORDER BY ALL").fetchall()
    assert seen == [(3, 3)]
    seen.clear()
    monkeypatch.setattr(attribution, "rank_groups", lambda c, j: rank_groups(c, j, max_ops=1))  # a rank a group
    attribution.attribute_job(con, "job", progress=lambda d, n: seen.append((d, n)))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert con.execute("SELECT rank, step, ledger, ns FROM ledger_totals ORDER BY ALL").fetchall() == whole
