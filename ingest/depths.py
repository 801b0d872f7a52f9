"""Nesting depth of host intervals on their thread, computed over columns instead of a SQL window.

The depth of an interval is the running sum over every start (+1) and end (-1) point of its thread, ordered by
time, ends before starts at the same time, and among starts at the same time the longer (outer) one first,
taken at its own start, minus one. That running sum is, for interval i:

    (starts ordered before i's start) + 1  -  (ends at or before i's start)  -  1

so it is one sort of the starts, one of the ends and a binary search per interval: no sort of the 2N points
with a window over one partition (which DuckDB runs on one thread when a trace has one busy thread). Intervals
with the same thread, start and end are ordered by ORD (their position in the document); the SQL window left
that tie to chance, and gave the same multiset of depths.
"""
from __future__ import annotations

import numpy as np


def interval_depths(th, start, end, ord_) -> np.ndarray:
    """Per row (in the order given), the depth of interval [START, END) on thread TH (int64 arrays)."""
    th, start, end, ord_ = (np.asarray(a, dtype=np.int64) for a in (th, start, end, ord_))
    n = th.size
    depth = np.empty(n, np.int64)
    if not n:
        return depth
    by_start = np.lexsort((ord_, -end, start, th))
    by_end = np.lexsort((end, th))
    ts, ss = th[by_start], start[by_start]
    es = end[by_end]          # th[by_end] is ts: both are the thread column sorted
    cut = np.flatnonzero(ts[1:] != ts[:-1]) + 1
    lo = np.concatenate(([0], cut))
    hi = np.concatenate((cut, [n]))
    sorted_depth = np.empty(n, np.int64)
    for a, b in zip(lo.tolist(), hi.tolist()):
        closed = np.searchsorted(es[a:b], ss[a:b], side="right")     # ends at or before each start
        sorted_depth[a:b] = np.arange(b - a) - closed
    depth[by_start] = sorted_depth
    return depth
