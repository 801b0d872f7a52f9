"""Store a prediction (predicted_ledgers, predicted_memory) and set it beside the measured ledgers."""
from __future__ import annotations

from analysis.ledgers import LEDGERS
from store.schema import TABLES

from .memory import MEMORY_ITEMS

TABLE_NAMES = ("predicted_ledgers", "predicted_memory")


def ensure_tables(con) -> None:
    for t in TABLE_NAMES:
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({TABLES[t]})")


def measured(con, job: str) -> dict:
    """rank -> {ledger: mean ns per step} from ledger_totals; {} when the job is not attributed."""
    have = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'ledger_totals'"
                       ).fetchone()[0]
    if not have:
        return {}
    out: dict = {}
    for rank, led, ns in con.execute("""SELECT rank, ledger, avg(ns) FROM ledger_totals WHERE job = ?
                                        GROUP BY rank, ledger""", [job]).fetchall():
        out.setdefault(rank, {k: 0.0 for k in LEDGERS})[led] = float(ns)
    return out


def store(con, job: str, pred) -> int:
    """Replace the job's predicted rows, in one transaction. One row per rank, measured step and ledger (the
    prediction is per step and the same for every step)."""
    ensure_tables(con)
    steps = {}
    if measured(con, job):
        for rank, step in con.execute("SELECT DISTINCT rank, step FROM ledger_totals WHERE job = ?", [job]).fetchall():
            steps.setdefault(rank, []).append(step)
    rows = [(job, r, st, led, int(ns), pred.cfg.sha) for r, d in pred.ledgers.items()
            for st in sorted(steps.get(r, [-1])) for led, ns in d.items()]
    mem = [(job, r, item, float(d[item])) for r, d in pred.memory.items() for item in MEMORY_ITEMS]
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM predicted_ledgers WHERE job = ?", [job])
        con.execute("DELETE FROM predicted_memory WHERE job = ?", [job])
        con.executemany("INSERT INTO predicted_ledgers VALUES (?, ?, ?, ?, ?, ?)", rows)
        con.executemany("INSERT INTO predicted_memory VALUES (?, ?, ?, ?)", mem)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return len(rows)


def residuals(meas: dict, pred) -> dict:
    """Per ledger: measured, predicted (means over the ranks both have), residual = measured − predicted."""
    ranks = sorted(set(meas) & set(pred.ledgers))
    out = {}
    for led in LEDGERS:
        m = sum(meas[r][led] for r in ranks) / len(ranks) if ranks else 0.0
        p = sum(pred.ledgers[r][led] for r in ranks) / len(ranks) if ranks else 0.0
        out[led] = {"measured": m, "predicted": p, "residual": m - p}
    return out


def differing_ranks(meas: dict, pred, rel: float = 0.02) -> list[int]:
    """Ranks whose measured or predicted ledgers differ from the rank mean by more than ``rel`` of the step."""
    ranks = sorted(set(meas) & set(pred.ledgers))
    if len(ranks) < 2:
        return []
    res = residuals(meas, pred)
    step = sum(v["measured"] for v in res.values()) or 1.0
    out = []
    for r in ranks:
        if any(abs(meas[r][k] - res[k]["measured"]) > rel * step
               or abs(pred.ledgers[r][k] - res[k]["predicted"]) > rel * step for k in LEDGERS):
            out.append(r)
    return out
