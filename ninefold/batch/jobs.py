"""Batch discovery: the jobs under a drop directory (one sub-directory each, or a manifest), hashed; job logs."""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ninefold.store.errors import NinefoldError

JOB_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")


class BatchUsageError(NinefoldError):
    """A bad root, manifest, date or scheduler: nothing was processed."""



@dataclass
class JobSpec:
    name: str
    files: list[Path] = field(default_factory=list)
    shas: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def key(self) -> str:
        h = hashlib.sha256()
        for f, s in sorted(zip((p.name for p in self.files), self.shas)):
            h.update(f"{f}\0{s}\n".encode())
        return h.hexdigest()


def _parse_since(since) -> float | None:
    if since in (None, ""):
        return None
    if isinstance(since, (_dt.date, _dt.datetime)):
        d = since
    else:
        try:
            d = _dt.datetime.fromisoformat(str(since))
        except ValueError:
            raise BatchUsageError(f"--since {since!r}: not a date (YYYY-MM-DD or an ISO date-time)") from None
    if not isinstance(d, _dt.datetime):
        d = _dt.datetime(d.year, d.month, d.day)
    return d.timestamp()


def _from_manifest(path: Path) -> list[JobSpec]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BatchUsageError(f"{path}: cannot read the manifest ({e})") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if isinstance(jobs, dict):
        items = list(jobs.items())
    elif isinstance(jobs, list) and all(isinstance(j, dict) and "job" in j for j in jobs):
        items = [(j["job"], j.get("files", [])) for j in jobs]
    else:
        raise BatchUsageError(f"{path}: manifest needs \"jobs\": {{job: [files]}} or [{{\"job\", \"files\"}}]")
    out = []
    for name, files in items:
        js = JobSpec(str(name))
        if not isinstance(files, list) or not files:
            js.error = f"{path}: job {name!r}: no files listed"
        else:
            js.files = [(path.parent / f) if not Path(f).is_absolute() else Path(f) for f in map(str, files)]
            missing = [str(f) for f in js.files if not f.is_file()]
            if missing:
                js.error = f"{missing[0]}: no such file (listed in {path})"
        out.append(js)
    return out


def discover_jobs(root, manifest=None, since=None, exclude=()) -> list[JobSpec]:
    """The jobs under ROOT (one sub-directory each, or a manifest), with every file hashed.

    EXCLUDE: directories that are not jobs even when they sit under ROOT (the reports, the catalog's)."""
    from ninefold.ingest.load import discover, sha256_of

    root = Path(root)
    if not root.is_dir():
        raise BatchUsageError(f"{root}: no such directory")
    mpath = Path(manifest) if manifest else (root / "manifest.json")
    if manifest and not mpath.is_file():
        raise BatchUsageError(f"{mpath}: no such manifest file")
    if mpath.is_file():
        jobs = _from_manifest(mpath)
    else:
        jobs = []
        skip = {Path(x).resolve() for x in exclude}
        for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if any(x == d.resolve() or d.resolve() in x.parents for x in skip):
                continue
            js = JobSpec(d.name)
            try:
                js.files = [f for f, _ in discover([d])]
            except NinefoldError as e:
                js.error = str(e)
            jobs.append(js)
    names = [j.name for j in jobs]
    for j in jobs:
        if not JOB_NAME.match(j.name):
            j.error = f"job name {j.name!r}: use letters, digits and . _ + - only"
        elif names.count(j.name) > 1 and j.error is None:
            j.error = f"job {j.name!r} is listed more than once"
    cutoff = _parse_since(since)
    if cutoff is not None:
        jobs = [j for j in jobs if j.error or max(f.stat().st_mtime for f in j.files) >= cutoff]
    todo = [f for j in jobs if j.error is None for f in j.files]
    with ThreadPoolExecutor(max_workers=4) as pool:
        digests = dict(zip(todo, pool.map(sha256_of, todo)))
    for j in jobs:
        if j.error is None:
            j.shas = [digests[f] for f in j.files]
    return jobs


class JobLog:
    def __init__(self, reports: Path, job: str):
        self.path = reports / "logs" / f"{job}.log"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, *lines: str) -> None:
        stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        with open(self.path, "a", encoding="utf-8") as fh:
            for line in lines:
                for part in str(line).rstrip("\n").split("\n"):
                    fh.write(f"{stamp} {part}\n")
