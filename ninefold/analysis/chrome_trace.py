"""The one Chrome-trace (Kineto JSON) event writer of the export: exact microsecond timestamps, every other value
through the JSON serializer, complete events, flow ends and metadata, each as one line of text.
``ninefold.analysis.export`` writes stored jobs with it; the sample generators (``sample_traces.kineto_writer``) format
their timestamps with ``fmt_us`` and their names with ``json_str``.

Timestamps are integer nanoseconds written as microseconds with exactly three decimals (as Kineto's ``fmtTs``
prints them), never through a float, so a trace written here ingests back to the same nanoseconds. Everything
else — names, categories, pids and tids of any JSON type, args — goes through ``json.dumps``, so any value a
trace carried (a string tid such as ``"PyTorch Profiler"``, quotes, control characters) is written as valid JSON.
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


def _value(v) -> str:
    """A JSON value: an int as json.dumps writes it, a string through the cache, anything else json.dumps."""
    t = type(v)
    if t is int:
        return str(v)
    if t is str:
        return json_str(v)
    return json.dumps(v)


def event(ph: str, cat: str, name: str, pid, tid, ts_ns: int, dur_ns: int | None = None,
          args: str | dict | None = None, extra: dict | None = None) -> str:
    """One event object: ``ph``/``cat``/``name``/``pid``/``tid`` and EXTRA's members (any JSON values, through
    the serializer), ``ts`` (+ ``dur``) as exact microseconds, and ``args`` (a dict, or the JSON text of one as
    the store keeps it)."""
    s = (f'{{"ph": {json_str(ph)}, "cat": {_value(cat)}, "name": {_value(name)}, "pid": {_value(pid)}, '
         f'"tid": {_value(tid)}')
    if extra:
        s += ", " + json.dumps(extra)[1:-1]
    s += f', "ts": {fmt_us(ts_ns)}'
    if dur_ns is not None:
        s += f', "dur": {fmt_us(dur_ns)}'
    if args is not None:
        s += ', "args": ' + (args if isinstance(args, str) else json.dumps(args, default=str))
    return s + "}"


def meta(pid, tid, what: str, name: str, sort: int | None = None) -> str:
    """A ``process_name``/``thread_name`` metadata event (and its ``*_sort_index`` when SORT is given)."""
    s = json.dumps({"ph": "M", "name": what, "pid": pid, "tid": tid, "args": {"name": name}})
    if sort is None:
        return s
    return s + ",\n" + json.dumps({"ph": "M", "name": f"{what.split('_')[0]}_sort_index", "pid": pid, "tid": tid,
                                   "args": {"sort_index": sort}})
