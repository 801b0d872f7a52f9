"""Calibration from a trace: α and β per collective type and group size (least squares over matched
collectives, or over nccl-tests results), and achieved FLOP/s of GEMM kernels with recorded shapes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .collectives import BUSBW, canonical, ring_steps


@dataclass
class Fit:
    coll: str
    nranks: int
    alpha: float          # s per step
    beta: float           # bus bandwidth, bytes/s
    n: int                # points used
    rms_rel: float        # relative rms residual of the fit
    source: str           # trace | nccl-tests

    def time(self, nbytes: float) -> float:
        return self.alpha * ring_steps(self.coll, self.nranks) + BUSBW[self.coll](max(self.nranks, 2)) * nbytes / self.beta


def fit_alpha_beta(coll: str, nranks: int, sizes, times_s, source: str, alpha_prior: float = 0.0) -> Fit | None:
    """Least squares of t = α·steps(n) + x/β with x = busbw_factor(n)·bytes (numpy lstsq on [1, x]), each
    row weighted by 1/t so that the relative error is minimised (sizes span decades; unweighted, the largest
    message would set both terms). With a single message size α cannot be told from β: α is held at
    ``alpha_prior`` and β solved."""
    coll = canonical(coll)
    if coll is None:
        return None
    sizes = np.asarray(sizes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    ok = (sizes > 0) & (t > 0) & np.isfinite(t)
    sizes, t = sizes[ok], t[ok]
    if t.size == 0:
        return None
    steps = max(ring_steps(coll, nranks), 1)
    x = BUSBW[coll](max(nranks, 2)) * sizes
    if np.unique(sizes).size >= 2:
        A = np.column_stack([np.ones_like(x), x]) / t[:, None]
        (c0, c1), *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
        if c0 < 0:      # no latency term: refit the slope alone, same weighting
            w = x / t
            c0, c1 = 0.0, float(w.sum() / (w * w).sum())
        if c1 <= 0:
            return None
    else:
        c0 = min(alpha_prior * steps, float(t.min()) * 0.5)
        c1 = float(np.mean((t - c0) / x))
    pred = c0 + c1 * x
    rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return Fit(coll, int(nranks), float(c0 / steps), float(1.0 / c1), int(t.size), rms, source)


def transfer_times(con, job: str) -> list[tuple]:
    """(coll, group_size, bytes, transfer seconds) per matched collective: the transfer part only, i.e. the
    shortest member duration (from the last member's start to the common end) when several ranks are present,
    else the one duration."""
    rows = con.execute("""
        SELECT CASE WHEN lower(coll) IN ('send', 'recv', 'isend', 'irecv') THEN 'sendrecv' ELSE lower(coll) END
               AS coll, max(group_size), max(bytes), min(end_ns - start_ns), count(DISTINCT rank)
        FROM collectives WHERE job = ? AND bytes > 0 AND end_ns > start_ns AND coll IS NOT NULL
          AND source = 'kernel'
        GROUP BY coalesce(pg_name, ''), coalesce(seq, -1), 1,
                 CASE WHEN seq IS NULL THEN rank ELSE -1 END, CASE WHEN seq IS NULL THEN start_ns ELSE -1 END
        """, [job]).fetchall()
    return [(c, g or 2, b, d / 1e9, n) for c, g, b, d, n in rows if canonical(c)]


def fit_from_trace(con, job: str, alpha_prior: float = 0.0) -> list[Fit]:
    groups: dict = {}
    for coll, g, b, t, _n in transfer_times(con, job):
        key = (canonical(coll), int(g))
        groups.setdefault(key, ([], []))
        groups[key][0].append(b)
        groups[key][1].append(t)
    out = []
    for (coll, g), (b, t) in sorted(groups.items()):
        f = fit_alpha_beta(coll, g, b, t, "trace", alpha_prior)
        if f:
            out.append(f)
    return out


def fit_nccl_tests(df, alpha_prior: float = 0.0) -> list[Fit]:
    """Fit from an nccl-tests table with columns size_bytes, time_us, op, nranks, placement (out-of-place rows;
    in-place where a run has no out-of-place ones). ``df``: a polars / pandas DataFrame or dict of columns."""
    import polars as pl

    d = df if isinstance(df, pl.DataFrame) else pl.DataFrame(df)
    need = {"size_bytes", "time_us", "op", "nranks", "placement"}
    missing = need - set(d.columns)
    if missing:
        raise ValueError(f"nccl-tests table lacks column(s) {', '.join(sorted(missing))}")
    d = d.filter(pl.col("time_us").is_not_null() & (pl.col("size_bytes") > 0) & pl.col("nranks").is_not_null())
    out = []
    for (op, n), part in sorted(d.group_by(["op", "nranks"]), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        sel = part.filter(pl.col("placement") == "out")
        if sel.height == 0:
            sel = part
        f = fit_alpha_beta(op, int(n), sel["size_bytes"].to_numpy(), sel["time_us"].to_numpy() / 1e6,
                           "nccl-tests", alpha_prior)
        if f:
            out.append(f)
    return out


def fit_from_nccl_tests(con, job: str | None = None, alpha_prior: float = 0.0) -> list[Fit]:
    have = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'nccl_tests_results'"
                       ).fetchone()[0]
    if not have:
        return []
    import polars as pl

    rows = con.execute("SELECT size_bytes, time_us, op, nranks, placement FROM nccl_tests_results"
                       + (" WHERE job = ?" if job else ""), [job] if job else []).fetchall()
    if not rows:
        return []
    cols = list(zip(*rows))
    return fit_nccl_tests(pl.DataFrame({"size_bytes": cols[0], "time_us": cols[1], "op": cols[2],
                                        "nranks": cols[3], "placement": cols[4]}), alpha_prior)


GEMM_SQL = """
WITH op AS (
    SELECT rank, external_id, name, CAST(json_extract(args, '$."Input Dims"') AS VARCHAR) AS dims
    FROM host_ops WHERE job = ? AND cat = 'cpu_op' AND name IN ('aten::mm', 'aten::addmm', 'aten::bmm',
                                                                'aten::baddbmm')
      AND external_id IS NOT NULL AND json_extract(args, '$."Input Dims"') IS NOT NULL
), rt AS (
    SELECT rank, correlation, any_value(external_id) AS external_id FROM host_ops
    WHERE job = ? AND cat IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL GROUP BY ALL
), k AS (
    SELECT g.rank, coalesce(g.external_id, rt.external_id) AS external_id, g.end_ns - g.start_ns AS dur
    FROM gpu_ops g LEFT JOIN rt ON rt.rank = g.rank AND rt.correlation = g.correlation
    WHERE g.job = ? AND g.kind = 'kernel'
)
SELECT op.name, op.dims, sum(k.dur) AS ns FROM op JOIN k ON k.rank = op.rank AND k.external_id = op.external_id
GROUP BY op.rank, op.external_id, op.name, op.dims
"""


def gemm_flops(name: str, dims) -> float | None:
    """2·M·K·N for aten::mm [M,K]·[K,N]; aten::addmm (bias, [M,K], [K,N]); aten::bmm/baddbmm 2·B·M·K·N."""
    import json

    try:
        d = json.loads(dims) if isinstance(dims, str) else dims
        if name == "aten::mm":
            (M, K), (_K2, N) = d[0], d[1]
        elif name == "aten::addmm":
            (M, K), (_K2, N) = d[1], d[2]
        elif name == "aten::bmm":
            (B, M, K), (_B, _K2, N) = d[0], d[1]
            return 2.0 * B * M * K * N
        elif name == "aten::baddbmm":
            (B, M, K), (_B, _K2, N) = d[1], d[2]
            return 2.0 * B * M * K * N
        else:
            return None
    except (TypeError, ValueError, IndexError):
        return None
    return 2.0 * M * K * N


def gemm_achieved(con, job: str, min_flops: float = 1e8) -> dict | None:
    """Achieved FLOP/s of the GEMM kernels whose launching op recorded its shapes (Kineto ``Input Dims``,
    kernel linked to the op by External id, or via the launch's correlation). GEMMs under ``min_flops``
    are left out: their time is launch latency, not math."""
    rows = con.execute(GEMM_SQL, [job, job, job]).fetchall()
    fl = np.array([gemm_flops(n, d) or 0.0 for n, d, _ in rows], dtype=float)
    ns = np.array([r[2] for r in rows], dtype=float)
    keep = (fl >= min_flops) & (ns > 0)
    if not keep.any():
        return None
    return {"flops": float(fl[keep].sum()), "ns": float(ns[keep].sum()), "kernels": int(keep.sum()),
            "achieved": float(fl[keep].sum() / (ns[keep].sum() / 1e9))}
