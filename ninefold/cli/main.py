"""The ninefold command line. Library errors become one line and a non-zero exit."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from ninefold.store.errors import NinefoldError


class _Group(click.Group):
    """Library errors that escape a command (e.g. a store locked past --wait) become one line, exit 2; so does
    DuckDB running out of memory (the machine's limit, not a bug: the command's transaction is rolled back)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except NinefoldError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except ModuleNotFoundError as e:
            extra = OPTIONAL.get((e.name or "").split(".")[0])
            if extra is None:
                raise
            click.echo(f"error: this command needs {e.name}: pip install 'ninefold[{extra}]'", err=True)
            sys.exit(2)
        except Exception as e:
            import duckdb

            if not isinstance(e, duckdb.OutOfMemoryException):
                raise
            first = " ".join(str(e).split("\n")[0].split())[:200]
            click.echo(f"error: out of memory in DuckDB ({first}); nothing was half-written: free memory or "
                       "run with fewer jobs at once", err=True)
            sys.exit(2)


# modules of the optional extras, by the extra that installs them
OPTIONAL = {"panel": "web", "bokeh": "web", "dask": "batch", "distributed": "batch"}


def _set_max_decompressed(ctx, param, value):
    if value is not None:
        import ninefold.ingest.kineto

        ninefold.ingest.kineto.MAX_DECOMPRESSED_BYTES = int(value)
    return value


def _set_wait(ctx, param, value):
    if value is not None:
        import ninefold.store.connection

        ninefold.store.connection.WAIT_SECONDS = float(value)
    return value


@click.group(cls=_Group, epilog="Start here: ninefold inspect TRACE_DIR/ ; ninefold ingest TRACE_DIR/ --db nf.duckdb --job run42 ; "
                    "ninefold attribute --db nf.duckdb ; ninefold ledgers --db nf.duckdb --job run42. "
                    "Capture advice: docs/capture.md")
@click.version_option(package_name="ninefold", prog_name="ninefold")
@click.option("--wait", type=float, default=None, callback=_set_wait, expose_value=False, is_eager=True,
              metavar="SECONDS", help="how long to wait for another process's lock on the store (default 30)")
@click.option("--max-decompressed-bytes", type=int, default=None, callback=_set_max_decompressed,
              expose_value=False, is_eager=True, metavar="N",
              help="refuse a .json.gz that decompresses to more than N bytes (default: 100x its compressed size, "
                   "at least 256 MiB; ingest, the upload page and inspect)")
def cli():
    """ninefold: where every nanosecond of every rank's step went."""


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--db", required=True, help="DuckDB file (created if missing)")
@click.option("--job", default=None, help="job name (default: the directory name)")
@click.option("--rank", type=int, default=None, help="rank, when neither the trace nor the file name has one")
@click.option("--replace", is_flag=True, help="overwrite a rank already stored from another file")
@click.option("--salvage", is_flag=True, help="keep the complete events of a truncated file")
@click.option("--quiet", is_flag=True, help="print only failures and the closing count (no line per file, no bar)")
@click.option("--jobs", type=click.IntRange(min=1), default=None, metavar="N",
              help="files parsed side by side while the previous one is written (default: the core count, at "
                   "most 4; 1 = one file at a time); each file is still one transaction, in order")
