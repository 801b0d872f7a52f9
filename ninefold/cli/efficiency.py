"""`ninefold efficiency`: per-kernel achieved FLOP/s or bytes/s against the device's peak, ranked by the time
lost to the gap (ninefold.analysis.efficiency); stored in kernel_efficiency."""
from __future__ import annotations

import json
import sys

import click

from ninefold.store.errors import NinefoldError


def register(cli) -> None:
    @cli.command(epilog="Example: ninefold efficiency --db nf.duckdb --job run42 --top 15   "
                        "(--device H100 when the trace names no known GPU)")
    @click.option("--db", required=True)
    @click.option("--job", required=True)
    @click.option("--top", type=int, default=20, show_default=True, help="rows shown in the table (json: all)")
    @click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
    @click.option("--device", default=None, help="hardware preset to measure against (default: the trace's device)")
    def efficiency(db, job, top, fmt, device):
        """Per rank and kernel: calls, time, the work the trace's shapes give (FLOPs, bytes, bus bytes), achieved
        rate against the preset's peak, and the time lost to the gap (actual - ideal at peak), largest first.
        Kernels whose work the trace does not give say why."""
        from ninefold.analysis.efficiency import EfficiencyError, device_line, human, kernel_efficiency, RATE_SCALE
        from ninefold.cli.store import open_job

        if top < 0:
            click.echo("error: --top must be >= 0", err=True)
            sys.exit(2)
        con = open_job(db, job, ledgers=False, read_only=False)
        try:
            try:
                rows, devs = kernel_efficiency(con, job, device)
            finally:
                con.close()
        except (EfficiencyError, NinefoldError) as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        if fmt == "json":
            click.echo(json.dumps({"job": job, "device": device_line(devs), "rows": rows}, indent=1))
            return
        click.echo(device_line(devs))
        known = [r for r in rows if r["lost_ns"] is not None]
        total = sum(r["time_ns"] for r in rows)
        lost = sum(r["lost_ns"] for r in known)
        click.echo(f"{job}: {len(rows)} kernel rows, {total / 1e6:.3f} ms of GPU time; "
                   f"{sum(r['time_ns'] for r in known) / 1e6:.3f} ms with known work, of which "
                   f"{lost / 1e6:.3f} ms lost against peak")
        click.echo(f"{'rank':>4s} {'kernel':48s} {'class':11s} {'calls':>6s} {'time ms':>9s} {'achieved':>9s} "
                   f"{'peak':>8s} {'unit':9s} {'eff':>6s} {'lost ms':>9s}  basis / note")
        for r in [r for r in rows if r["work"] is not None][:top]:
            name = r["kernel"] if len(r["kernel"]) <= 48 else r["kernel"][:45] + "..."
            unit = RATE_SCALE[r["unit"]][1]
            tail = r["basis"] + (f"; {r['note']}" if r["note"] else "")
            if r["wait_ns"]:
                tail += f"; {r['wait_ns'] / 1e6:.3f} ms of it waiting for the group's last member"
            eff = "-" if r["efficiency"] is None else f"{r['efficiency'] * 100:5.1f}%"
            lost_ms = "-" if r["lost_ns"] is None else f"{r['lost_ns'] / 1e6:.3f}"
            click.echo(f"{r['rank']:4d} {name:48s} {r['kclass']:11s} {r['calls']:6d} {r['time_ns'] / 1e6:9.3f} "
                       f"{human(r['achieved'], r['unit']):>9s} {human(r['peak'], r['unit']):>8s} {unit:9s} "
                       f"{eff:>6s} {lost_ms:>9s}  {tail}")
        missing = _missing(rows)
        if missing:
            click.echo("without known work (time ms, calls):")
            for why, calls, ns in missing[:max(top, 1)]:
                click.echo(f"  {ns / 1e6:9.3f} {calls:7d}  {why}")
            if len(missing) > max(top, 1):
                click.echo(f"  ... and {len(missing) - max(top, 1)} more reasons (--format json for every row)")


def _missing(rows: list[dict]) -> list[tuple[str, int, int]]:
    """(reason, calls, ns) of the rows whose work is not known, over every rank and kernel, largest time first."""
    out: dict = {}
    for r in rows:
        if r["work"] is None:
            c = out.setdefault(r["note"] or "unknown", [0, 0])
            c[0] += r["calls"]
            c[1] += r["time_ns"]
    return sorted(((k, c, n) for k, (c, n) in out.items()), key=lambda x: -x[2])
