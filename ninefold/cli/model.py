"""``ninefold predict`` and ``ninefold compare``: the cost model's predicted ledgers beside the measured ones."""
from __future__ import annotations

import json
import sys

import click

from ninefold.store.errors import NinefoldError


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _print_inputs(pred):
    click.echo("inputs")
    click.echo(f"  {'key':32s} {'value':>16s}  {'source':8s} note")
    for key, val, src, note in pred.cfg.rows():
        if val is None:
            continue
        click.echo(f"  {key:32s} {_fmt(val):>16s}  {src:8s} {note}")
    hw = pred.cfg.hardware()
    for f in ("peak_bf16", "hbm_bytes", "hbm_bw", "nvlink_beta", "ib_beta"):
        src = "config" if f in pred.cfg.hw_overrides else "preset"
        click.echo(f"  {'hardware.' + f:32s} {_fmt(getattr(hw, f)):>16s}  {src:8s} {hw.name}")
    if pred.fits:
        click.echo("calibrated collectives (t = alpha*steps + busbw_factor*bytes/beta)")
        for f in pred.fits:
            click.echo(f"  {f.coll:14s} n={f.nranks:<4d} alpha={f.alpha * 1e6:9.3f} us  busbw={f.beta / 1e9:9.2f} GB/s  "
                       f"points={f.n:<5d} rms={f.rms_rel:.3f}  {f.source}")
    click.echo("model terms")
    for name, val, note in pred.details:
        click.echo(f"  {name:36s} {_fmt(val):>16s}  {note}")


def _ledger_table(title, rows):
    from ninefold.analysis.ledgers import LEDGERS

    click.echo(title)
    click.echo(f"  {'':10s} " + " ".join(f"{n[:12]:>12s}" for n in LEDGERS) + f" {'step_ms':>10s}")
    for label, d in rows:
        click.echo(f"  {label:10s} " + " ".join(f"{d[n] / 1e6:12.3f}" for n in LEDGERS)
                   + f" {sum(d.values()) / 1e6:10.3f}")


def _memory_table(pred):
    from ninefold.analysis.cost_model.memory import MEMORY_ITEMS

    click.echo("predicted memory per GPU (GB)")
    click.echo(f"  {'rank':10s} " + " ".join(f"{n[:16]:>16s}" for n in MEMORY_ITEMS) + f" {'total':>10s}")
    seen = {}
    for r, d in pred.memory.items():
        key = tuple(round(d[k]) for k in MEMORY_ITEMS)
        seen.setdefault(key, []).append(r)
    hbm = pred.cfg.hardware().hbm_bytes
    for key, ranks in seen.items():
        d = pred.memory[ranks[0]]
        tot = sum(d.values())
        label = str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}..{ranks[-1]}" if ranks == list(
            range(ranks[0], ranks[-1] + 1)) else ",".join(map(str, ranks[:4])) + ("…" if len(ranks) > 4 else "")
        click.echo(f"  {label:10s} " + " ".join(f"{d[k] / 1e9:16.3f}" for k in MEMORY_ITEMS)
                   + f" {tot / 1e9:10.3f}" + ("  exceeds HBM" if tot > hbm else ""))


def _excluded(pred):
    for e in pred.excluded:
        click.echo(f"not in the trace (predicted, shown, not compared): {e.what} — {e.reason}")


def _explain(pred):
    from ninefold.analysis.cost_model.explain import text

    for line in text(pred, pred.mean(), pred.mean(compared=True)):
        click.echo(line)


def _classes(ledgers):
    """Group ranks with identical predicted ledgers."""
    out = {}
    for r, d in ledgers.items():
        out.setdefault(tuple(d.values()), []).append(r)
    return [(ranks, ledgers[ranks[0]]) for ranks in out.values()]


