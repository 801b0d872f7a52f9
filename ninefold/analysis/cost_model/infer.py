"""What a stored trace tells about the configuration: world size, process groups and their axes, message
sizes, micro-batch count, expert load, device, step time."""
from __future__ import annotations

import json
from statistics import median

from ninefold.store.errors import NinefoldError

from ninefold.analysis.process_groups import AXIS_WORDS, canonical, classify_axis, process_groups  # noqa: F401  (re-exported)

from .hardware import preset_for_device
from ninefold.store.connection import has_table

def infer(con, job: str) -> dict:
    """Facts with their evidence; raises NinefoldError when the job is not in the database."""
    tr = con.execute("SELECT rank, world_size, device_name, pg_config FROM traces WHERE job = ? ORDER BY rank",
                     [job]).fetchall()
    if not tr:
        raise NinefoldError(f"job {job!r}: no traces stored under that name")
    ranks = [r[0] for r in tr]
    world = max([r[1] for r in tr if r[1]] or [len(ranks)])
    facts: dict = {"world_size": world, "ranks_present": len(ranks)}
    dev = next((r[2] for r in tr if r[2]), None)
    if preset_for_device(dev):
        facts["preset"] = (preset_for_device(dev), dev)
    n_steps = con.execute("SELECT count(DISTINCT step) FROM steps WHERE job = ?", [job]).fetchone()[0] or 1
    facts["steps"] = n_steps
    used = process_groups(con, job, [r[3] for r in tr], world)
    facts["groups"] = {k: {"axis": v["axis"], "size": v["size"], "desc": v["desc"],
                           "colls": sorted(c for c in v["colls"] if c)} for k, v in used.items()}
    by_axis: dict = {}
    for name, g in used.items():
        by_axis.setdefault(g["axis"], []).append(name)
    for axis in ("dp", "tp", "ep", "cp"):
        if axis in by_axis:
            facts[axis] = max(int(used[n]["size"] or 1) for n in by_axis[axis])
    if "pp" in by_axis:
        # stages = the longest chain of pair groups; micro-batches = sends per rank, group and step
        pairs = []
        for n in by_axis["pp"]:
            rr = used[n]["ranks"]
            try:
                rr = json.loads(rr) if isinstance(rr, str) else rr
            except ValueError:
                rr = None
            if isinstance(rr, list) and len(rr) == 2:
                pairs.append(tuple(rr))
        nodes = {x for p in pairs for x in p}
        facts["pp"] = len(nodes) // max(1, len(nodes) - len(pairs)) if pairs else 2
        sends = con.execute(f"""SELECT count(*) FROM collectives WHERE job = ? AND lower(coll) = 'send'
                AND pg_name IN ({", ".join("?" for _ in by_axis["pp"])}) GROUP BY rank, pg_name""",
                            [job, *by_axis["pp"]]).fetchall()
        if sends:
            facts["micro_batches"] = int(round(median(s[0] for s in sends) / n_steps))
        b = con.execute(f"""SELECT median(bytes) FROM collectives WHERE job = ? AND lower(coll) IN ('send', 'recv')
                AND pg_name IN ({", ".join("?" for _ in by_axis["pp"])})""", [job, *by_axis["pp"]]).fetchone()[0]
        if b:
            facts["p2p_bytes"] = float(b)
    if "dp" in by_axis:
        b = con.execute(f"""SELECT sum(bytes) FROM collectives WHERE job = ? AND source = 'kernel'
                AND lower(coll) IN ('allreduce', 'all_reduce', 'reduce_scatter', 'reduce_scatter_tensor',
                                    '_reduce_scatter_base')
                AND pg_name IN ({", ".join("?" for _ in by_axis["dp"])})""", [job, *by_axis["dp"]]).fetchone()[0]
        if b:
            facts["dp_grad_bytes"] = float(b) / len(ranks) / n_steps
    if "ep" in by_axis:
        facts.update(_a2a_facts(con, job, by_axis["ep"], n_steps))
    st = con.execute("SELECT avg(end_ns - start_ns), count(*) FROM step_windows WHERE job = ?", [job]).fetchone() \
        if has_table(con, "step_windows") else (None, 0)
    if st and st[0]:
        facts["step_ns"] = (float(st[0]), "step_windows")
    else:
        s2 = con.execute("SELECT avg(end_ns - start_ns) FROM steps WHERE job = ?", [job]).fetchone()[0]
        if s2:
            facts["step_ns"] = (float(s2), "ProfilerStep annotations")
    return facts


def _a2a_facts(con, job, pgs, n_steps) -> dict:
    out = {}
    ph = ", ".join("?" for _ in pgs)
    b = con.execute(f"""SELECT median(bytes) FROM collectives WHERE job = ? AND lower(coll) LIKE 'all_to_all%'
            AND pg_name IN ({ph})""", [job, *pgs]).fetchone()[0]
    if b:
        out["a2a_bytes"] = float(b)
    # measured split sizes (record_param_comms "Out split size", tokens received from each member). The
    # all-to-alls of an EP group come in pairs, the first of each pair carrying tokens to the experts (forward
    # dispatch; in the backward the combine's gradient, same counts) and the second back (GShard, Lepikhin et
    # al. 2021 §2.2): a rank's expert load is what it receives in the first of each pair, by Seq order.
    rows = con.execute(f"""
        WITH a AS (
            SELECT rank, json_extract_string(args, '$."Process Group Name"') AS pg,
                   TRY_CAST(json_extract(args, '$."Seq"') AS BIGINT) AS seq,
                   list_sum(TRY_CAST(json_extract_string(args, '$."Out split size"') AS DOUBLE[])) AS recv
            FROM host_ops WHERE job = ? AND name = 'record_param_comms'
              AND json_extract_string(args, '$."Process Group Name"') IN ({ph})
              AND lower(json_extract_string(args, '$."Collective name"')) LIKE 'all_to_all%'
        ), b AS (
            SELECT rank, recv, row_number() OVER (PARTITION BY rank, pg ORDER BY seq) - 1 AS pos FROM a
            WHERE seq IS NOT NULL
        )
        SELECT rank, sum(recv) FROM b WHERE pos % 2 = 0 GROUP BY rank HAVING count(recv) = count(*)
        ORDER BY rank""", [job, *pgs]).fetchall()
    recv = {r: float(x) for r, x in rows if x}
    if len(recv) >= 2:
        order = sorted(recv)
        out["ep_loads"] = [recv[r] for r in order]
        out["ep_load_ranks"] = order
    return out
