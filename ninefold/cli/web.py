"""Web commands: ``ninefold serve`` (the Panel app with uploads) and ``ninefold report`` (offline HTML)."""
from __future__ import annotations

import sys

import click

from ninefold.store.errors import NinefoldError

DEFAULT_MAX_UPLOAD = 2 << 30  # 2 GiB
DEFAULT_MAX_UPLOADS_TOTAL = 50 << 30  # 50 GiB


@click.command()
@click.option("--db", required=True, help="DuckDB store")
@click.option("--job", required=True, help="job to report on")
@click.option("--out", "out", required=True, help="HTML file to write (self-contained, works offline)")
def report(db, job, out):
    """Write one self-contained HTML report of JOB (one not attributed yet says so, and what to run). A store
    another process holds is waited for up to --wait seconds, saying so."""
    from ninefold.dashboards.report import write_report
    from ninefold.cli.store import open_job

    con = open_job(db, job, ledgers=False)
    try:
        p = write_report(db, job, out, con=con)
    except NinefoldError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    click.echo(f"wrote {p} ({p.stat().st_size / 2 ** 20:.1f} MiB)")


@click.command()
@click.option("--db", required=True, help="DuckDB store (created if missing); uploads go beside it")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", default=5006, show_default=True, type=int)
@click.option("--token", default=None, help="require this token (header 'Authorization: Bearer T', "
              "'?token=T' once, then a cookie)")
@click.option("--basic-auth", "basic_auth", default=None, metavar="USER:PASS", help="require HTTP basic auth")
@click.option("--max-upload-bytes", "max_upload", default=DEFAULT_MAX_UPLOAD, show_default=True, type=int,
              help="largest file the upload page accepts")
@click.option("--max-uploads-total-bytes", "max_total", default=DEFAULT_MAX_UPLOADS_TOTAL, show_default=True,
              type=int, help="most bytes the uploads folder holds, stored and arriving together; an upload past "
              "it is refused")
def serve(db, host, port, token, basic_auth, max_upload, max_total):
    """Serve the dashboards and the upload page."""
    from ninefold.web.server import ServeConfig, check_config, run_server

    cfg = ServeConfig(db=db, host=host, port=port, token=token, basic_auth=basic_auth,
                      max_upload_bytes=max_upload, max_uploads_total_bytes=max_total)
    try:
        check_config(cfg)
    except NinefoldError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    run_server(cfg)


def register(cli) -> None:
    cli.add_command(report)
    cli.add_command(serve)
