"""Store a prediction (predicted_ledgers, predicted_parts, predicted_memory, predicted_terms) and set it beside
the measured ledgers."""
from __future__ import annotations

from ninefold.analysis.ledgers import LEDGERS
from ninefold.store.schema import TABLES

from .memory import MEMORY_ITEMS

TABLE_NAMES = ("predicted_ledgers", "predicted_parts", "predicted_memory", "predicted_terms")


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
    prediction is per step and the same for every step) in predicted_ledgers: what the trace can contain, the
    part compared. predicted_parts holds the same rows with in_trace true and what calibrated them, and for a
    ledger that also holds a component the trace cannot contain, a row with that part, in_trace false and
    the reason: a ledger's parts sum to the whole prediction. predicted_terms: each ledger's terms with their
    values and sources (explain.terms), so a residual shown anywhere leads to its inputs. Returns the
    predicted_ledgers row count."""
    from .explain import terms
    ensure_tables(con)
    steps = {}
    if measured(con, job):
        for rank, step in con.execute("SELECT DISTINCT rank, step FROM ledger_totals WHERE job = ?", [job]).fetchall():
            steps.setdefault(rank, []).append(step)
    why = "; ".join(f"{e.what}: {e.reason}" for e in pred.excluded) or None
    rows, parts = [], []
    for r, d in pred.ledgers.items():
        cmp = pred.compared[r]
        for st in sorted(steps.get(r, [-1])):
            for led, ns in d.items():
                src = pred.sources.get(led)
                rows.append((job, r, st, led, int(cmp[led]), pred.cfg.sha))
                parts.append((job, r, st, led, int(cmp[led]), pred.cfg.sha, True, None, src))
                if ns != cmp[led]:
                    parts.append((job, r, st, led, int(ns - cmp[led]), pred.cfg.sha, False, why, src))
    mem = [(job, r, item, float(d[item])) for r, d in pred.memory.items() for item in MEMORY_ITEMS]
    seq: dict = {}
    tms = []
    for t in terms(pred):
        seq[t.ledger] = seq.get(t.ledger, -1) + 1
        tms.append((job, pred.cfg.sha, t.ledger, seq[t.ledger], t.term, t.value, t.unit, t.source))
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM predicted_ledgers WHERE job = ?", [job])
        con.execute("DELETE FROM predicted_parts WHERE job = ?", [job])
        con.execute("DELETE FROM predicted_memory WHERE job = ?", [job])
        con.execute("DELETE FROM predicted_terms WHERE job = ?", [job])
        con.executemany("INSERT INTO predicted_ledgers VALUES (?, ?, ?, ?, ?, ?)", rows)
        con.executemany("INSERT INTO predicted_parts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", parts)
        con.executemany("INSERT INTO predicted_memory VALUES (?, ?, ?, ?)", mem)
        if tms:
            con.executemany("INSERT INTO predicted_terms VALUES (?, ?, ?, ?, ?, ?, ?, ?)", tms)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return len(rows)


def residuals(meas: dict, pred) -> dict:
    """Per ledger: measured, predicted (what the trace can contain; means over the ranks both have), residual =
    measured − predicted, and not_in_trace: the predicted part left out of the comparison."""
    ranks = sorted(set(meas) & set(pred.ledgers))
    comp = pred.compared
    out = {}
    for led in LEDGERS:
        m = sum(meas[r][led] for r in ranks) / len(ranks) if ranks else 0.0
        p = sum(comp[r][led] for r in ranks) / len(ranks) if ranks else 0.0
        full = sum(pred.ledgers[r][led] for r in ranks) / len(ranks) if ranks else 0.0
        out[led] = {"measured": m, "predicted": p, "residual": m - p, "not_in_trace": full - p}
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
               or abs(pred.compared[r][k] - res[k]["predicted"]) > rel * step for k in LEDGERS):
            out.append(r)
    return out
