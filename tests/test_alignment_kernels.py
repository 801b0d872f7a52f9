"""The alignment kernels give what the numpy / SQL they replace gives: empty input, empty groups, single
members, p2p and NULL keys."""
import duckdb
import numpy as np
import pyarrow as pa
import pytest

from ninefold.analysis.attribution.align_kernels import (dense_rank_rows, distinct_members, group_max, group_min, group_order,
                                    group_spread, string_ranks)

I64 = np.iinfo(np.int64)


@pytest.mark.parametrize("n,G", [(0, 0), (0, 3), (1, 1), (7, 5), (500, 40), (2000, 3)])
def test_group_kernels_match_numpy(n, G):
    rng = np.random.default_rng(n + G)
    g = rng.integers(0, G, n) if G else np.zeros(0, np.int64)
    v = rng.integers(-10 ** 12, 10 ** 12, n)
    o, cnt, edges = group_order(g, G)
    assert np.array_equal(o, np.argsort(g, kind="stable"))
    assert np.array_equal(cnt, np.bincount(g, minlength=G))
    assert np.array_equal(edges, np.concatenate(([0], np.cumsum(cnt))).astype(np.int64))
    for init in (0, I64.min):
        ref = np.full(G, init, np.int64)
        np.maximum.at(ref, g, v)
        assert np.array_equal(group_max(g, v, G, init), ref)
    ref = np.full(G, I64.max, np.int64)
    np.minimum.at(ref, g, v)
    assert np.array_equal(group_min(g, v, G, I64.max), ref)
    hi, lo = group_spread(g, v, G)
    assert np.array_equal(lo, ref)
    assert np.array_equal(hi, group_max(g, v, G, I64.min))
    R = 4
    r = rng.integers(0, R, n)
    pair = np.sort(g * R + r)
    pair = pair[np.concatenate(([True], pair[1:] != pair[:-1]))] if n else pair
    assert np.array_equal(distinct_members(o, edges, r, R), np.bincount(pair // R, minlength=G))


def test_empty_groups_keep_sentinels():
    g = np.array([2, 2, 0], np.int64)
    v = np.array([5, -3, 9], np.int64)
    assert group_max(g, v, 4, I64.min).tolist() == [9, I64.min, 5, I64.min]
    assert group_min(g, v, 4, I64.max).tolist() == [9, I64.max, -3, I64.max]
    o, cnt, edges = group_order(g, 4)
    assert distinct_members(o, edges, np.array([1, 1, 0]), 2).tolist() == [1, 0, 1, 0]  # one rank twice: 1


def _sql_dense_rank(pg, seq, coll):
    con = duckdb.connect()
    con.register("t", pa.table({"i": pa.array(range(len(seq)), pa.int64()), "pg_name": pa.array(pg, pa.string()),
                                "seq": pa.array(seq, pa.int64()), "coll": pa.array(coll, pa.string())}))
    rows = con.sql("""SELECT i, lower(coll) IN ('send', 'recv') AS p2p, nullif(pg_name, '') AS pg,
        dense_rank() OVER (ORDER BY pg_name, seq, lower(coll) IN ('send', 'recv')) - 1 AS gid FROM t ORDER BY i
        """).to_arrow_table()
    return rows


# the key's span: small (a counting pass), beyond a few times the rows (one sort), beyond int64 (lexsort)
@pytest.mark.parametrize("scale", [1, 10 ** 6, 2 ** 60])
def test_dense_rank_matches_sql(scale):
    rng = np.random.default_rng(7)
    n = 400
    names = ["", "0", "10", "2", "b", "B", "é", "z", "pg:1"]
    pg = [names[k] for k in rng.integers(0, len(names), n)]
    seq = rng.integers(0, 6, n) * scale
    colls = ["allreduce", "send", "Recv", None, "allgather"]
    coll = [colls[k] for k in rng.integers(0, len(colls), n)]
    t = _sql_dense_rank(pg, seq.tolist(), coll)
    p2p = t.column("p2p")
    p2p3 = np.where(p2p.is_null().to_numpy(), 2, p2p.fill_null(False).to_numpy().astype(np.int64))
    got = dense_rank_rows([string_ranks(t.column("pg")), seq, p2p3])
    assert got.tolist() == t.column("gid").to_pylist()


@pytest.mark.parametrize("span", [1, 50, 5000, 10 ** 12])
def test_dense_rank_matches_numpy_unique(span):
    from ninefold.analysis.attribution.align_kernels import dense_rank

    key = np.random.default_rng(span).integers(-span, span, 3000)
    assert np.array_equal(dense_rank(key), np.unique(key, return_inverse=True)[1].ravel())


def test_dense_rank_edge_cases():
    assert dense_rank_rows([np.zeros(0, np.int64)]).size == 0
    assert dense_rank_rows([np.array([5])]).tolist() == [0]
    assert dense_rank_rows([np.array([3, 1, 3, 2]), np.array([0, 9, 0, -1])]).tolist() == [2, 0, 2, 1]
    assert string_ranks(pa.chunked_array([], pa.string())).size == 0
    assert string_ranks(pa.array([None, "a", ""])).tolist() == [0, 1, 0]  # NULL and '' alike
    assert string_ranks(pa.chunked_array([["b", "a"], ["a", None]])).tolist() == [2, 1, 1, 0]


def _estimate_offsets_numpy(gm, rm_, em, G, R):
    """The offset estimate as numpy computed it before the compiled one (np.median per group)."""
    def median(g, n, v):
        return np.array([np.median(v[g == k]) if (g == k).any() else np.nan for k in range(n)])

    off = np.zeros(R, dtype=np.int64)
    for _ in range(2):
        adj = em - off[rm_]
        dev = adj - median(gm, G, adj)[gm]
        d = median(rm_, R, dev)
        has = ~np.isnan(d)
        off[has] += np.trunc(d[has]).astype(np.int64)
        off -= off[0]
    adj = em - off[rm_]
    ad = np.abs(adj - median(gm, G, adj)[gm])
    med = median(rm_, R, ad)
    resid = np.where(np.isnan(med), 0, np.trunc(np.nan_to_num(med))).astype(np.int64)
    return off, resid, np.bincount(rm_, minlength=R)


@pytest.mark.parametrize("seed,G,R", [(0, 1, 2), (1, 7, 3), (2, 40, 5), (3, 300, 8), (4, 25, 6)])
def test_offset_estimate_matches_numpy_medians(seed, G, R):
    from ninefold.analysis.attribution.alignment import _estimate_offsets

    rng = np.random.default_rng(seed)
    # members of each collective: a random subset of ranks (even and odd counts); one rank may have none
    rows = [(g, r) for g in range(G) for r in range(R - (seed % 2)) if rng.random() < 0.7]
    gm = np.array([g for g, _ in rows], np.int64)
    rm_ = np.array([r for _, r in rows], np.int64)
    skew = rng.integers(-50_000, 50_000, R)
    em = gm * 1_000_000 + skew[rm_] + rng.integers(0, 3_000, gm.size)
    got = _estimate_offsets(gm, rm_, em, G, R)
    want = _estimate_offsets_numpy(gm, rm_, em, G, R)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    assert np.any(got[0] != 0) and (G < 5 or np.any(got[1] != 0))  # offsets found, residuals left


@pytest.mark.parametrize("seed", range(4))
def test_group_medians_match_numpy(seed):
    """Groups of 1 to 700 members (the selection's short and long paths), with runs of equal values, sorted and
    reversed runs, halves, and values past 2^53 (the median of the rounded values): np.median's answer each time."""
    from ninefold.analysis.attribution.alignment import _group_medians

    rng = np.random.default_rng(seed)
    sizes = [0, 1, 2, 3, 16, 17, 18, 64, 65, 200, 701, 700]
    vals = []
    for k, n in enumerate(sizes):
        kind = (k + seed) % 5
        if kind == 0:
            v = rng.integers(-10**6, 10**6, n).astype(np.float64)
        elif kind == 1:
            v = rng.integers(0, 3, n).astype(np.float64)          # few distinct values
        elif kind == 2:
            v = np.sort(rng.integers(0, 10**4, n)).astype(np.float64)[::-1 if seed % 2 else 1].copy()
        elif kind == 3:
            v = rng.integers(-10**4, 10**4, n) + 0.5
        else:
            v = (rng.integers(0, 1000, n) + 2**60).astype(np.float64)
        vals.append(v)
    g = np.repeat(np.arange(len(sizes)), sizes)
    v = np.concatenate(vals)
    perm = rng.permutation(v.size)              # members of a group are not contiguous
    g, v = g[perm], v[perm]
    from ninefold.analysis.attribution.align_kernels import group_order

    o, _, edges = group_order(g, len(sizes))
    got = _group_medians(o, edges, v)
    want = np.array([np.median(v[g == k]) if n else np.nan for k, n in enumerate(sizes)])
    assert np.array_equal(got, want, equal_nan=True)
