"""The Python API: one ``Store`` over a DuckDB file, the facade a notebook uses.

    import ninefold
    with ninefold.open("runs.duckdb") as s:
        s.ingest("traces/run17/", job="run17")     # -> IngestReport
        s.attribute("run17")
        s.ledgers("run17")                         # -> polars DataFrame (rank, step, ledger, ns)

Tables come back as polars DataFrames (``.to_pandas()`` for pandas users); richer results (a what-if, a
critical path, a prediction) as the dicts and objects the analyses return. Errors are ``ninefold.NinefoldError``
subclasses with one-line messages.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import polars as pl

from ninefold.store.connection import connect
from ninefold.store.errors import NinefoldError


class NotAttributed(NinefoldError):
    """The job is stored but ``attribute`` has not run on it."""


class UnknownJob(NinefoldError):
    """No such job in the store."""


@dataclass
class IngestReport:
    """What one ``Store.ingest`` call did, file by file (``results``: status stored | unchanged | skipped | failed)."""
    results: list = field(default_factory=list)

    def _n(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def stored(self) -> int:
        return self._n("stored")

    @property
    def unchanged(self) -> int:
        return self._n("unchanged")

    @property
    def skipped(self) -> int:
        return self._n("skipped")

    @property
    def failed(self) -> list:
        return [r for r in self.results if r.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def __repr__(self) -> str:
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        return (f"IngestReport({len(self.results)} files: {self.stored} stored, {self.unchanged} unchanged, "
                f"{len(self.failed)} failed{skipped})")


class Store:
    """A ninefold store (a DuckDB file). Use as a context manager, or call ``close()``.

    Writes (ingest, attribute, compare) open the file for writing for the call's duration only, so a notebook can
    keep a Store open beside a running ``ninefold serve`` or a CLI command."""

    def __init__(self, path: str | Path, read_only: bool = False, wait: float | None = None):
        self.path = Path(path)
        self.read_only = read_only
        self.wait = wait
        if read_only and not self.path.exists():
            raise NinefoldError(f"{self.path}: no such store")
        self._con = None

    # -- connections
    def _read(self):
        if self._con is None:
            self._con = connect(self.path, read_only=True, wait=self.wait) if self.path.exists() \
                else connect(self.path, wait=self.wait)
        return self._con

    def _write(self):
        if self.read_only:
            raise NinefoldError(f"{self.path}: opened read-only")
        self.close()
        return connect(self.path, wait=self.wait)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ninefold.Store({str(self.path)!r})"

    # -- what is stored
    def jobs(self) -> list[str]:
        """The stored job names (ninefold.analysis.readiness.job_names, as every command lists them)."""
        from ninefold.analysis.readiness import job_names

        return job_names(self._read())

    def _job(self, job: str, attributed: bool = False):
        """The read connection, once JOB is in the store (and attributed, when ATTRIBUTED); the messages are
        readiness's, the ones the CLI prints."""
        from ninefold.analysis import readiness

        con = self._read()
        msg = readiness.not_in_store(con, job, f"the store {self.path}")
        if msg:
            raise UnknownJob(msg)
        if attributed and not readiness.attributed(con, job):
            raise NotAttributed(readiness.not_attributed(con, job, str(self.path)))
        return con

    def sql(self, query: str, params: list | None = None) -> pl.DataFrame:
        """Run a read-only SQL query over the store; the escape hatch for what no method gives."""
        con = connect(self.path, read_only=True, wait=self.wait)
        try:
            df = pl.from_arrow(con.sql(query, params=params or None).to_arrow_table())
            assert isinstance(df, pl.DataFrame)   # a table, never a single column
            return df
        finally:
            con.close()

    # -- writing
    def ingest(self, paths: str | Path | Iterable[str | Path], job: str | None = None, rank: int | None = None,
               replace: bool = False, salvage: bool = False) -> IngestReport:
        """Ingest trace files or directories of per-rank files; each file is its own transaction."""
        from ninefold.ingest.load import ingest_paths

        if isinstance(paths, (str, Path)):
            paths = [paths]
        con = self._write()
        try:
            res = ingest_paths(con, [str(p) for p in paths], job=job, rank=rank, replace=replace, salvage=salvage)
        finally:
            con.close()
        return IngestReport(res)

    def attribute(self, job: str, recompute_pattern: str | None = None, io_pattern: str | None = None) -> dict:
        """Charge every nanosecond of every rank's step of JOB to the nine ledgers (replaces earlier results)."""
        from ninefold.analysis.attribution.attribute import attribute_job

        self._job(job)
        con = self._write()
        try:
            return attribute_job(con, job, recompute_pattern=recompute_pattern, io_pattern=io_pattern)
        finally:
            con.close()

    # -- reading
    def ledgers(self, job: str) -> pl.DataFrame:
        """The nine ledgers per rank and step: columns rank, step, ledger, ns (every ledger, zeros included)."""
        from ninefold.analysis.ledgers import totals

        con = self._job(job, attributed=True)
        return pl.DataFrame(totals(con, job), schema={"rank": pl.Int32, "step": pl.Int32, "ledger": pl.Utf8,
                                                      "ns": pl.Int64}, orient="row")

    def waits(self, job: str) -> pl.DataFrame:
        """Per collective and rank: arrival, the wait for the last member and how it was charged (ns)."""
        from ninefold.analysis.waits import waits

        con = self._job(job, attributed=True)
        return pl.DataFrame(waits(con, job)["rows"])

    def critical_path(self, job: str, step: int | None = None) -> dict:
        """The cross-rank critical path of each step (or STEP): per step its length by ledger and rank, and the
        pieces."""
        from ninefold.analysis.critical_path import critical_path

        self._job(job, attributed=True)
        con = self._write()
        try:
            return critical_path(con, job, steps=None if step is None else {int(step)})
        finally:
            con.close()

    def whatif(self, job: str, remove: Iterable[str] = (), scale: dict | None = None,
               step: int | None = None) -> dict:
        """The step time projected with ledgers removed (REMOVE) or kernel classes scaled (SCALE)."""
        from ninefold.analysis.whatif import whatif

        con = self._job(job, attributed=True)
        return whatif(con, job, remove=tuple(remove), scale=scale, steps=None if step is None else {int(step)})

    def diff(self, job_a: str, job_b: str, confidence: float = 0.95) -> pl.DataFrame:
        """What changed from JOB_A to JOB_B per ledger, kernel class, collective and kernel, with a bootstrap
        interval over the steps."""
        from ninefold.analysis.diff import diff_jobs

        self._job(job_a, attributed=True)
        con = self._job(job_b, attributed=True)
        return pl.DataFrame(diff_jobs(con, job_a, job_b, confidence=confidence), infer_schema_length=None)

    def efficiency(self, job: str, device: str | None = None) -> pl.DataFrame:
        """Each kernel of each rank against the device's peak, by time lost."""
        from ninefold.analysis.efficiency import by_kernel, compute_efficiency

        con = self._job(job, attributed=True)
        rows, _ = compute_efficiency(con, job, device=device)
        return pl.DataFrame(by_kernel(rows)["kernels"], infer_schema_length=None)

    def compare(self, job: str, config: str | Path, calibrate: bool = True) -> pl.DataFrame:
        """Predict JOB from CONFIG (calibrated from its trace), store the prediction beside the measurement (the
        report and the app show it) and return per ledger: measured_ns, predicted_ns, residual_ns and
        residual_share (of the measured step, the one definition every view uses)."""
        from ninefold.analysis.cost_model import compare as cmp
        from ninefold.analysis.cost_model.predict import predict_file
        from ninefold.analysis.cost_model.residual import residual_share
        from ninefold.analysis.ledgers import LEDGERS

        self._job(job, attributed=True)
        con = self._write()
        try:
            meas = cmp.measured(con, job)
            pred = predict_file(config, con, job, calibrate_from_trace=calibrate)
            cmp.store(con, job, pred)
        finally:
            con.close()
        res = cmp.residuals(meas, pred)
        step = sum(v["measured"] for v in res.values())
        return pl.DataFrame([{"ledger": led, "measured_ns": res[led]["measured"], "predicted_ns": res[led]["predicted"],
                              "residual_ns": res[led]["residual"],
                              "residual_share": residual_share(res[led]["residual"], step)} for led in LEDGERS])

    def report(self, job: str, out: str | Path) -> Path:
        """Write JOB's self-contained HTML report (the app's views, offline) to OUT."""
        from ninefold.dashboards.report import write_report

        con = self._job(job)
        return write_report(self.path, job, out, con=con)

    def predict(self, config: str | Path, job: str | None = None, calibrate: bool = True):
        """The cost model's prediction from a configuration TOML, calibrated from JOB's trace when given."""
        from ninefold.analysis.cost_model import predict_file

        con = self._job(job) if job else None
        return predict_file(config, con=con, job=job, calibrate_from_trace=calibrate)


def open(path: str | Path, read_only: bool = False, wait: float | None = None) -> Store:  # noqa: A001
    """Open (or create) the ninefold store at PATH."""
    return Store(path, read_only=read_only, wait=wait)
