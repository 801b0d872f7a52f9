"""numba kernels of the cross-rank alignment (ninefold.analysis.attribution.alignment): group orders, per-group reductions and dense
ranks over integer keys, each O(n) or one sort, with the same results as the numpy / SQL they replace."""
from __future__ import annotations

import numba as nb
import numpy as np

from ninefold.store.arrays import filled, strings


@nb.njit(cache=True, nogil=True)
def group_order(g, n):
    """Counting sort of group ids g (0..n-1): the order o with g[o] non-decreasing, ties in index order (as
    np.argsort(g, kind="stable")), the count of each group and the edges (0, cumsum of the counts)."""
    cnt = np.zeros(n, np.int64)
    for i in range(g.size):
        cnt[g[i]] += 1
    edges = np.empty(n + 1, np.int64)
    edges[0] = 0
    for k in range(n):
        edges[k + 1] = edges[k] + cnt[k]
    pos = edges[:-1].copy()
    o = np.empty(g.size, np.int64)
    for i in range(g.size):
        k = g[i]
        o[pos[k]] = i
        pos[k] += 1
    return o, cnt, edges


@nb.njit(cache=True, nogil=True)
def group_max(g, v, n, init):
    """np.maximum.at(np.full(n, init), g, v)."""
    out = np.full(n, init, np.int64)
    for i in range(g.size):
        if v[i] > out[g[i]]:
            out[g[i]] = v[i]
    return out


@nb.njit(cache=True, nogil=True)
def group_min(g, v, n, init):
    """np.minimum.at(np.full(n, init), g, v)."""
    out = np.full(n, init, np.int64)
    for i in range(g.size):
        if v[i] < out[g[i]]:
            out[g[i]] = v[i]
    return out


@nb.njit(cache=True, nogil=True)
def group_spread(g, v, n):
    """The max and the min of v within each group (iinfo(int64).min / .max where a group is empty)."""
    hi = np.full(n, np.iinfo(np.int64).min, np.int64)
    lo = np.full(n, np.iinfo(np.int64).max, np.int64)
    for i in range(g.size):
        k = g[i]
        if v[i] > hi[k]:
            hi[k] = v[i]
        if v[i] < lo[k]:
            lo[k] = v[i]
    return hi, lo


@nb.njit(cache=True, nogil=True)
def distinct_members(o, edges, r, n_r):
    """Distinct values of r (0..n_r-1) within each group, the groups given by a group order o and its edges."""
    n = edges.size - 1
    out = np.zeros(n, np.int64)
    seen = np.full(n_r, -1, np.int64)
    for k in range(n):
        c = 0
        for j in range(edges[k], edges[k + 1]):
            x = r[o[j]]
            if seen[x] != k:
                seen[x] = k
                c += 1
        out[k] = c
    return out


@nb.njit(cache=True, nogil=True)
def _dense_rank_span(key, lo, span):
    """dense_rank where the keys lie in [lo, lo + span): the rank of each present value by a counting pass."""
    at = np.zeros(span, np.int64)
    for i in range(key.size):
        at[key[i] - lo] = 1
    c = 0
    for j in range(span):
        if at[j]:
            at[j] = c
            c += 1
    out = np.empty(key.size, np.int64)
    for i in range(key.size):
        out[i] = at[key[i] - lo]
    return out


def dense_rank(key):
    """0-based dense rank of each int64 key (SQL dense_rank() OVER (ORDER BY key) − 1): a counting pass where
    the keys' range is within a few times their number (sequence numbers of a trace), else one sort."""
    key = np.asarray(key, dtype=np.int64)
    if key.size == 0:
        return np.zeros(0, np.int64)
    lo, hi = int(key.min()), int(key.max())
    if hi - lo < 4 * key.size + 1024:
        return _dense_rank_span(key, lo, hi - lo + 1)
    o = np.argsort(key, kind="stable")
    ks = key[o]
    ids = np.empty(key.size, np.int64)
    ids[0] = 0
    np.cumsum(ks[1:] != ks[:-1], out=ids[1:])
    out = np.empty(key.size, np.int64)
    out[o] = ids
    return out


def dense_rank_rows(cols):
    """0-based dense rank of rows over several int64 key columns, most significant first (ORDER BY c0, c1,
    ...): one int64 key where the ranges fit, else a lexsort."""
    cols = [np.asarray(c, dtype=np.int64) for c in cols]
    n = cols[0].size if cols else 0
    if n == 0:
        return np.zeros(0, np.int64)
    span, key = 1, np.zeros(n, np.int64)
    lows = [int(c.min()) for c in cols]
    widths = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows)]
    for w in widths:
        span *= w
    if span < 2 ** 62:
        for c, lo, w in zip(cols, lows, widths):
            key = key * w + (c - lo)
        return dense_rank(key)
    o = np.lexsort(cols[::-1])
    diff = np.zeros(n - 1, dtype=bool)
    for c in cols:
        cs = c[o]
        diff |= cs[1:] != cs[:-1]
    ids = np.empty(n, np.int64)
    ids[0] = 0
    np.cumsum(diff, out=ids[1:])
    out = np.empty(n, np.int64)
    out[o] = ids
    return out


def string_ranks(arr):
    """Each value of an Arrow string array as its rank among the distinct values in byte order (DuckDB's
    VARCHAR order), NULL read as '' ; returns int64 codes."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else strings([])
    arr = arr.cast(pa.string())
    if len(arr) == 0:
        return np.zeros(0, np.int64)
    d = arr.dictionary_encode()
    vals = d.dictionary.to_pylist()
    keyset = sorted(set(vals) | ({""} if d.null_count else set()), key=lambda s: s.encode("utf-8"))
    pos = {s: k for k, s in enumerate(keyset)}
    lut = np.array([pos[s] for s in vals] + [pos.get("", 0)], dtype=np.int64)
    idx = filled(d.indices, len(vals)).astype(np.int64)
    return lut[idx]
