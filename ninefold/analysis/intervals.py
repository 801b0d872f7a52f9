"""Interval algebra on int64 arrays of half-open intervals [start, end). Vectorised, no loop per event."""
import numpy as np


def i64(a):
    return np.asarray(a, dtype=np.int64)


def union(starts, ends):
    """Sorted disjoint union of intervals."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    out_s = s[idx]
    out_e = np.maximum.reduceat(e, idx)
    return out_s, out_e


def covered(points, us, ue):
    """For each point, whether it lies inside the disjoint sorted union (us, ue)."""
    if us.size == 0:
        return np.zeros(len(points), dtype=bool)
    i = np.searchsorted(us, points, side="right") - 1
    ok = i >= 0
    res = np.zeros(len(points), dtype=bool)
    res[ok] = points[ok] < ue[i[ok]]
    return res


def total(us, ue):
    return int((ue - us).sum()) if us.size else 0


def clip(starts, ends, lo, hi):
    s = np.clip(np.asarray(starts, dtype=np.int64), lo, hi)
    e = np.clip(np.asarray(ends, dtype=np.int64), lo, hi)
    return s, e
