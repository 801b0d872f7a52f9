"""Nesting depth of host intervals on their thread, computed over columns instead of a SQL window.

The depth of an interval is the running sum over every start (+1) and end (-1) point of its thread, ordered by
time, ends before starts at the same time, and among starts at the same time the longer (outer) one first,
taken at its own start, minus one. That running sum is, for interval i:

    (starts ordered before i's start) + 1  -  (ends at or before i's start)  -  1

so it is one sort of the starts, one of the ends and a binary search per interval: no sort of the 2N points
with a window over one partition (which DuckDB runs on one thread when a trace has one busy thread). Intervals
with the same thread, start and end are ordered by ORD (their position in the document); the SQL window left
that tie to chance, and gave the same multiset of depths. The rule of Kineto host ops (ninefold.ingest.kineto_tables) and
of Nsight Systems NVTX ranges (ninefold.ingest.nsys_rows).
"""
from __future__ import annotations

import numpy as np


def sorted_depths(th, start, end) -> np.ndarray:
    """The depth of each interval [START, END) on its thread TH, for rows already ordered by (thread, start, end
    descending, ord), in that order. Needs only a sorted copy of each thread's ends beside the input (ingest
    sorts in SQL, within DuckDB's memory limit, and hands the sorted columns over)."""
    th, start, end = (np.asarray(a) for a in (th, start, end))
    n = th.size
    depth = np.empty(n, np.int64)
    cut = np.flatnonzero(th[1:] != th[:-1]) + 1
    for a, b in zip(np.concatenate(([0], cut)).tolist(), np.concatenate((cut, [n])).tolist()):
        d = depth[a:b]
        d[:] = np.searchsorted(np.sort(end[a:b]), start[a:b], side="right")     # ends at or before each start
        np.subtract(np.arange(b - a), d, out=d)
    return depth