def ingest(paths, db, job, rank, replace, salvage, quiet, jobs):
    """Ingest trace files (or directories of per-rank files) into DB. On a terminal a progress bar counts the
    files (failures and skips are printed above it); otherwise one line per file."""
    from ninefold.ingest.load import discover, ingest_paths
    from ninefold.store.connection import connect

    t0 = time.perf_counter()
    new = not Path(db).exists()
    con = connect(db)
    bar = None
    if not quiet and sys.stderr.isatty():
        try:
            side = []
            n = len(discover(list(paths), skipped=side)) + len(side)
        except NinefoldError:
            n = 0
        if n > 1:
            bar = click.progressbar(length=n, label="ingest", file=sys.stderr, show_pos=True, show_eta=True,
                                    item_show_func=lambda p: Path(p).name if p else None)
            bar.__enter__()

    def show(r):
        if bar is not None:
            bar.update(1, str(r.path))
        if quiet and r.status != "failed" or bar is not None and r.status not in ("failed", "skipped"):
            return
        if bar is not None:
            click.echo("\r\033[K", nl=False, err=True)
        if r.status in ("failed", "skipped"):
            click.echo(f"{r.status.upper():7s} {r.message}")
        else:
            c = r.counts or {}
            if "kernel" in c:   # a profiler trace
                detail = (f"kernels={c.get('kernel', 0)} memcpy={c.get('memcpy', 0)} memset={c.get('memset', 0)} "
                          f"steps={c.get('steps', 0)} collectives={c.get('collectives', 0)}")
            else:               # logs and dumps report their own counters
                detail = " ".join(f"{k}={v}" for k, v in c.items() if isinstance(v, (int, str)))
            click.echo(f"{r.status.upper():7s} {r.path} job={r.job} rank={r.rank} {detail} {r.message}".rstrip())

    try:
        results = ingest_paths(con, list(paths), job=job, rank=rank, replace=replace, salvage=salvage,
                               on_result=show, jobs=jobs)
    except NinefoldError as e:
        con.close()
        if new:
            _remove_store(db)
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    failed = sum(r.status == "failed" for r in results)
    stored = sum(r.status == "stored" for r in results)
    same = sum(r.status == "unchanged" for r in results)
    skipped = sum(r.status == "skipped" for r in results)
    skip_note = f", {skipped} skipped" if skipped else ""
    parts = f" ({len(results)} parts)" if len(results) != len({r.path for r in results}) else ""
    click.echo(f"{len({r.path for r in results})} files{parts}: {stored} stored, {same} unchanged, {failed} failed{skip_note} "
               f"in {time.perf_counter() - t0:.2f}s")
    con.close()
    if new and not stored:
        _remove_store(db)   # nothing landed: leave no empty store behind
    sys.exit(1 if failed else 0)


def _remove_store(db) -> None:
    """Remove the store file DB (and DuckDB's files beside it) that this command created."""
    for p in (Path(db), Path(f"{db}.wal")):
        p.unlink(missing_ok=True)
    try:
        Path(f"{db}.tmp").rmdir()
    except OSError:
        pass


@cli.command()
@click.option("--db", required=True)
def summary(db):
    """Per job and rank: what was stored."""
    from ninefold.cli.store import open_store

    con = open_store(db)
    rows = con.execute("""
        SELECT t.job, t.rank, t.device_name, t.time_mode,
               (SELECT count(*) FROM gpu_ops g WHERE g.job = t.job AND g.rank = t.rank AND kind = 'kernel'),
               (SELECT count(*) FROM gpu_ops g WHERE g.job = t.job AND g.rank = t.rank AND kind = 'memcpy'),
               (SELECT count(*) FROM steps s WHERE s.job = t.job AND s.rank = t.rank),
               (SELECT count(*) FROM collectives c WHERE c.job = t.job AND c.rank = t.rank),
               (SELECT coalesce(sum(end_ns - start_ns), 0) FROM gpu_ops g
                 WHERE g.job = t.job AND g.rank = t.rank AND kind = 'kernel')
        FROM traces t ORDER BY t.job, t.rank""").fetchall()
    click.echo(f"{'job':20s} {'rank':>4s} {'kernels':>8s} {'memcpy':>7s} {'steps':>5s} {'colls':>6s} "
               f"{'kernel_ms':>10s}  device")
    for job, rank, dev, mode, k, m, s, c, kns in rows:
        click.echo(f"{job:20s} {rank:4d} {k:8d} {m:7d} {s:5d} {c:6d} {kns / 1e6:10.3f}  {dev or '-'}")
    diag = con.execute("SELECT count(*) FROM diagnostics").fetchone()[0]
    click.echo(f"{len(rows)} traces, {diag} diagnostics rows")


@cli.command()
@click.option("--db", required=True)
@click.option("--job", default=None, help="one job (default: every job in DB)")
@click.option("--recompute-pattern", default=None, metavar="REGEX",
              help="host op names that mark recomputation regions, beside the built-in checkpoint rules")
