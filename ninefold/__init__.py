"""ninefold: where every nanosecond of every GPU of a training job went.

The Python API (docs/api.md)::

    import ninefold
    with ninefold.open("runs.duckdb") as s:
        s.ingest("traces/run17/", job="run17")
        s.attribute("run17")
        s.ledgers("run17")          # a polars DataFrame

The names below load on first use, so importing a submodule (the CLI, a worker) does not pay for them.
"""
from __future__ import annotations

__all__ = ["IngestReport", "NinefoldError", "NotAttributed", "Store", "UnknownJob", "open"]

_API = {"IngestReport", "NotAttributed", "Store", "UnknownJob", "open"}


def __getattr__(name: str):
    if name in _API:
        from ninefold import api

        return getattr(api, name)
    if name == "NinefoldError":
        from ninefold.store.errors import NinefoldError

        return NinefoldError
    raise AttributeError(f"module 'ninefold' has no attribute {name!r}")
