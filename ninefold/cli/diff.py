"""`ninefold diff`: what changed between two attributed jobs, beyond the step-to-step noise (ninefold.analysis.diff)."""
from __future__ import annotations

import json
import sys

import click

from ninefold.store.errors import NinefoldError


def register(cli) -> None:
    @cli.command()
    @click.argument("job_a")
    @click.argument("job_b")
    @click.option("--db", required=True)
    @click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
    @click.option("--all", "show_all", is_flag=True, help="every row (default: the ledgers and what is significant)")
    @click.option("--confidence", type=float, default=0.95, show_default=True,
                  help="of the bootstrap intervals, held for the whole table")
    def diff(job_a, job_b, db, fmt, show_all, confidence):
        """JOB_B against JOB_A per ledger, kernel class, collective and kernel: time per step (all ranks), the
        change, its bootstrap interval over the steps, and whether it is beyond the noise."""
        from ninefold.analysis.diff import DiffError, diff_jobs, order_rows
        from ninefold.cli.store import open_job

        if not 0.5 <= confidence < 1:
            click.echo("error: --confidence must be in [0.5, 1)", err=True)
            sys.exit(2)
        con = open_job(db, [job_a, job_b])
        try:
            rows = order_rows(diff_jobs(con, job_a, job_b, confidence=confidence))
        except (DiffError, NinefoldError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        if fmt == "json":
            click.echo(json.dumps(rows, indent=1))
            return
        shown = [r for r in rows if show_all or r["level"] == "ledger" or r["significant"]
                 or r["status"] != "same" and r["level"] == "kernel"]
        n = rows[0]
        click.echo(f"{job_b} vs {job_a}: time per step over all ranks ({n['steps_a']} and {n['steps_b']} steps); "
                   f"* = beyond the noise at {confidence:.0%} for the whole table")
        click.echo(f"{'level':7s} {'key':48s} {'A ms':>10s} {'B ms':>10s} {'delta ms':>10s} {'of step':>8s}  "
                   f"interval (ms)")
        for r in shown:
            key = r["key"] if len(r["key"]) <= 48 else r["key"][:45] + "..."
            mark = "*" if r["significant"] else (" " + r["status"] if r["status"] != "same" else "")
            click.echo(f"{r['level']:7s} {key:48s} {r['a_ns'] / 1e6:10.3f} {r['b_ns'] / 1e6:10.3f} "
                       f"{r['delta_ns'] / 1e6:+10.3f} {r['delta_share'] * 100:+7.2f}%  "
                       f"[{r['ci_low_ns'] / 1e6:+.3f}, {r['ci_high_ns'] / 1e6:+.3f}] {mark}".rstrip())