@click.option("--io-pattern", default=None, metavar="REGEX",
              help="host op names that mark data loading / storage I/O, beside the built-in rules")
@click.option("--quiet", is_flag=True, help="print nothing but errors (no line per job, no bar)")
def attribute(db, job, recompute_pattern, io_pattern, quiet):
    """Compute ledger_intervals and ledger_totals for the stored traces. On a terminal a progress bar counts each
    job's ranks; otherwise one line per job. A job that cannot be attributed (no GPU op, only zero-length
    steps; or, named by --job, no profiler trace) says what it lacks; the exit status is then 1. Without --job,
    a job of logs or dumps only is skipped, saying so."""
    from ninefold.analysis.attribution.attribute import attribute_job, check_pattern
    from ninefold.analysis.readiness import lacks
    from ninefold.cli.store import check_job, open_store

    try:
        check_pattern("--recompute-pattern", recompute_pattern)
        check_pattern("--io-pattern", io_pattern)
    except ValueError as e:
        raise click.UsageError(str(e))
    con = open_store(db, read_only=False)
    if job:
        try:
            check_job(con, db, job)
        except NinefoldError:
            con.close()
            raise
    jobs = [job] if job else [r[0] for r in con.execute("SELECT job FROM jobs ORDER BY job").fetchall()]
    if not jobs:
        con.close()
        raise NinefoldError(f"the store {db} holds no job: ingest traces first (`ninefold ingest TRACES --db {db}`)")
    empty = 0
    tty = not quiet and sys.stderr.isatty()
    for j in jobs:
        if not job and not con.execute("SELECT count(*) FROM traces WHERE job = ?", [j]).fetchone()[0]:
            if not quiet:   # logs or dumps only: nothing of it is attributed, and nothing is wrong
                click.echo(f"{j}: skipped: {lacks(con, j)}", err=True)
            continue
        t0 = time.perf_counter()
        bar = None

        def step(done, total, j=j):
            nonlocal bar
            if bar is None:
                bar = click.progressbar(length=total, label=f"attribute {j}", file=sys.stderr, show_pos=True,
                                        show_eta=True)
                bar.__enter__()
            bar.update(done - bar.pos)

        try:
            r = attribute_job(con, j, recompute_pattern=recompute_pattern, io_pattern=io_pattern,
                              progress=step if tty else None)
        finally:
            if bar is not None:
                bar.__exit__(None, None, None)
        if not r["totals"]:
            empty += 1
            why = lacks(con, j) or "no GPU op falls inside any of its steps"
            click.echo(f"error: {j}: nothing to attribute: {why}", err=True)
        elif not quiet:
            click.echo(f"{j}: {r['intervals']} intervals, {r['totals']} totals in {time.perf_counter() - t0:.2f}s")
    con.close()
    sys.exit(1 if empty else 0)


@cli.command()
@click.option("--db", required=True)
@click.option("--job", required=True)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
def ledgers(db, job, fmt):
    """Print the nine ledger totals per rank and step."""
    import json as _json

    from ninefold.analysis.ledgers import LEDGERS, totals
    from ninefold.cli.store import open_job

    con = open_job(db, job)
    rows = totals(con, job)
    if fmt == "csv":
        click.echo("rank,step,ledger,ns")
        for r in rows:
            click.echo(f"{r[0]},{r[1]},{r[2]},{r[3]}")
    elif fmt == "json":
        from ninefold.analysis.waits import comm_compute_overlap

        click.echo(_json.dumps({"ledgers": [dict(zip(["rank", "step", "ledger", "ns"], r)) for r in rows],
                                "comm_compute_overlap": comm_compute_overlap(con, job)}))
    else:
        table: dict = {}
        for rank, step, led, ns in rows:
            table.setdefault((rank, step), {})[led] = ns
        click.echo(f"{'rank':>4s} {'step':>6s} " + " ".join(f"{n[:12]:>12s}" for n in LEDGERS) + f" {'window_ms':>10s}")
        for (rank, step), d in table.items():
            w = sum(d.values())
            click.echo(f"{rank:4d} {step:6d} " + " ".join(f"{d.get(n, 0) / 1e6:12.3f}" for n in LEDGERS)
                       + f" {w / 1e6:10.3f}")


