"""`ninefold batch`: the nightly run over a drop directory of jobs (see docs/batch.md).

Exit codes: 0 every job processed or unchanged and no regression; 3 at least one regression (a job's step or a
ledger significantly longer per step than on its previous night: the diff's bootstrap interval excludes zero at
--confidence for the whole table); 4 at least one job failed (takes precedence over 3; summary.json lists both);
2 usage or configuration error (nothing run).
"""
from __future__ import annotations

import sys

import click

from ninefold.store.errors import NinefoldError


def register(cli) -> None:
    @cli.command()
    @click.argument("root", type=click.Path(file_okay=False))
    @click.option("--db", required=True, help="DuckDB catalog (created if missing); Parquet goes beside it")
    @click.option("--reports", required=True, help="directory for <job>.html, index.html, summary.json, logs/")
    @click.option("--scheduler", default="local", show_default=True,
                  help="'local' (a LocalCluster on this machine), 'serial' (no Dask), or a scheduler address")
    @click.option("--workers", type=int, default=None, help="local worker processes (default: the CPU count)")
    @click.option("--since", default=None, help="only jobs with a file modified on/after this date (YYYY-MM-DD)")
    @click.option("--regression-points", type=float, default=5.0, show_default=True,
                  help="a non-compute ledger share growing by more than this many points is reported as a "
                       "share move (summary.json; it does not set the exit code)")
    @click.option("--confidence", type=float, default=0.95, show_default=True,
                  help="of the diff against each job's previous night, held for the whole table")
    @click.option("--night", default=None, help="label of this run in the history (default: today's date)")
    @click.option("--manifest", default=None, help="JSON listing jobs and files (default: ROOT/manifest.json)")
    def batch(root, db, reports, scheduler, workers, since, regression_points, confidence, night, manifest):
        """Process every new job under ROOT: Parquet, ledgers, one report each, a trend, and each job's diff
        against its previous night (regressions: what is significantly longer)."""
        from ninefold.batch.nightly import run_batch

        try:
            out = run_batch(root, db, reports, scheduler=scheduler, workers=workers, since=since,
                            regression_points=regression_points, night=night, manifest=manifest,
                            confidence=confidence,
                            echo=lambda s: click.echo(s))
        except NinefoldError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        sys.exit(out.exit_code)
