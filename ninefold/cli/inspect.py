"""`ninefold inspect`: what a trace can tell, before or after ingest."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click


def register(cli) -> None:
    cli.add_command(inspect)


@click.command(epilog="Example: ninefold inspect traces/run42/ --format json   |   "
                      "ninefold inspect --db nf.duckdb --job run42")
@click.argument("paths", nargs=-1)
@click.option("--db", default=None, help="inspect what a store holds instead of files")
@click.option("--job", default=None, help="with --db: one job (default: every job)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def inspect(paths, db, job, fmt):
    """Per trace file: what it contains and, per ninefold capability, whether this trace supports it (available,
    degraded, unavailable) with the profiler setting that would fix it. Files are read into a private in-memory
    store; nothing is written. Exit status: 2 when a path does not exist (a usage mistake, as for ingest), 1 when
    no file could be read, else 0."""
    from ninefold.analysis.inspect import format_text, inspect_store

    if bool(paths) == bool(db):
        raise click.UsageError("give trace files/directories, or --db (and optionally --job), not both")
    problems = []
    if db:
        from ninefold.cli.store import open_job, open_store

        con = open_job(db, job, ledgers=False) if job else open_store(db)
        entries = inspect_store(con, job)
    else:
        import duckdb

        from ninefold.ingest.load import ingest_paths
        from ninefold.store.schema import create_all

        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")
        create_all(con)

        from ninefold.store.errors import NinefoldError

        missing = [p for p in paths if not Path(p).exists()]
        for path in paths:
            try:
                results = ingest_paths(con, [path])
            except NinefoldError as e:  # e.g. a directory with no trace files
                problems.append(str(e))
                continue
            for r in results:
                if r.status == "failed" and ("pass --rank" in r.message or "already has" in r.message):
                    # no rank anywhere, or a second file for a rank of its directory's job: read it as a job of
                    # its own (rank 0 when it names none)
                    (r,) = ingest_paths(con, [r.path], job=str(r.path), rank=0 if "pass --rank" in r.message
                                        else None)
                    if r.status == "failed" and "pass --rank" in r.message:
                        (r,) = ingest_paths(con, [r.path], job=str(r.path), rank=0)
                if r.status == "failed":
                    problems.append(r.message)
        entries = inspect_store(con)
    if fmt == "json":
        click.echo(json.dumps({"traces": entries, "errors": problems}, default=str))
    else:
        if entries:
            click.echo(format_text(entries))
        for p in problems:
            click.echo(f"cannot read: {p}")
    sys.exit(2 if not db and missing else 1 if problems and not entries else 0)
