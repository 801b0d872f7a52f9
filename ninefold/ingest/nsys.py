"""Nsight Systems SQLite export (``nsys export --type sqlite``) → canonical tables.

This module loads one file in one transaction; its parts: ``ninefold.ingest.nsys_read`` (the file's checks, schema and
tables as Arrow), ``ninefold.ingest.nsys_ranks`` (which rank each process is), ``ninefold.ingest.nsys_rows`` (the rows written).

Read path. Tables are read column-wise into Arrow through the ADBC SQLite driver (``adbc-driver-sqlite``,
a pyproject dependency), side by side in threads (a large table in rowid ranges, each query on a
connection of its own), and joined, decoded and written by DuckDB SQL; no Python code touches a row, except in
a batch of text that is not valid UTF-8 (SQLite stores text bytes unchecked: a lone surrogate, a cut character),
which is repaired to U+FFFD before DuckDB sees it (diagnostic ``repaired_strings``) as the Kineto reader does.
SQLite itself reads every page, so a damaged file is reported as SQLite reports it. DuckDB's own ``sqlite``
extension is not used: it is downloaded at run time, and a fresh machine without access to the extension
repository cannot load it. The ADBC driver infers a
column's Arrow type from its first batch, so every integer column is read as ``CAST(x AS INTEGER)`` and
every text column as ``ifnull(CAST(x AS TEXT), '')`` (then ``nullif`` in DuckDB): an all-NULL first batch
can then never fix the wrong type. Small tables (ranks, enums) are built in DuckDB from Python lists, never
as Arrow from Python objects: pyarrow imports pandas for that, half a second per process.

Schema. Tables are created lazily by nsys and columns move between export versions (2.9.1 has no
ENUM_* tables and calls the metadata table EXPORT_META_DATA; 3.x has META_DATA_EXPORT, greenContextId,
binaryData, ...). Every table and column is looked up in ``sqlite_master``/``PRAGMA table_info``
before it is read; a missing one reads as NULL.

What goes where (one rank per process, see below):

* CUPTI_ACTIVITY_KIND_KERNEL → gpu_ops kind 'kernel'. Name = demangledName, else shortName, else
  mangledName (each through StringIds; whichever columns the version has). args: short name, grid,
  block, registers, shared memory, context, graph node.
* CUPTI_ACTIVITY_KIND_MEMCPY / MEMSET → 'memcpy' / 'memset'. copy_kind is decoded from the file's
  ENUM_CUDA_MEMCPY_OPER (``CUDA_MEMCPY_KIND_HTOD`` → ``HtoD``, as Kineto writes it), memory kinds from
  ENUM_CUDA_MEM_KIND (nsys numbering, not CUPTI's). Only when the file has no ENUM table (schema 2.9.1)
  is the CUPTI numbering used, with an ``enum_table_missing:*`` diagnostic.
* CUPTI_ACTIVITY_KIND_SYNCHRONIZATION → 'sync', named by ENUM_CUPTI_SYNC_TYPE's label.
* CUPTI_ACTIVITY_KIND_RUNTIME / DRIVER → host_ops cat 'cuda_runtime' / 'cuda_driver' with the
  correlation id; the ``_v7000``-style version suffix is dropped from the name (kept in args).
* NVTX_EVENTS push/pop and start/end ranges → host_ops cat 'user_annotation', name
  ``COALESCE(text, StringIds[textId])``, domain in args. Marks are step markers only (below).
* Communication kernels (ninefold.analysis.classify: NCCL, RCCL, DeepEP, ...) → collectives (source 'kernel'); the
  collective comes from the kernel name, else (NCCL's Generic kernel) from the NCCL-domain NVTX range
  enclosing its launch. nsys has no process-group
  name or sequence number, so pg_name/seq stay NULL (attribution then reports them unmatched).

Ranks. A process (the full ``globalPid``: the bits above the PID tell hosts apart in merged reports)
becomes a rank when it owns GPU work. Its rank, in order of preference: the ``rank`` argument (added to
the process index when the file holds several); an NVTX thread name / ThreadNames entry / NVTX text
of the form ``MPI Rank N`` / ``rank N``; the launch environment in META_DATA_CAPTURE (RANK,
OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, ...; used only when one process owns GPU work);
otherwise processes are enumerated in PID order. The choice is recorded as a ``rank_from_*``
diagnostic naming the process. PID/TID are decoded as ``(g >> 24) & 0xFFFFFF`` / ``g & 0xFFFFFF``.

Time. nsys times are ns since the session start; absolute ns = ``TARGET_INFO_SESSION_START_TIME.
utcEpochNs + t`` (traces.time_mode 'session_start', base_ns = utcEpochNs). Without that table the times
stay relative (time_mode 'relative_unknown', diagnostic 'no_session_start').

Steps, first rule that yields any, per rank:
  1. NVTX ranges named ``ProfilerStep#N`` (PyTorch);
  2. NVTX ranges whose name matches the step pattern (``step_pattern`` argument, else
     ``STEP_PATTERN``: "step 12", "train_step_3", "iteration#7", ...); the first capture group is
     the step number (no group: numbered in time order);
  3. NVTX marks matching rule 1 or 2: step N runs from its mark to the next mark (the last one to the
     end of the rank's activity);
  4. the repeated outermost NVTX range: on one thread, the depth-0 range name that occurs at least
     twice with every occurrence enclosing a CUDA call that launched GPU work; the most frequent such
     name wins and its occurrences are steps 0, 1, ... (diagnostic 'steps_from_repeated_range');
  5. none: the trace is one window (diagnostic 'no_steps').
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from ninefold.ingest.nsys_ranks import _assign_ranks, _env, _processes
from ninefold.ingest.nsys_read import (API_TABLES, REPORT_SUFFIXES, SQLITE_MAGIC, _check_file, _meta, _one_line, _read_all,
                              _session_start, _small_table, _Src, export_command)
from ninefold.ingest.nsys_rows import (_counts, _device_names, _file_diags, _insert_collectives, _insert_gpu, _insert_host,
                              _insert_steps, _no_corr, _rank_diags, _stage)
from ninefold.ingest.registry import Loader
from ninefold.store.connection import abort
from ninefold.store.errors import IngestConflict, NinefoldError, TraceFormatError
from ninefold.store.schema import PER_TRACE

__all__ = ["LOADER", "claims", "export_command", "load"]

# Arrow tables registered in DuckDB while one file loads
VIEWS = ("_nk", "_nm", "_ns", "_nsy", "_napi_cuda_runtime", "_napi_cuda_driver", "_nv", "_nstr")
TEMPS = ("_nrank", "_nenum", "_nnvtx", "_nnvtx0", "_nopen", "_nck", "_nmk", "_napiname", "_nclass", "_nkname",
         "_nstep")


def claims(path: Path, head: bytes) -> bool:
    name = Path(path).name.lower()
    return name.endswith((".sqlite", ".sqlite3") + REPORT_SUFFIXES) or head.startswith(SQLITE_MAGIC)


def load(con, path, job: str, rank: int | None = None, replace: bool = False, salvage: bool = False,
         step_pattern: str | None = None, launch_config: bool = False):
    """Ingest one nsys SQLite export; one LoadResult per rank (process with GPU work).

    salvage: accepted for the loader contract; a damaged SQLite file is always rejected whole.
    step_pattern: a regex for step NVTX names (first group = step number), tried after ProfilerStep#N.
    launch_config: also keep each kernel's grid/block/registers/shared memory in its args (reads 9 more
    columns per kernel: about twice the read time)."""
    from ninefold.ingest.load import LoadResult, sha256_of

    path = Path(path)
    _check_file(path)
    digest = sha256_of(path)
    same = con.execute("SELECT rank FROM traces WHERE job = ? AND sha256 = ? ORDER BY rank", [job, digest]).fetchall()
    if same:
        return [LoadResult(str(path), job, r, "unchanged", "already stored (same sha256)") for (r,) in same]
    if step_pattern is not None:
        try:
            n_groups = re.compile(step_pattern).groups
        except re.error as e:
            raise NinefoldError(f"bad step pattern {step_pattern!r}: {e}") from None
    src = _Src(path)
    try:
        if "StringIds" not in src.cols or not any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in src.cols):
            raise TraceFormatError(path, None, "not an Nsight Systems export: no StringIds and "
                                   "CUPTI_ACTIVITY_KIND_* tables (make one with `nsys export --type sqlite`)")
        diags: list = []
        meta = _meta(src)
        tables = _read_all(con, src, diags, launch_config)
        counts_in = {v: t.num_rows for v, t in tables.items()}
        procs = _processes(con)
        if not procs:
            raise TraceFormatError(path, None, "no GPU activity: the CUPTI kernel/memcpy/memset/sync tables are "
                                   "empty or missing (was the report captured with --trace=cuda?)")
        pnames = {}
        if src.has("PROCESSES", "globalPid") and src.has("PROCESSES", "name"):
            gl = ", ".join(str(g) for g, _ in procs)
            pnames = {g: n for g, n in src.rows(f"SELECT globalPid, name FROM PROCESSES WHERE globalPid IN ({gl})",
                                                "PROCESSES")}
        env = _env(src)
        ranks, how, world = _assign_ranks(con, src, procs, rank, env, pnames)
        for g, r in ranks.items():
            existing = con.execute("SELECT path FROM traces WHERE job = ? AND rank = ?", [job, r]).fetchall()
            if existing and not replace:
                raise IngestConflict(path, f"job {job!r} already has rank {r} from {existing[0][0]}; "
                                     "pass --replace to overwrite it")
        _small_table(con, "_nrank", "g BIGINT, rank INTEGER, pid BIGINT", [(g, ranks[g], p) for g, p in procs])
        base, time_mode = _session_start(src, path, diags)
        _stage(con, base)
        con.execute("BEGIN TRANSACTION")
        try:
            results = []
            for g, p in procs:
                r = ranks[g]
                for t in PER_TRACE:
                    con.execute(f"DELETE FROM {t} WHERE job = ? AND rank = ?", [job, r])
                con.execute("DELETE FROM traces WHERE job = ? AND rank = ?", [job, r])
            _insert_gpu(con, job, base)
            _insert_host(con, job, base, {cat: tables[f"_napi_{cat}"] for cat in API_TABLES})
            lit = "'" + job.replace("'", "''") + "'"
            con.execute(f"""CREATE OR REPLACE TEMP VIEW _ngpu AS SELECT rank, kind, name, device, start_ns, end_ns,
                            correlation FROM gpu_ops WHERE job = {lit} AND rank IN (SELECT rank FROM _nrank)""")
            con.execute(f"""CREATE OR REPLACE TEMP VIEW _nhost AS SELECT rank, tid, name, start_ns, end_ns, correlation
                            FROM host_ops WHERE job = {lit} AND rank IN (SELECT rank FROM _nrank)
                            AND cat IN ('cuda_runtime', 'cuda_driver')""")
            device_names = _device_names(con, src)
            step_src = _insert_steps(con, job, step_pattern, n_groups if step_pattern is not None else None)
            _insert_collectives(con, job)
            file_diags = list(diags) + _file_diags(con, counts_in, meta)
            if src.repaired:
                file_diags.append(("nsys", "repaired_strings", src.repaired, "text that was not valid UTF-8 (a lone "
                                   "surrogate, a cut character) was stored with U+FFFD in place of the bad bytes"))
            first = min(ranks.values())
            no_corr = _no_corr(con)
            for g, p in procs:
                r = ranks[g]
                counts = _counts(con, job, r)
                rd = [("nsys", how[g][0], 1, how[g][1])]
                rd += [("nsys", c, n, ex) for c, n, ex in step_src.get(r, [("no_steps", 1, "no ProfilerStep#N, step "
                                                                            "pattern or repeated NVTX range: the trace "
                                                                            "is one window")])]
                rd += _rank_diags(con, job, r, counts, no_corr)
                if r == first:
                    rd += file_diags
                con.executemany("INSERT INTO diagnostics VALUES (?, ?, ?, ?, ?, ?)",
                                [[job, r, s, c, n, str(ex)[:500]] for s, c, n, ex in rd])
                n_events = counts["kernel"] + counts["memcpy"] + counts["memset"] + counts["sync"] + counts["host_ops"]
                con.execute("""INSERT INTO traces (job, rank, path, sha256, format, schema_version, world_size,
                               device_name, base_ns, time_mode, backend, nccl_version, pg_config, n_events, salvaged)
                               VALUES (?, ?, ?, ?, 'nsys', ?, ?, ?, ?, ?, ?, NULL, NULL, ?, false)""",
                            [job, r, str(path.resolve()), digest, meta.get("EXPORT_SCHEMA_VERSION"), world,
                             device_names.get(g), base, time_mode, "nccl" if counts["collectives"] else None,
                             n_events])
                msg = f"process {p}" + (f" ({pnames[g]})" if pnames.get(g) else "")
                results.append(LoadResult(str(path), job, r, "stored", msg, counts))
            con.execute("INSERT INTO jobs (job, world_size) VALUES (?, ?) ON CONFLICT (job) DO UPDATE SET "
                        "world_size = coalesce(excluded.world_size, jobs.world_size)", [job, world])
            con.execute("COMMIT")
        except BaseException as e:
            abort(con, e, "this file's rows")
            raise
        return results
    except TraceFormatError:
        raise
    except (sqlite3.Error, OSError) as e:
        raise TraceFormatError(path, None, f"unreadable: {_one_line(e)}") from None
    finally:
        for v in VIEWS:
            try:
                con.unregister(v)
            except Exception:
                pass
        for t in TEMPS:
            con.execute(f"DROP TABLE IF EXISTS {t}")
        for v in ("_ngpu", "_nhost", "_napi"):
            con.execute(f"DROP VIEW IF EXISTS {v}")
        src.close()


LOADER = Loader(
    name="nsys",
    suffixes=(".sqlite", ".nsys-rep"),
    claims=claims,
    load=load,
    description="Nsight Systems SQLite export (nsys export --type sqlite)",
)