@cli.command()
@click.option("--db", required=True)
@click.option("--job", required=True)
@click.option("--top", default=20, show_default=True, help="rows, largest first")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
def breakdown(db, job, top, fmt):
    """Where the time went: per ledger, by collective and axis, copy direction or kernel class."""
    import json as _json

    from ninefold.dashboards.queries import ledger_breakdown
    from ninefold.cli.store import open_job

    con = open_job(db, job)
    df = ledger_breakdown(con, job, top=top)
    if df.height == 0:  # ledgers without the drill-down tables: a store attributed by an older ninefold
        click.echo(f"error: job {job!r} in {db} has ledgers but no drill-down keys: run `ninefold attribute --db "
                   f"{db} --job {job}` again", err=True)
        sys.exit(2)
    rows = [(r["ledger"], r["key"], round(r["ns"]), r["share"]) for r in df.iter_rows(named=True)]
    if fmt == "csv":
        import csv

        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(["ledger", "key", "ns_per_rank_step", "share"])
        out.writerows((led, key, ns, f"{sh:.6f}") for led, key, ns, sh in rows)
    elif fmt == "json":
        click.echo(_json.dumps([dict(zip(["ledger", "key", "ns_per_rank_step", "share"], r)) for r in rows]))
    else:
        click.echo(f"{'ledger':<13s} {'on':<34s} {'ms/rank-step':>12s} {'share':>7s}")
        for led, key, ns, sh in rows:
            click.echo(f"{led:<13s} {key[:34]:<34s} {ns / 1e6:12.3f} {100 * sh:6.1f}%")


@cli.command()
@click.option("--db", required=True)
@click.option("--job", required=True)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table")
def waits(db, job, fmt):
    """Waits at each matched collective per rank: arrival, last arrival, wait and how it was charged."""
    import json as _json

    from ninefold.analysis.waits import waits as _waits
    from ninefold.cli.store import open_job

    con = open_job(db, job)
    if con.execute("SELECT count(*) FROM traces WHERE job = ?", [job]).fetchone()[0] < 2:
        click.echo("one rank: no cross-rank waits")
        return
    try:
        w = _waits(con, job)
    except Exception as e:  # a store attributed by an older version has no collective_matches
        if "collective_matches" not in str(e):
            raise
        w = None
    if not w or not w["rows"]:
        click.echo(f"error: no matched collectives for job {job!r} in {db}: no collective was matched across "
                   "its ranks, so it has no waits (a store attributed by an older ninefold: run `ninefold "
                   "attribute` again)", err=True)
        sys.exit(2)
    cols = ["rank", "pg", "coll", "seq", "ord", "members", "arrival_ns", "last_arrival_ns", "wait_ns",
            "straggler_ns", "bubble_ns", "hidden_ns", "transfer_ns", "tracelens_wait_ns"]
    if fmt == "json":
        click.echo(_json.dumps(w))
    elif fmt == "csv":
        import csv

        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(cols)
        out.writerows([r[c] for c in cols] for r in w["rows"])
    else:
        us = lambda ns: f"{ns / 1e3:10.1f}"  # noqa: E731
        click.echo(f"{'rank':>4s} {'collective':<22s} {'members':>7s} {'arrival_us':>10s} {'last_us':>10s} "
                   f"{'wait_us':>10s} {'straggler':>10s} {'bubble':>10s} {'hidden':>10s} {'transfer':>10s} "
                   f"{'tl_wait':>10s}")
        for r in w["rows"]:
            name = f"{r['coll']} {r['pg'] or ''}#{r['seq'] if r['seq'] is not None else r['ord']}"
            click.echo(f"{r['rank']:4d} {name[:22]:<22s} {r['members']:7d} {us(r['arrival_ns'])} "
                       f"{us(r['last_arrival_ns'])} {us(r['wait_ns'])} {us(r['straggler_ns'])} {us(r['bubble_ns'])} "
                       f"{us(r['hidden_ns'])} {us(r['transfer_ns'])} {us(r['tracelens_wait_ns'])}")
        click.echo("\nper rank (us; tl_wait = TraceLens's wait: kernel time minus the shortest member's)")
        click.echo(f"{'rank':>4s} {'colls':>6s} {'wait':>10s} {'straggler':>10s} {'bubble':>10s} {'hidden':>10s} "
                   f"{'transfer':>10s} {'tl_wait':>10s}")
        for r in w["ranks"]:
            click.echo(f"{r['rank']:4d} {r['collectives']:6d} {us(r['wait_ns'])} {us(r['straggler_ns'])} "
                       f"{us(r['bubble_ns'])} {us(r['hidden_ns'])} {us(r['transfer_ns'])} "
                       f"{us(r['tracelens_wait_ns'])}")


