"""``ninefold analyze``: the one-command path from a folder of traces to a report, over the Python API."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from ninefold.store.errors import NinefoldError


@click.command()
@click.argument("path")
@click.option("--out", required=True, help="the HTML report to write")
@click.option("--db", default=None, help="DuckDB store (default: OUT with .duckdb, created if missing)")
@click.option("--job", default=None, help="job name (default: the directory name)")
@click.option("--config", default=None, type=click.Path(exists=True, dir_okay=False),
              help="a cost-model configuration: the report shows measured beside predicted")
def analyze(path, out, db, job, config):
    """Ingest PATH (a trace or a folder of per-rank traces), attribute it, compare it with CONFIG when given, and
    write one offline HTML report."""
    import ninefold

    if not Path(path).exists():
        click.echo(f"error: {path}: no such file or directory", err=True)
        sys.exit(2)
    db = db or str(Path(out).with_suffix(".duckdb"))
    with ninefold.open(db) as s:
        rep = s.ingest(path, job=job)
        for r in rep.failed:
            click.echo(f"FAILED  {r.message}", err=True)
        landed = [r for r in rep.results if r.status in ("stored", "unchanged")]
        if not landed:
            raise NinefoldError(f"{path}: no trace landed in {db} ({len(rep.failed)} failed)")
        job = job or landed[0].job
        click.echo(f"ingest: {rep.stored} stored, {rep.unchanged} unchanged, {len(rep.failed)} failed (job {job})")
        s.attribute(job)
        led = s.ledgers(job)
        per = led.group_by("ledger").agg(ns=led["ns"].sum()).sort("ns", descending=True)
        total = int(per["ns"].sum()) or 1
        top = ", ".join(f"{r['ledger']} {100 * r['ns'] / total:.1f} %" for r in per.head(4).iter_rows(named=True))
        click.echo(f"attribute: {led['rank'].n_unique()} ranks, {led['step'].n_unique()} steps; {top}")
        if config:
            cmp = s.compare(job, config)
            step = cmp["residual_ns"].sum()
            click.echo(f"compare: {config}: measured − predicted {step / 1e6:+.3f} ms per step "
                       f"({100 * cmp['residual_share'].sum():+.1f} % of the measured step)")
        p = s.report(job, out)
    click.echo(f"report: {p}   (store: {db})")
    sys.exit(1 if rep.failed else 0)


def register(cli) -> None:
    cli.add_command(analyze)
