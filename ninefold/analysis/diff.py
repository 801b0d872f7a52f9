"""What changed between two attributed jobs, beyond the step-to-step noise.

Every step window is a sample: for each key (a ledger; a kernel class's charged compute; a collective type's
exposed communication; a kernel, by normalised name, over the ledgers it is charged to) the time per step is the
job's total over all ranks in that step. ``diff_jobs`` compares the per-step means of A and B with a percentile
bootstrap of the difference (steps resampled with replacement within each job, seeded: the same inputs give the
same interval), its confidence held for the whole table (Bonferroni over the rows). A row is significant when the interval excludes zero and the change is at least ``floor`` of
A's step (all ranks' windows): a shift smaller than that is not worth a reader's time even when it is real.

``diff_jobs`` is ``step_samples`` (one job's per-step sums, read from a store) for each job, then ``diff_samples``
(the comparison, a pure function of the two jobs' samples): a caller that kept the samples elsewhere (the nightly
batch keeps each night's) compares them without the jobs' rows. The bootstrap runs a few keys at a time, so
its memory stays bounded on long jobs with many kernels; the values are those of one pass.
"""
from __future__ import annotations

import re

import numpy as np

from ninefold.analysis.ledgers import LEDGERS

LEVELS = ("ledger", "kclass", "coll", "kernel")
_TEMPLATE = re.compile(r"<.*>|\(.*\)")
_SHAPE = re.compile(r"\d+(x\d+)+")
_NUM = re.compile(r"\d+")


class DiffError(ValueError):
    """A job that cannot be compared (missing, or not attributed)."""


def normalise_kernel(name: str) -> str:
    """A kernel's name with template arguments, call arguments and tile/shape suffixes folded, so the same kernel
    recompiled for another shape (or by another compiler version) is matched: '<...>' and '(...)' dropped,
    '128x128x64' -> 'N', other numbers -> '#'."""
    s = _TEMPLATE.sub("", name or "")
    s = _SHAPE.sub("N", s)
    return _NUM.sub("#", s).strip()


def step_samples(con, job: str) -> tuple[list, dict]:
    """JOB's steps, and per level and key the time per step (sum over ranks) as {(level, key): {step: ns}}.

    Every step is a key of ``("ledger", "step")``'s samples (its windows' sum, 0 included)."""
    have = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if not {"step_windows", "ledger_totals", "ledger_intervals", "kernel_classes"} <= have:
        raise DiffError(f"job {job!r} has no attributed steps: run `ninefold attribute` first")
    steps = [r[0] for r in con.execute("SELECT DISTINCT step FROM step_windows WHERE job = ? ORDER BY 1",
                                       [job]).fetchall()]
    if not steps:
        raise DiffError(f"job {job!r} has no attributed steps: run `ninefold attribute` first")
    out: dict = {}

    def add(level, rows, key_fn=lambda k: k):
        for step, key, ns in rows:
            d = out.setdefault((level, key_fn(key)), {})
            d[step] = d.get(step, 0) + int(ns)

    add("ledger", con.execute("SELECT step, ledger, sum(ns) FROM ledger_totals WHERE job = ? GROUP BY ALL",
                              [job]).fetchall())
    add("ledger", con.execute("""SELECT step, 'step', sum(end_ns - start_ns) FROM step_windows WHERE job = ?
                                 GROUP BY ALL""", [job]).fetchall())
    add("kclass", con.execute("""
        SELECT i.step, k.kclass, sum(i.end_ns - i.start_ns) FROM ledger_intervals i
        JOIN kernel_classes k ON k.job = i.job AND k.name = i.op_name
        WHERE i.job = ? AND i.ledger IN ('compute', 'recompute') GROUP BY ALL""", [job]).fetchall())
    add("coll", con.execute("""
        SELECT i.step, k.kclass, sum(i.end_ns - i.start_ns) FROM ledger_intervals i
        JOIN kernel_classes k ON k.job = i.job AND k.name = i.op_name
        WHERE i.job = ? AND i.ledger = 'exposed_comm' AND k.family = 'comm' GROUP BY ALL""", [job]).fetchall())
    add("kernel", con.execute("""
        SELECT step, op_name, sum(end_ns - start_ns) FROM ledger_intervals
        WHERE job = ? AND op_name IS NOT NULL AND ledger IN ('compute', 'recompute', 'exposed_comm', 'memcpy')
        GROUP BY ALL""", [job]).fetchall(), normalise_kernel)
    return steps, out


