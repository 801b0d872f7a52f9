"""Which rank each process of an Nsight Systems export is: the --rank given, an NVTX rank name, the launch
environment, else PID order (the rules are in ninefold.ingest.nsys's doc)."""
from __future__ import annotations

from ninefold.ingest.nsys_read import _Src

PID_SPAN = 1 << 24            # globalPid/globalTid: ... | PID << 24 | TID
RANK_TEXT = r"(?i)^(?:mpi |global |torch )?rank[ _:=#-]*(\d+)$"
ENV_RANK_KEYS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
                 "SLURM_PROCID", "PALS_RANKID")
ENV_WORLD_KEYS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")


def _gpid(col: str) -> str:
    return f"(({col}) // {PID_SPAN}) * {PID_SPAN}"


def _pid(col: str) -> str:
    return f"(({col}) // {PID_SPAN}) % {PID_SPAN}"


def _processes(con) -> list[tuple[int, int]]:
    """(globalPid, pid) of every process that owns GPU work, in PID order."""
    parts = " UNION ".join(f"SELECT DISTINCT {_gpid('coalesce(globalPid, 0)')} AS g FROM {v}"
                           for v in ("_nk", "_nm", "_ns", "_nsy"))
    return [(g, p) for g, p in con.execute(f"SELECT g, {_pid('g')} AS p FROM ({parts}) ORDER BY p, g").fetchall()]


def _nvtx_ranks(con, src: _Src) -> dict[int, set]:
    """Rank numbers that NVTX thread names, ThreadNames or NVTX texts state, per globalPid."""
    found: dict[int, set] = {}
    rx = RANK_TEXT.replace("'", "''")
    q = f"""SELECT DISTINCT {_gpid('n.globalTid')} AS g,
                   TRY_CAST(regexp_extract(coalesce(nullif(n.text, ''), s.value), '{rx}', 1) AS BIGINT) AS r
            FROM _nv n LEFT JOIN _nstr s ON s.id = n.textId
            WHERE n.globalTid IS NOT NULL AND regexp_matches(coalesce(nullif(n.text, ''), s.value, ''), '{rx}')"""
    for g, r in con.execute(q).fetchall():
        found.setdefault(g, set()).add(r)
    if src.has("ThreadNames", "nameId") and src.has("ThreadNames", "globalTid"):
        tn = src.arrow("SELECT CAST(nameId AS INTEGER) AS nameId, CAST(globalTid AS INTEGER) AS globalTid "
                       "FROM ThreadNames", "ThreadNames")
        con.register("_ntn", tn)
        try:
            for g, r in con.execute(f"""SELECT DISTINCT {_gpid('t.globalTid')},
                        TRY_CAST(regexp_extract(s.value, '{rx}', 1) AS BIGINT)
                        FROM _ntn t JOIN _nstr s ON s.id = t.nameId
                        WHERE t.globalTid IS NOT NULL AND regexp_matches(s.value, '{rx}')""").fetchall():
                found.setdefault(g, set()).add(r)
        finally:
            con.unregister("_ntn")
    return found


def _env(src: _Src) -> dict[str, str]:
    """The launch environment nsys recorded (META_DATA_CAPTURE PROCESS_n:ENVIRONMENT_VARIABLE)."""
    if not (src.has("META_DATA_CAPTURE", "name") and src.has("META_DATA_CAPTURE", "value")):
        return {}
    env = {}
    for (v,) in src.rows("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'",
                         "META_DATA_CAPTURE"):
        k, sep, val = str(v).partition("=")
        if sep and (k in ENV_RANK_KEYS or k in ENV_WORLD_KEYS):
            env.setdefault(k, val.strip().strip('"'))
    return env


def _assign_ranks(con, src: _Src, procs, rank, env, pnames) -> tuple[dict[int, int], dict[int, tuple], int | None]:
    """globalPid → rank, and per globalPid the (code, detail) of how it was chosen; plus world size."""
    def desc(g, p):
        nm = pnames.get(g)
        return f"globalPid {g} (pid {p}{', ' + nm if nm else ''})"

    world = None
    for k in ENV_WORLD_KEYS:
        if env.get(k, "").isdigit():
            world = int(env[k])
            break
    if rank is not None:
        ranks = {g: rank + i for i, (g, p) in enumerate(procs)}
        how = {g: ("rank_given", f"{desc(g, p)} -> rank {ranks[g]} (--rank {rank}"
                   + (f" + process index, {len(procs)} processes)" if len(procs) > 1 else ")")) for g, p in procs}
        return ranks, how, world
    nv = _nvtx_ranks(con, src)
    stated = {g: next(iter(nv[g])) for g, p in procs if len(nv.get(g, ())) == 1}
    if len(stated) == len(procs) and len(set(stated.values())) == len(procs):
        return stated, {g: ("rank_from_nvtx", f"{desc(g, p)} -> rank {stated[g]} (NVTX rank name)")
                        for g, p in procs}, world
    if len(procs) == 1:
        for k in ENV_RANK_KEYS:
            if env.get(k, "").isdigit():
                g, p = procs[0]
                return {g: int(env[k])}, {g: ("rank_from_env", f"{desc(g, p)} -> rank {env[k]} ({k})")}, world
    ranks = {g: i for i, (g, p) in enumerate(procs)}
    return ranks, {g: ("rank_enumerated", f"{desc(g, p)} -> rank {ranks[g]} (no rank in NVTX or environment; "
                       f"{len(procs)} GPU process(es) numbered in PID order)") for g, p in procs}, world
