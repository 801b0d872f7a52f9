"""What a stored trace can tell: its contents, and per ninefold capability whether it is available, degraded or
unavailable for this trace, with the one profiler setting that would fix it.

Works on any store (``ninefold inspect`` ingests files into a private in-memory store first, so the verdict is
the same before and after ingest). Capture advice: docs/capture.md.
"""
from __future__ import annotations

OK, DEGRADED, NO = "available", "degraded", "unavailable"
CAPTURE_DOC = "docs/capture.md"


def _tables(con) -> set:
    return {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def _one(con, sql, params):
    return con.execute(sql, params).fetchone()[0] or 0


def trace_facts(con, job: str, rank: int) -> dict:
    """Contents of one stored profiler trace (Kineto or nsys)."""
    t = con.execute("""SELECT format, schema_version, world_size, device_name, time_mode, backend, nccl_version,
                              host_name, n_events, path FROM traces WHERE job = ? AND rank = ?""",
                    [job, rank]).fetchone()
    keys = ["format", "schema_version", "world_size", "device", "clock", "backend", "nccl_version", "host_name",
            "events", "path"]
    f = dict(zip(keys, t))
    p = [job, rank]
    f["rank"] = rank
    f["gpu_ops"] = dict(con.execute("SELECT kind, count(*) FROM gpu_ops WHERE job = ? AND rank = ? GROUP BY kind "
                                    "ORDER BY kind", p).fetchall())
    f["steps"] = _one(con, "SELECT count(*) FROM steps WHERE job = ? AND rank = ?", p)
    f["collectives_recorded"] = _one(con, "SELECT count(*) FROM collectives WHERE job = ? AND rank = ? "
                                          "AND (seq IS NOT NULL OR pg_name IS NOT NULL)", p)
    f["collectives_from_host_ops"] = _one(con, "SELECT count(*) FROM collectives WHERE job = ? AND rank = ? "
                                               "AND seq IS NULL AND pg_name IS NULL", p)
    f["comm_by_collective"] = comm_kernels(con, job, rank)
    f["comm_kernels"] = sum(f["comm_by_collective"].values())
    f["all_to_all_with_splits"] = _one(con, """SELECT count(*) FROM host_ops WHERE job = ? AND rank = ?
        AND name = 'record_param_comms' AND args->>'In split size' IS NOT NULL""", p)
    f["flows"] = _one(con, "SELECT count(*) FROM flows WHERE job = ? AND rank = ?", p)
    f["launch_correlated"] = _one(con, """SELECT count(*) FROM gpu_ops WHERE job = ? AND rank = ?
        AND kind <> 'sync' AND correlation IS NOT NULL""", p)
    f["ops_with_shapes"] = _one(con, """SELECT count(*) FROM host_ops WHERE job = ? AND rank = ? AND cat = 'cpu_op'
        AND args->>'Input Dims' IS NOT NULL AND args->>'Input Dims' NOT IN ('[]', '')
        AND regexp_matches(args->>'Input Dims', '\\d')""", p)
    f["python_frames"] = _one(con, "SELECT count(*) FROM host_ops WHERE job = ? AND rank = ? "
                                   "AND cat = 'python_function'", p)
    f["memory_events"] = _one(con, "SELECT count(*) FROM memory_events WHERE job = ? AND rank = ?", p)
    f["distributed_info"] = not con.execute("SELECT 1 FROM diagnostics WHERE job = ? AND rank = ? AND code = "
                                            "'no_distributed_info'", p).fetchone()
    f["checkpoint_regions"] = _one(con, """SELECT count(*) FROM host_ops WHERE job = ? AND rank = ?
        AND (name LIKE '%CheckpointFunction%' OR name LIKE '%checkpoint.py(%')""", p)
    return f


def comm_kernels(con, job: str, rank: int) -> dict:
    """{collective: kernels} of the communication kernels of (JOB, RANK), as attribute reads them: a kernel is
    communication by ninefold.analysis.classify, and its collective is the one its collectives row names (recorded by
    record_param_comms, or typed by the host op that launched it: a SendRecv kernel under ``nccl:all_to_all``
    is an all-to-all), else the one its name names."""
    from ninefold.analysis.classify import classify_kernel
    from ninefold.analysis.process_groups import canonical

    names = con.execute("SELECT DISTINCT name FROM gpu_ops WHERE job = ? AND rank = ? AND kind = 'kernel' "
                        "AND name IS NOT NULL", [job, rank]).fetchall()
    comm = {n: classify_kernel(n)[1] for (n,) in names if classify_kernel(n)[0] == "comm"}
    if not comm:
        return {}
    out: dict = {}
    for name, colls, n in con.execute("""
            WITH k AS (SELECT name, start_ns FROM gpu_ops WHERE job = $1 AND rank = $2 AND kind = 'kernel'
                                                           AND list_contains($3, name)),
            c AS (SELECT kernel_name, start_ns, list(DISTINCT lower(coll)) AS colls FROM collectives
                  WHERE job = $1 AND rank = $2 AND source = 'kernel' AND coll IS NOT NULL GROUP BY ALL)
            SELECT k.name, c.colls, count(*) FROM k LEFT JOIN c ON c.kernel_name = k.name AND c.start_ns = k.start_ns
            GROUP BY ALL""", [job, rank, sorted(comm)]).fetchall():
        # a batched send/recv kernel can carry several rows: a collective other than send/recv names it
        typed = sorted({canonical(c) or c for c in colls or []}, key=lambda c: (c == "sendrecv", c))
        coll = typed[0] if typed else comm[name]
        out[coll] = out.get(coll, 0) + int(n)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _v(state, why, fix=None):
    return {"state": state, "why": why, "fix": fix}


def verdicts(f: dict, ranks_in_job: int) -> dict:
    """Per capability: {state, why, fix} for one trace's facts F in a job of RANKS_IN_JOB ranks."""
    k = f["gpu_ops"].get("kernel", 0)
    nsys = f["format"] == "nsys"
    out = {}
    if not k:
        out["ledgers"] = _v(NO, "no GPU kernels in the trace", "torch.profiler.profile(activities=[ProfilerActivity."
                                                               "CPU, ProfilerActivity.CUDA])")
    elif not f["steps"]:
        out["ledgers"] = _v(DEGRADED, "no ProfilerStep#N: the whole trace is one window",
                            "schedule=torch.profiler.schedule(wait=1, warmup=1, active=3) and prof.step() per step")
    elif f["launch_correlated"] < sum(v for kk, v in f["gpu_ops"].items() if kk != "sync"):
        out["ledgers"] = _v(DEGRADED, "some GPU ops have no launch correlation: host vs idle gaps are guessed",
                            "profile the CPU activity too (ProfilerActivity.CPU)")
    else:
        out["ledgers"] = _v(OK, f"{k} kernels in {f['steps']} steps")
    comm = f["comm_kernels"]
    world = f["world_size"] or 0
    if not comm:
        out["straggler_bubble"] = _v(NO, "no communication kernels", None)
    elif ranks_in_job < 2:
        out["straggler_bubble"] = _v(DEGRADED, "one rank in this job: its communication is exposed_comm, but the "
                                     "waits at collectives need the other ranks' traces",
                                     "ingest every rank's file into one job (one file per rank)")
    elif world > ranks_in_job:
        out["straggler_bubble"] = _v(DEGRADED, f"{ranks_in_job} of {world} ranks in this job: waits are computed "
                                     "among these ranks only", f"ingest all {world} rank files into one job")
    elif f["collectives_recorded"]:
        out["straggler_bubble"] = _v(OK, f"{f['collectives_recorded']} collectives with process group and sequence")
    else:
        out["straggler_bubble"] = _v(DEGRADED, "collectives matched by their order per type (no process group or "
                                               "sequence recorded)",
                                     "PyTorch >= 2.2 with NCCL records record_param_comms with them; for nsys, "
                                     "also ingest NCCL_DEBUG=INFO logs" if nsys else
                                     "PyTorch >= 2.2 records record_param_comms with process group and sequence")
    if f["all_to_all_with_splits"]:
        out["moe_drilldown"] = _v(OK, f"{f['all_to_all_with_splits']} all-to-alls with split sizes")
    elif f["collectives_recorded"] or f["collectives_from_host_ops"]:
        out["moe_drilldown"] = _v(DEGRADED if comm else NO, "no all-to-all with recorded split sizes: per-expert "
                                  "token loads are unknown", "record_shapes=True, PyTorch >= 2.2")
    else:
        out["moe_drilldown"] = _v(NO, "no all-to-all collectives", None)
    if f["ops_with_shapes"]:
        out["efficiency_calibration"] = _v(OK, f"{f['ops_with_shapes']} cpu ops with input shapes")
    else:
        out["efficiency_calibration"] = _v(NO, "no input shapes: FLOPs per kernel unknown",
                                           "torch.profiler.profile(record_shapes=True)")
    if f["memory_events"]:
        out["memory_ledger"] = _v(OK, f"{f['memory_events']} allocator events")
    else:
        out["memory_ledger"] = _v(NO, "no allocator events: only the predicted memory ledger",
                                  "torch.profiler.profile(profile_memory=True)")
    if f["python_frames"]:
        out["recompute"] = _v(OK, "python frames recorded: both checkpoint forms are seen")
    elif f["checkpoint_regions"]:
        out["recompute"] = _v(DEGRADED, "reentrant checkpoints are seen; non-reentrant ones need python frames",
                              "torch.profiler.profile(with_stack=True)")
    else:
        out["recompute"] = _v(DEGRADED, "no python frames: a non-reentrant checkpoint's recompute is not seen",
                              "torch.profiler.profile(with_stack=True)")
    if ranks_in_job < 2:
        out["clock_alignment"] = _v(OK, "one rank: nothing to align")
    elif f["clock"] == "relative_unknown":
        out["clock_alignment"] = _v(DEGRADED, "relative timestamps with no base time: aligned by collectives only",
                                    "a PyTorch that writes baseTimeNanoseconds (>= 2.3)")
    elif not f["distributed_info"]:
        out["clock_alignment"] = _v(DEGRADED, "no distributedInfo: rank taken from the file name",
                                    "torch.distributed initialised before the profiler starts")
    else:
        out["clock_alignment"] = _v(OK, f"clock {f['clock']}" + (f", host {f['host_name']}" if f["host_name"] else ""))
    return out


def inspect_store(con, job: str | None = None) -> list[dict]:
    """One entry per stored trace (profiler traces per rank; NCCL logs, nccl-tests tables, Flight Recorder dumps
    per file) of JOB or every job."""
    have = _tables(con)
    jf = "" if job is None else " WHERE job = ?"
    p = [] if job is None else [job]
    out = []
    if "traces" in have:
        rows = con.execute(f"SELECT job, rank FROM traces{jf} ORDER BY job, rank", p).fetchall()
        n_ranks = dict(con.execute(f"SELECT job, count(*) FROM traces{jf} GROUP BY job", p).fetchall())
        for j, r in rows:
            f = trace_facts(con, j, r)
            out.append({"kind": f["format"], "job": j, "rank": r, "path": f.pop("path"), "facts": f,
                        "capabilities": verdicts(f, n_ranks[j])})
    if "nccl_log_files" in have:
        for j, path, ver, n_colls, n_warn, hosts in con.execute(
                f"SELECT job, path, nccl_version, n_colls, n_warn, hosts FROM nccl_log_files{jf} ORDER BY path",
                p).fetchall():
            comms = _one(con, "SELECT count(DISTINCT comm_id) FROM nccl_comms WHERE job = ? AND file = ?", [j, path])
            caps = {"nccl_drilldown": _v(OK, f"{n_colls} COLL lines") if n_colls else
                    _v(NO, "no COLL lines: algorithm/protocol per collective unknown", "NCCL_DEBUG=INFO "
                       "NCCL_DEBUG_SUBSYS=INIT,COLL,TUNING"),
                    "topology": _v(OK if comms else NO, f"{comms} communicators" if comms else "no INIT lines",
                                   None if comms else "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT")}
            out.append({"kind": "nccl_log", "job": j, "rank": None, "path": path,
                        "facts": {"nccl_version": ver, "colls": n_colls, "warnings": n_warn, "hosts": hosts,
                                  "communicators": comms}, "capabilities": caps})
    if "fr_dumps" in have:
        for j, r, path, fmt, ver, n in con.execute(
                f"SELECT job, rank, path, format, version, n_entries FROM fr_dumps{jf} ORDER BY job, rank",
                p).fetchall():
            caps = {"hang_report": _v(OK, f"{n} entries") if n else _v(
                DEGRADED, "no entries in the ring buffer", "TORCH_NCCL_TRACE_BUFFER_SIZE=2000")}
            out.append({"kind": "flight_recorder", "job": j, "rank": r, "path": path,
                        "facts": {"format": fmt, "version": ver, "entries": n}, "capabilities": caps})
    if "nccl_tests_runs" in have and "nccl_tests_results" in have:
        for j, path, n in con.execute(f"SELECT job, path, count(*) FROM nccl_tests_results{jf} GROUP BY ALL "
                                      "ORDER BY path", p).fetchall():
            out.append({"kind": "nccl_tests", "job": j, "rank": None, "path": path, "facts": {"results": n},
                        "capabilities": {"collective_calibration": _v(OK, f"{n} result rows")}})
    return out


def _comm_text(f: dict) -> str:
    by = f.get("comm_by_collective") or {}
    return f"{f['comm_kernels']} comm kernels" + (": " + ", ".join(f"{k} {v}" for k, v in by.items()) if by else "")


def format_text(entries: list[dict]) -> str:
    lines = []
    for e in entries:
        who = f"job {e['job']}" + (f" rank {e['rank']}" if e["rank"] is not None else "")
        lines.append(f"{e['path']}  [{e['kind']}, {who}]")
        f = e["facts"]
        if e["kind"] in ("kineto", "nsys"):
            ops = ", ".join(f"{v} {k}" for k, v in f["gpu_ops"].items()) or "no GPU ops"
            lines.append(f"  contains: {ops}; {f['steps']} steps; collectives {f['collectives_recorded']} recorded + "
                         f"{f['collectives_from_host_ops']} from host ops ({_comm_text(f)}); "
                         f"{f['flows']} flows; {f['ops_with_shapes']} ops with shapes; {f['python_frames']} python "
                         f"frames; {f['memory_events']} memory events")
            lines.append(f"  device {f['device'] or '?'}; schema {f['schema_version'] or '?'}; world size "
                         f"{f['world_size'] or '?'}; distributedInfo {'yes' if f['distributed_info'] else 'no'}; "
                         f"clock {f['clock']}")
        else:
            lines.append("  contains: " + ", ".join(f"{k} {v}" for k, v in f.items()))
        for cap, v in e["capabilities"].items():
            fix = f"  -> {v['fix']}" if v["fix"] and v["state"] != OK else ""
            lines.append(f"  {cap:<24s} {v['state']:<12s} {v['why']}{fix}")
    if any(v["state"] != OK for e in entries for v in e["capabilities"].values()):
        lines.append(f"how to capture traces that ninefold reads best: {CAPTURE_DOC}")
    return "\n".join(lines)


def verdict_line(con, job: str, rank: int) -> str:
    """One line for the upload page: each capability's state, with the fix where it is not available."""
    n = con.execute("SELECT count(*) FROM traces WHERE job = ?", [job]).fetchone()[0]
    caps = verdicts(trace_facts(con, job, rank), n)
    mark = {OK: "yes", DEGRADED: "partly", NO: "no"}
    parts = [f"{k} {mark[v['state']]}" + (f" ({v['fix']})" if v["fix"] and v["state"] != OK else "")
             for k, v in caps.items()]
    return "; ".join(parts)
