"""`ninefold critical-path` and `ninefold whatif`: which time sets each step, and what the step would take without
a ledger's time or with a kernel class sped up (ninefold.analysis.critical_path, ninefold.analysis.whatif)."""
from __future__ import annotations

import json
import sys

import click

from ninefold.store.errors import NinefoldError


def _ms(ns):
    return f"{ns / 1e6:10.3f}"


def _speedup(x) -> str:
    """A speed-up as N.NNNx; None (the change leaves nothing of the step: a job of copies only, without its
    copies) as 'all'."""
    return "all" if x is None else f"{x:.3f}x"


def _scale_opts(items):
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        try:
            out[k] = float(v)
        except ValueError:
            sep = ""
        if not sep or not k:
            click.echo(f"error: --scale {it!r}: write KERNEL_CLASS=FACTOR, e.g. gemm=0.5", err=True)
            sys.exit(2)
    return out


@click.command("critical-path")
@click.option("--db", required=True)
@click.option("--job", required=True)
@click.option("--step", "steps", type=int, multiple=True, help="only these steps (as in step_windows)")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--top", type=int, default=5, show_default=True, help="pieces named per step")
def critical_path_cmd(db, job, steps, fmt, top):
    """The cross-rank critical path of each step: what it is made of, per ledger and per rank, and the
    pieces that weigh most. Stored in the critical_path table."""
    from ninefold.analysis.critical_path import CriticalPathError, critical_path
    from ninefold.cli.store import open_job

    con = open_job(db, job, read_only=False)
    try:
        res = critical_path(con, job, steps=set(steps) or None)
        con.close()
    except (CriticalPathError, NinefoldError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if fmt == "json":
        click.echo(json.dumps(res["steps"], indent=1))
        return
    for s in res["steps"]:
        L = s["length_ns"]
        click.echo(f"step {s['step']}: critical path {L / 1e6:.3f} ms (the step window {s['window_ns'] / 1e6:.3f}"
                   f" ms) in {s['pieces']} pieces")
        led = ", ".join(f"{k} {v / L:.1%}" for k, v in sorted(s["ledgers"].items(), key=lambda kv: -kv[1])
                        if v)
        rk = ", ".join(f"rank {k} {v / L:.1%}" for k, v in sorted(s["ranks"].items(), key=lambda kv: -kv[1]))
        click.echo(f"  by ledger: {led}")
        click.echo(f"  by rank:   {rk}")
        for t in s["top"][:top]:
            what = t["what"] if len(t["what"]) <= 70 else t["what"][:67] + "..."
            click.echo(f"  {t['ns'] / L:6.1%}  rank {t['rank']:<4d} {t['ledger']:13s} {what}")


@click.command()
@click.option("--db", required=True)
@click.option("--job", required=True)
@click.option("--remove", multiple=True,
              help="a ledger's time taken away: straggler, bubble, host, io, memcpy, exposed_comm, idle, or "
                   "launch_gaps (the host's gaps after a synchronize); repeatable")
@click.option("--scale", multiple=True, help="KERNEL_CLASS=FACTOR: that class's kernels take FACTOR times as "
                                              "long (gemm=0.5); repeatable")
@click.option("--step", "steps", type=int, multiple=True, help="only these steps")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def whatif(db, job, remove, scale, steps, fmt):
    """The step time projected on the step's dependency graph with a change. Without --remove or --scale:
    every single-ledger removal ranked by the time it would save (what to fix first)."""
    from ninefold.analysis.whatif import WhatIfError, rank_removals
    from ninefold.analysis.whatif import whatif as run_whatif
    from ninefold.cli.store import open_job

    sc = _scale_opts(scale)
    con = open_job(db, job)
    try:
        if not remove and not sc:
            rows = rank_removals(con, job, steps=set(steps) or None)
            res = None
        else:
            res = run_whatif(con, job, remove=tuple(remove), scale=sc, steps=set(steps) or None)
        con.close()
    except (WhatIfError, NinefoldError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if res is None:
        if fmt == "json":
            click.echo(json.dumps(rows, indent=1))
            return
        m = rows[0]["measured_ns"] if rows else 0
        click.echo(f"{job}: {m / 1e6:.3f} ms over its steps; each removal replayed on the step graphs")
        click.echo(f"{'remove':14s} {'projected ms':>12s} {'saved ms':>10s} {'speed-up':>9s} "
                   f"{'ledger ms':>10s}  (ledger ms: all ranks; saved: the step time)")
        for r in rows:
            led = f"{r['ledger_ns'] / 1e6:10.3f}" if r["ledger_ns"] is not None else f"{'-':>10s}"
            click.echo(f"{r['remove']:14s} {r['projected_ns'] / 1e6:12.3f} {r['saved_ns'] / 1e6:10.3f} "
                       f"{_speedup(r['speedup']):>9s} {led}")
        if any(r["speedup"] is None for r in rows):
            click.echo("(speed-up 'all': without that ledger nothing of the step is left)")
        return
    if fmt == "json":
        click.echo(json.dumps(res, indent=1, default=str))
        return
    what = ", ".join([f"without {x}" for x in remove] + [f"{k} x{v:g}" for k, v in sc.items()])
    click.echo(f"{job} {what}: {res['measured_ns'] / 1e6:.3f} ms -> {res['projected_ns'] / 1e6:.3f} ms "
               f"(saves {res['saved_ns'] / 1e6:.3f} ms, speed-up {_speedup(res['speedup'])})")
    click.echo(f"{'step':>6s} {'measured ms':>11s} {'projected ms':>12s} {'saved ms':>10s}  new critical path")
    for s in res["steps"]:
        L = sum(s["path_kinds"].values()) or 1
        kinds = ", ".join(f"{k} {v / L:.0%}" for k, v in sorted(s["path_kinds"].items(), key=lambda kv: -kv[1]))
        ranks = ", ".join(f"r{k} {v / L:.0%}" for k, v in sorted(s["path_ranks"].items(), key=lambda kv: -kv[1]))
        click.echo(f"{s['step']:6d} {s['measured_ns'] / 1e6:11.3f} {s['projected_ns'] / 1e6:12.3f} "
                   f"{s['saved_ns'] / 1e6:10.3f}  {f'{kinds}; {ranks}' if kinds else '-'}")


@click.command()
@click.option("--db", required=True)
@click.option("--job", required=True)
@click.option("--step", "steps", type=int, multiple=True, help="only these steps (default: all)")
@click.option("--rank", type=int, default=None, help="only this rank (a file ninefold ingests as that rank)")
@click.option("--out", required=True, help="the Chrome-trace JSON to write (.json or .json.gz)")
def export(db, job, steps, rank, out):
    """The job as one Chrome-trace JSON for the Perfetto UI or chrome://tracing: each rank's host threads and
    GPU streams on the reference clock, a ledger track and the critical path with arrows across ranks (run
    `ninefold critical-path` first to include it)."""
    from ninefold.analysis.export import ExportError, write_trace
    from ninefold.cli.store import open_job

    con = open_job(db, job)
    try:
        p = write_trace(con, job, out, steps=set(steps) or None, rank=rank)
        con.close()
    except (ExportError, NinefoldError, OSError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    click.echo(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB): open it in the Perfetto UI or chrome://tracing")


def register(cli) -> None:
    cli.add_command(critical_path_cmd)
    cli.add_command(whatif)
    cli.add_command(export)
