"""Which loader takes which file.

Each source format lives in its own module and exposes ``LOADER``, a :class:`Loader`. ``ingest_paths``
asks every loader in turn whether it claims a file (by name, then by its first bytes), so adding a
format never touches the Kineto path.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# Modules that may define LOADER, asked in this order. Kineto is not among them: a file no loader claims is read
# as Kineto (the fallback for *.json / *.json.gz).
LOADER_MODULES = [
    "ninefold.ingest.nsys",
    "ninefold.ingest.nccl_log",
    "ninefold.ingest.nccl_tests",
    "ninefold.ingest.flight_recorder",
]


@dataclass
class Loader:
    name: str                                   # the `format` it stores under, e.g. "nsys"
    suffixes: tuple[str, ...]                   # file names it may claim when a directory is scanned
    claims: Callable[[Path, bytes], bool]       # (path, first 64 KiB) -> True when this loader takes the file
    # (con, path, job, rank, replace, salvage) -> LoadResult or list[LoadResult]
    load: Callable
    description: str = ""
    extra: dict = field(default_factory=dict)


def loaders() -> list[Loader]:
    out = []
    for mod in LOADER_MODULES:
        if importlib.util.find_spec(mod) is None:
            continue
        m = importlib.import_module(mod)
        if hasattr(m, "LOADER"):
            out.append(m.LOADER)
    return out


def head_bytes(path: Path, n: int = 1 << 16) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def loader_for(path: Path) -> Loader | None:
    """The non-Kineto loader that claims PATH, or None (then Kineto's own sniffing decides)."""
    head = head_bytes(path)
    for ld in loaders():
        if ld.claims(path, head):
            return ld
    return None


def all_suffixes() -> tuple[str, ...]:
    s = {".json", ".json.gz"}
    for ld in loaders():
        s.update(ld.suffixes)
    return tuple(sorted(s))