# Each area adds its commands from its own module: ``register(cli)``.
CLI_MODULES = [
    "ninefold.cli.sources",   # nsys / NCCL / Flight Recorder extras (hang report ...)
    "ninefold.cli.model",     # predict, compare
    "ninefold.cli.web",       # serve, report
    "ninefold.cli.batch",     # batch
    "ninefold.cli.inspect",   # inspect
    "ninefold.cli.diff",      # diff
    "ninefold.cli.efficiency",  # efficiency
    "ninefold.cli.critical",  # critical-path, whatif, export
    "ninefold.cli.analyze",   # analyze: ingest, attribute, compare, report in one
]


def _register_plugins() -> None:
    import importlib

    for mod in CLI_MODULES:
        importlib.import_module(mod).register(cli)


_register_plugins()

# one worked example per command, shown at the end of its --help
EXAMPLES = {
    "ingest": "ninefold ingest traces/run42/ --db nf.duckdb --job run42   (one file per rank; .json, .json.gz, "
              "nsys .sqlite, NCCL logs, Flight Recorder dumps)",
    "summary": "ninefold summary --db nf.duckdb",
    "attribute": "ninefold attribute --db nf.duckdb --job run42 --recompute-pattern '^my_remat'",
    "ledgers": "ninefold ledgers --db nf.duckdb --job run42 --format csv > ledgers.csv",
    "breakdown": "ninefold breakdown --db nf.duckdb --job run42 --top 10",
    "waits": "ninefold waits --db nf.duckdb --job run42 --format csv",
    "inspect": "ninefold inspect traces/run42/   |   ninefold inspect --db nf.duckdb --job run42 --format json",
    "predict": "ninefold predict sample_traces/configs/dp4.toml --db nf.duckdb --job run42",
    "compare": "ninefold compare --db nf.duckdb --job run42 --config sample_traces/configs/dp4.toml",
    "report": "ninefold report --db nf.duckdb --job run42 --out run42.html",
    "serve": "ninefold serve --db nf.duckdb --port 5006   (add --token T to serve beyond loopback)",
    "batch": "ninefold batch /traces/nightly --db catalog.duckdb --reports reports/ --workers 2",
    "nccl": "ninefold nccl --db nf.duckdb --job run42",
    "hang": "ninefold hang --db nf.duckdb --job run42 --format json",
    "diff": "ninefold diff --db nf.duckdb last_night tonight   (--format json for every row)",
    "critical-path": "ninefold critical-path --db nf.duckdb --job run42 --step 12",
    "whatif": "ninefold whatif --db nf.duckdb --job run42   |   ninefold whatif --db nf.duckdb --job run42 "
              "--remove straggler --scale gemm=0.8",
    "analyze": "ninefold analyze traces/run42/ --config run42.toml --out run42.html",
    "export": "ninefold export --db nf.duckdb --job run42 --step 12 --out step12.json   (open in ui.perfetto.dev)",
}
for _name, _ex in EXAMPLES.items():
    if _name in cli.commands:
        cli.commands[_name].epilog = f"Example: {_ex}"


def main():
    cli()


if __name__ == "__main__":
    main()