@click.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--db", default=None, help="DuckDB file with the traced job (read only)")
@click.option("--job", default=None, help="the job whose trace fills in what it tells")
@click.option("--no-calibrate", is_flag=True, help="use the presets' alpha/beta and the configured MFU")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--explain", is_flag=True, help="per ledger, the terms it is made of, with values and sources")
def predict(config, db, job, no_calibrate, fmt, explain):
    """Predict the nine ledgers per step and the memory ledger from CONFIG (TOML)."""
    from ninefold.analysis.cost_model.predict import predict_file
    from ninefold.cli.store import open_job

    if (db is None) != (job is None):
        click.echo("error: --db and --job go together", err=True)
        sys.exit(2)
    con = open_job(db, job, ledgers=False) if db else None
    try:
        pred = predict_file(config, con, job, calibrate_from_trace=not no_calibrate)
    except (NinefoldError, OSError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except Exception as e:  # duckdb errors on a file that is not a database
        if db and type(e).__module__.startswith("duckdb"):
            click.echo(f"error: {db}: {e}", err=True)
            sys.exit(2)
        raise
    finally:
        if con is not None:
            con.close()
    if fmt == "json":
        out = {"inputs": [dict(zip(("key", "value", "source", "note"), r)) for r in pred.cfg.rows()],
               "ledgers_ns": {str(r): d for r, d in pred.ledgers.items()},
               "in_trace_ns": {str(r): d for r, d in pred.compared.items()},
               "not_in_trace": [{"axis": e.axis, "what": e.what, "reason": e.reason} for e in pred.excluded],
               "calibrated_from": pred.sources,
               "memory_bytes": {str(r): d for r, d in pred.memory.items()}}
        if explain:
            from ninefold.analysis.cost_model.explain import terms

            out["terms"] = [t.__dict__ for t in terms(pred)]
        click.echo(json.dumps(out, default=str))
        return
    _print_inputs(pred)
    rows = []
    for ranks, d in _classes(pred.ledgers):
        label = str(ranks[0]) if len(ranks) == 1 else f"{len(ranks)} ranks"
        rows.append((label, d))
    _ledger_table("predicted ledgers per step (ms), by rank", rows)
    _excluded(pred)
    if explain:
        _explain(pred)
    _memory_table(pred)


@click.command()
@click.option("--db", required=True, help="DuckDB file with the traced job")
@click.option("--job", required=True)
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False))
@click.option("--no-calibrate", is_flag=True, help="use the presets' alpha/beta and the configured MFU")
@click.option("--explain", is_flag=True, help="per ledger, the terms it is made of, with values and sources")
def compare(db, job, config, no_calibrate, explain):
    """Store the prediction for JOB and print measured, predicted and residual per ledger (the residual as a
    share of the measured step, as the report shows it). A job not attributed yet is attributed first (it
    says so)."""
    from ninefold.analysis.cost_model import compare as cmp
    from ninefold.analysis.cost_model.predict import predict_file
    from ninefold.analysis.cost_model.residual import HEADING, residual_text
    from ninefold.analysis.ledgers import LEDGERS
    from ninefold.cli.store import open_job

    con = open_job(db, job, ledgers=False, read_only=False)
    try:
        meas = cmp.measured(con, job)
        if not meas:
            from ninefold.analysis.attribution.attribute import attribute_job
            from ninefold.analysis.readiness import lacks, not_attributed

            if lacks(con, job):
                raise NinefoldError(not_attributed(con, job, db))
            click.echo(f"attributing {job} first…", err=True)
            attribute_job(con, job)
            meas = cmp.measured(con, job)
            if not meas:
                raise NinefoldError(f"job {job!r} has no attributable steps: no GPU op falls inside any of "
                                    "its steps")
        pred = predict_file(config, con, job, calibrate_from_trace=not no_calibrate)
        n = cmp.store(con, job, pred)
    except (NinefoldError, OSError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    finally:
        if con is not None:
            con.close()
    res = cmp.residuals(meas, pred)
    step_m = sum(v["measured"] for v in res.values())
    step_p = sum(v["predicted"] for v in res.values())
    click.echo(f"{job}: config {config} (sha {pred.cfg.sha[:12]}), {len(pred.ledgers)} ranks predicted, "
               f"{len(meas)} measured; {n} predicted_ledgers rows stored")
    gone = sum(v["not_in_trace"] for v in res.values())
    w = len(HEADING)
    click.echo(f"  {'ledger':14s} {'measured_ms':>12s} {'predicted_ms':>13s} {'residual_ms':>12s} {HEADING:>{w}s}"
               + (f" {'not_in_trace_ms':>16s}" if pred.excluded else ""))
    for led in LEDGERS:
        v = res[led]
        click.echo(f"  {led:14s} {v['measured'] / 1e6:12.3f} {v['predicted'] / 1e6:13.3f} "
                   f"{v['residual'] / 1e6:12.3f} {residual_text(v['residual'], step_m):>{w}s}"
                   + (f" {v['not_in_trace'] / 1e6:16.3f}" if pred.excluded else ""))
    click.echo(f"  {'step':14s} {step_m / 1e6:12.3f} {step_p / 1e6:13.3f} {(step_m - step_p) / 1e6:12.3f} "
               f"{residual_text(step_m - step_p, step_m):>{w}s}" + (f" {gone / 1e6:16.3f}" if pred.excluded else ""))
    if pred.excluded:
        click.echo(f"  (the step compared leaves out {gone / 1e6:.3f} ms the trace cannot contain; "
                   f"whole predicted step {(step_p + gone) / 1e6:.3f} ms)")
    _excluded(pred)
    for led, how in pred.sources.items():
        click.echo(f"calibrated: {led} from {how}")
    diff = cmp.differing_ranks(meas, pred)
    if diff:
        click.echo("per rank (measured / predicted ms) where ranks differ")
        click.echo(f"  {'rank':>4s} " + " ".join(f"{n[:12]:>17s}" for n in LEDGERS))
        for r in diff:
            click.echo(f"  {r:4d} " + " ".join(f"{meas[r][k] / 1e6:8.3f}/{pred.compared[r][k] / 1e6:<8.3f}"
                                               for k in LEDGERS))
    if explain:
        _explain(pred)
    _memory_table(pred)


def register(cli) -> None:
    cli.add_command(predict)
    cli.add_command(compare)
