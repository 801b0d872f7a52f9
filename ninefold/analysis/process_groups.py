"""Collective names in one spelling, and the job's process groups with the parallel axis each was read as:
what the attribution core stores as drill-down keys, and what the cost model infers a layout from."""
from __future__ import annotations

import json
import re


def canonical(coll: str | None) -> str | None:
    """Trace / nccl-tests spellings -> allreduce | allgather | reducescatter | alltoall | broadcast | reduce |
    sendrecv (None for barriers, waits and unknown names)."""
    if not coll:
        return None
    c = re.sub(r"[^a-z]", "", coll.lower().replace("nccl:", ""))
    for pre in ("base", "coalesced", "intotensor", "tensor"):
        c = c.replace(pre, "")
    if c in ("send", "recv", "sendrecv", "batchisendirecv", "isend", "irecv"):
        return "sendrecv"
    if c.startswith("alltoall"):
        return "alltoall"
    for k in ("allreduce", "allgather", "reducescatter", "broadcast", "reduce"):
        if c == k:
            return k
    return None


AXIS_WORDS = (("tp", r"(^|[^a-z])(tp|tensor)"), ("pp", r"(^|[^a-z])(pp|pipe)"), ("ep", r"(^|[^a-z])(ep|expert|moe)"),
              ("cp", r"(^|[^a-z])(cp|context)"), ("dp", r"(^|[^a-z])(dp|data|fsdp|ddp)"))


def classify_axis(desc: str | None, colls: set, size: int, world: int) -> str:
    """Axis of a process group: its description when it names one, else what runs on it (send/recv only:
    pp; all-to-all: ep; otherwise dp)."""
    d = (desc or "").lower()
    for axis, rx in AXIS_WORDS:
        if re.search(rx, d):
            return axis
    kinds = {canonical(c) for c in colls} - {None}
    if kinds and kinds <= {"sendrecv"}:
        return "pp"
    if "alltoall" in kinds:
        return "ep"
    return "dp"


def process_groups(con, job: str, pg_configs: list | None = None, world: int = 0) -> dict:
    """The job's process groups that ran a collective: {pg_name: {desc, size, ranks, colls, axis}}, from the
    traces' pg_config (JSON texts, PG_CONFIGS; read from the traces when None) and the collectives rows."""
    if pg_configs is None:
        pg_configs = [r[0] for r in con.execute("SELECT pg_config FROM traces WHERE job = ?", [job]).fetchall()]
    pgs: dict = {}
    for raw in pg_configs:
        try:
            cfgs = json.loads(raw) if raw else []
        except ValueError:
            cfgs = []
        for g in cfgs or []:
            if isinstance(g, dict) and g.get("pg_name") is not None:
                pgs.setdefault(str(g["pg_name"]), {"desc": g.get("pg_desc"), "size": g.get("pg_size"),
                                                   "ranks": g.get("ranks"), "colls": set()})
    for pg, desc, pranks, gsz, coll in con.execute("""
            SELECT DISTINCT pg_name, pg_desc, pg_ranks, group_size, lower(coll) FROM collectives
            WHERE job = ? AND pg_name IS NOT NULL""", [job]).fetchall():
        e = pgs.setdefault(str(pg), {"desc": desc, "size": gsz, "ranks": pranks, "colls": set()})
        e["colls"].add(coll)
        e["size"] = e["size"] or gsz
        e["desc"] = e["desc"] or desc
    used = {k: v for k, v in pgs.items() if v["colls"]}
    for g in used.values():
        g["axis"] = classify_axis(g["desc"], g["colls"], g["size"] or 0, world)
    return used