def _matrix(keys, samples, steps):
    m = np.zeros((len(keys), len(steps)), dtype=np.float64)
    col = {s: j for j, s in enumerate(steps)}
    for i, k in enumerate(keys):
        for s, v in samples.get(k, {}).items():
            m[i, col[s]] = v
    return m


_BOOT_CELLS = 1 << 24   # bootstrap cells (keys x resamples x steps) held at once


def diff_jobs(con, job_a: str, job_b: str, resamples: int = 4000, confidence: float = 0.95,
              floor: float = 0.005, seed: int = 0) -> list[dict]:
    """One row per (level, key) present in A or B: a_ns / b_ns (time per step, all ranks), delta_ns, delta_share
    (of A's step), the bootstrap interval of the delta, significant, and status (same | new | vanished)."""
    for j in (job_a, job_b):
        if not con.execute("SELECT count(*) FROM traces WHERE job = ?", [j]).fetchone()[0]:
            raise DiffError(f"no job {j!r} in the store")
    sa, xa = step_samples(con, job_a)
    sb, xb = step_samples(con, job_b)
    return diff_samples(sa, xa, sb, xb, resamples=resamples, confidence=confidence, floor=floor, seed=seed)


def diff_samples(sa: list, xa: dict, sb: list, xb: dict, resamples: int = 4000, confidence: float = 0.95,
                 floor: float = 0.005, seed: int = 0) -> list[dict]:
    """``diff_jobs`` over two jobs' ``step_samples`` (steps, {(level, key): {step: ns}}): the same rows."""
    if not sa or not sb:
        raise DiffError("a job without steps cannot be compared")
    keys = sorted(set(xa) | set(xb), key=lambda k: (LEVELS.index(k[0]), k[1]))
    a, b = _matrix(keys, xa, sa), _matrix(keys, xb, sb)
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, a.shape[1], size=(resamples, a.shape[1]))
    ib = rng.integers(0, b.shape[1], size=(resamples, b.shape[1]))
    # the confidence holds for the whole table, not per row (Bonferroni over the rows compared)
    alpha = (1 - confidence) / max(1, len(keys))
    lo, hi = np.empty(len(keys)), np.empty(len(keys))
    # the bootstrap a few keys at a time (each key's interval is its own): memory bounded, the same values
    chunk = max(1, _BOOT_CELLS // max(1, resamples * max(a.shape[1], b.shape[1])))
    for k0 in range(0, len(keys), chunk):
        k1 = min(len(keys), k0 + chunk)
        boot = b[k0:k1, ib].mean(axis=2) - a[k0:k1, ia].mean(axis=2)  # [key, resample]
        lo[k0:k1], hi[k0:k1] = np.percentile(boot, [alpha / 2 * 100, (1 - alpha / 2) * 100], axis=1)
    ma, mb = a.mean(axis=1), b.mean(axis=1)
    step_a = ma[keys.index(("ledger", "step"))]
    rows = []
    for i, (level, key) in enumerate(keys):
        delta = mb[i] - ma[i]
        rows.append({
            "level": level, "key": key, "a_ns": int(round(ma[i])), "b_ns": int(round(mb[i])),
            "delta_ns": int(round(delta)), "delta_share": float(delta / step_a) if step_a else 0.0,
            "ci_low_ns": int(np.floor(lo[i])), "ci_high_ns": int(np.ceil(hi[i])),
            "significant": bool((lo[i] > 0 or hi[i] < 0) and abs(delta) >= floor * step_a),
            "status": "new" if (level, key) not in xa else "vanished" if (level, key) not in xb else "same",
            "steps_a": len(sa), "steps_b": len(sb)})
    return rows


def order_rows(rows: list[dict]) -> list[dict]:
    """Ledgers in the LEDGERS order (the step first), then each other level by the size of its change."""
    led = {n: i for i, n in enumerate(("step",) + tuple(LEDGERS))}
    return sorted(rows, key=lambda r: (LEVELS.index(r["level"]),
                                       led.get(r["key"], 99) if r["level"] == "ledger" else -abs(r["delta_ns"])))
