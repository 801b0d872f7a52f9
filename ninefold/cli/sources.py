"""Commands over the non-profiler sources: NCCL logs, nccl-tests tables, Flight Recorder dumps."""
from __future__ import annotations

import json
import sys

import click


def register(cli) -> None:
    cli.add_command(hang)
    cli.add_command(nccl)


def _open(db):
    from ninefold.cli.store import open_store

    return open_store(db)   # a missing store or a file that is not one: one line, as every read command says it


@click.command()
@click.option("--db", required=True, help="DuckDB file")
@click.option("--job", required=True, help="job whose Flight Recorder dumps to read")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def hang(db, job, fmt):
    """Which ranks never reached a process group's highest collective (from Flight Recorder dumps)."""
    from ninefold.analysis.hang import format_table, hang_report

    con = _open(db)
    rep = hang_report(con, job)
    if not rep["n_dumps"]:
        click.echo(f"error: no Flight Recorder dumps for job {job!r} in {db}; ingest them first", err=True)
        sys.exit(2)
    click.echo(json.dumps(rep, default=str) if fmt == "json" else format_table(rep))
    sys.exit(1 if rep["hung_groups"] else 0)


@click.command()
@click.option("--db", required=True, help="DuckDB file")
@click.option("--job", default=None, help="one job (default: every job with NCCL logs)")
def nccl(db, job):
    """Per communicator: COLL line counts per op, bytes, algorithms; WARN/error counts; desyncs."""
    from ninefold.ingest.nccl_log import desync

    con = _open(db)
    jobs = [job] if job else [r[0] for r in con.execute(
        "SELECT DISTINCT job FROM nccl_log_files ORDER BY job").fetchall()]
    if not jobs or not con.execute("SELECT count(*) FROM nccl_log_files WHERE job IN (SELECT unnest(?))",
                                   [jobs]).fetchone()[0]:
        click.echo(f"error: no NCCL logs{' for job ' + repr(job) if job else ''} in {db}", err=True)
        sys.exit(2)
    for j in jobs:
        files, version = con.execute("SELECT count(*), string_agg(DISTINCT nccl_version, ',') FROM nccl_log_files "
                                     "WHERE job = ?", [j]).fetchone()
        click.echo(f"job {j}: {files} log file(s), NCCL {version or '?'}")
        rows = con.execute("""
            SELECT coalesce(comm_id, comm, '?') AS communicator, any_value(nranks), op,
                   count(DISTINCT (host, pid, comm)) AS procs, list(DISTINCT rank ORDER BY rank) AS ranks,
                   count(*) AS n, sum(bytes) AS bytes,
                   string_agg(DISTINCT algorithm || '/' || protocol, ',') AS algos,
                   count(*) FILTER (truncated) AS cut
            FROM nccl_colls WHERE job = ? GROUP BY ALL ORDER BY communicator, op""", [j]).fetchall()
        click.echo(f"  {'communicator':20s} {'nranks':>6s} {'op':14s} {'procs':>5s} {'colls':>7s} {'GB':>10s}  "
                   f"algo/proto   ranks")
        for cid, nr, op, procs, ranks, n, b, algos, cut in rows:
            rk = ",".join(str(r) for r in ranks if r is not None) or "?"
            click.echo(f"  {cid:20s} {nr if nr is not None else '?':>6} {op:14s} {procs:5d} {n:7d} "
                       f"{(b or 0) / 1e9:10.3f}  {algos or '-':12s} {rk}" + (f"  ({cut} cut)" if cut else ""))
        ev = con.execute("SELECT level, count(*) FROM nccl_events WHERE job = ? GROUP BY level ORDER BY level",
                         [j]).fetchall()
        click.echo("  events: " + (", ".join(f"{lvl} {n}" for lvl, n in ev) or "none"))
        ds = desync(con, j)
        for d in ds:
            click.echo(f"  {d['kind']} on {d['communicator']} opCount {d['op_count']:x}: ops {d['ops']} counts "
                       f"{d['counts']}")
        diag = con.execute("SELECT code, sum(count) FROM diagnostics WHERE job = ? AND source IN ('nccl_log', 'nccl_tests') "
                           "GROUP BY code ORDER BY code", [j]).fetchall()
        if diag:
            click.echo("  diagnostics: " + ", ".join(f"{c} {n}" for c, n in diag))
