"""The one Chrome-trace (Kineto JSON) text writer of the project: exact microsecond timestamps, JSON string
literals, complete events, flow ends and metadata, each as one line of text. ``analysis.export`` writes stored
jobs with it; the sample generators (``sample_traces.kineto_writer``) write their rank files with it.

Timestamps are integer nanoseconds written as microseconds with exactly three decimals (as Kineto's ``fmtTs``
prints them), never through a float, so a trace written here ingests back to the same nanoseconds.
"""
from __future__ import annotations

import json

_J: dict = {}


def fmt_us(ns: int) -> str:
    """Integer ns -> microseconds with exactly three decimals (``-1`` -> ``-0.001``)."""
    ns = int(ns)
    if ns < 0:
        return "-" + fmt_us(-ns)
    return f"{ns // 1000}.{ns % 1000:03d}"


def json_str(s: str) -> str:
    """A JSON string literal (cached: trace names repeat)."""
    v = _J.get(s)
    if v is None:
        v = _J[s] = json.dumps(s)
    return v


def event(ph: str, cat: str, name: str, pid, tid, ts_ns: int, dur_ns: int | None = None,
          args: str | None = None, extra: str = "") -> str:
    """One event object: ``ph``/``cat``/``name``/``pid``/``tid``/``ts`` (+ ``dur``, ``args`` as JSON text, and
    EXTRA, text of further members starting with ', ')."""
    s = (f'{{"ph": "{ph}", "cat": {json_str(cat)}, "name": {json_str(name)}, "pid": {pid}, "tid": {tid}, '
         f'"ts": {fmt_us(ts_ns)}')
    if dur_ns is not None:
        s += f', "dur": {fmt_us(dur_ns)}'
    if args is not None:
        s += f', "args": {args}'
    return s + extra + "}"


def meta(pid, tid, what: str, name: str, sort: int | None = None) -> str:
    """A ``process_name``/``thread_name`` metadata event (and its ``*_sort_index`` when SORT is given)."""
    s = f'{{"ph": "M", "name": "{what}", "pid": {pid}, "tid": {tid}, "args": {{"name": {json_str(name)}}}}}'
    if sort is None:
        return s
    return s + f',\n{{"ph": "M", "name": "{what.split("_")[0]}_sort_index", "pid": {pid}, "tid": {tid}, ' \
               f'"args": {{"sort_index": {sort}}}}}'
