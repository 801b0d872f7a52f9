"""Tonight against the previous night of each job: the diff's bootstrap (ninefold.analysis.diff) over the nights' steps.

The catalog holds only each job's latest rows, so the batch keeps what the diff needs of every night it loads:
``batch_step_samples`` holds one row per (night, job, level, key, step) with the time of that step over all
ranks (``ninefold.analysis.diff.step_samples``), written in the transaction that loads the job's rows. A job processed
tonight is compared with its previous successful night by ``ninefold.analysis.diff.diff_samples``, its confidence held
for the whole table.

A job *regressed* when a row at the ledger level (the step, or one ledger) is significantly longer tonight: its
interval excludes zero and the change is at least the diff's floor of the step. Step-to-step noise alone does
not pass. The job's *contributors* are its significant rows at the ledger, kernel-class and collective levels
(not the step, which is their sum; a compute, recompute or exposed-communication ledger only when none of its
kernel classes or collective types is significant itself), by the size of the change: the top three are named
in summary.json and the index, the kernel rows beside them in the index.
"""
from __future__ import annotations

import html

from ninefold.analysis.diff import LEVELS, DiffError, diff_samples, order_rows, step_samples

SAMPLES_DDL = {
    "batch_step_samples": """night VARCHAR NOT NULL, job VARCHAR NOT NULL, level VARCHAR NOT NULL,
                             key VARCHAR NOT NULL, step BIGINT NOT NULL, ns BIGINT NOT NULL,
                             PRIMARY KEY (night, job, level, key, step)""",
}
KEEP_NIGHTS = 2          # sample nights kept per job: its latest successful one and the one before
TOP = 3                  # contributors named per job
INDEX_ROWS = 8           # significant rows shown per job in the index
_BROKEN_DOWN = {"compute": "kclass", "recompute": "kclass", "exposed_comm": "coll"}


def ensure_sample_tables(con) -> None:
    for t, cols in SAMPLES_DDL.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {t} ({cols})")


def store_step_samples(con, night: str, jobs: list[str]) -> int:
    """Replace NIGHT's step samples of JOBS by those of their rows now in the catalog (inside the caller's
    transaction). Returns the rows written."""
    con.execute("DELETE FROM batch_step_samples WHERE night = ? AND job IN ?", [night, list(jobs)])
    n = 0
    for job in jobs:
        try:
            _, samples = step_samples(con, job)
        except DiffError:
            continue    # no attributed steps: nothing to compare, tonight or later
        levels, keys, steps, ns = [], [], [], []
        for (level, key), per in samples.items():
            for s, v in per.items():
                levels.append(level)
                keys.append(key)
                steps.append(int(s))
                ns.append(int(v))
        if steps:
            con.execute("INSERT INTO batch_step_samples SELECT ?, ?, unnest(?), unnest(?), unnest(?), unnest(?)",
                        [night, job, levels, keys, steps, ns])
        n += len(steps)
    return n


def drop_step_samples(con, night: str, job: str) -> None:
    con.execute("DELETE FROM batch_step_samples WHERE night = ? AND job = ?", [night, job])


def _load(con, night: str, job: str) -> tuple[list, dict] | None:
    rows = con.execute("SELECT level, key, step, ns FROM batch_step_samples WHERE night = ? AND job = ?",
                       [night, job]).fetchall()
    samples: dict = {}
    for level, key, s, v in rows:
        samples.setdefault((level, key), {})[s] = v
    steps = sorted(samples.get(("ledger", "step"), {}))
    return (steps, samples) if steps else None


def _previous_nights(con, night: str, jobs: list[str]) -> dict[str, str]:
    if not jobs:
        return {}
    return dict(con.execute("""
        SELECT r.job, arg_max(r.night, n.seq) FROM batch_runs r JOIN batch_nights n USING (night)
        WHERE r.job IN ? AND r.status = 'ok'
          AND n.seq < (SELECT seq FROM batch_nights WHERE night = ?)
          AND EXISTS (SELECT 1 FROM batch_step_samples s WHERE s.night = r.night AND s.job = r.job)
        GROUP BY r.job""", [list(jobs), night]).fetchall())


def _row(r: dict) -> dict:
    return {k: r[k] for k in ("level", "key", "a_ns", "b_ns", "delta_ns", "delta_share", "ci_low_ns",
                              "ci_high_ns", "status")}


def contributors(rows: list[dict]) -> list[dict]:
    """The significant rows that explain the step's change, biggest first (see the module's docstring)."""
    sig = [r for r in rows if r["significant"] and r["level"] != "kernel"
           and (r["level"], r["key"]) != ("ledger", "step")]
    finer = {r["level"] for r in sig}
    out = [r for r in sig if not (r["level"] == "ledger" and _BROKEN_DOWN.get(r["key"]) in finer)]
    return sorted(out, key=lambda r: (-abs(r["delta_ns"]), LEVELS.index(r["level"]), r["key"]))


def night_diffs(con, night: str, jobs: list[str], confidence: float = 0.95) -> dict[str, dict]:
    """Per job of JOBS with samples tonight and on an earlier successful night: tonight against that night."""
    out = {}
    prev = _previous_nights(con, night, sorted(jobs))
    for job in sorted(prev):
        a, b = _load(con, prev[job], job), _load(con, night, job)
        if a is None or b is None:
            continue
        rows = order_rows(diff_samples(a[0], a[1], b[0], b[1], confidence=confidence))
        sig = [r for r in rows if r["significant"]]
        regs = [r for r in sig if r["level"] == "ledger" and r["delta_ns"] > 0]
        out[job] = {
            "previous_night": prev[job], "steps": [len(a[0]), len(b[0])], "confidence": confidence,
            "changed": bool(sig), "regression": bool(regs), "significant_rows": len(sig),
            "top": [_row(r) for r in contributors(rows)[:TOP]],
            "rows": [_row(r) for r in _shown(sig)],
            "regressions": [_row(r) for r in regs],
        }
    return out


def _shown(sig: list[dict]) -> list[dict]:
    """The index's rows: the step first, then the rest by the size of the change."""
    step = [r for r in sig if (r["level"], r["key"]) == ("ledger", "step")]
    rest = sorted((r for r in sig if r not in step), key=lambda r: -abs(r["delta_ns"]))
    return (step + rest)[:INDEX_ROWS]


def regressions(diffs: dict[str, dict], night: str) -> list[dict]:
    """summary.json's regressions: one per job and ledger-level row significantly longer tonight."""
    return [{"job": j, "ledger": r["key"], "previous_night": d["previous_night"], "previous_ns": r["a_ns"],
             "current_ns": r["b_ns"], "delta_ns": r["delta_ns"], "delta_share": round(r["delta_share"], 6),
             "ci_low_ns": r["ci_low_ns"], "ci_high_ns": r["ci_high_ns"]}
            for j, d in sorted(diffs.items()) for r in d["regressions"]]


def regression_line(r: dict, confidence: float) -> str:
    return (f"REGRESSION: {r['ledger']} {r['previous_ns'] / 1e6:.3f} ms per step (night {r['previous_night']}) -> "
            f"{r['current_ns'] / 1e6:.3f} ms (+{r['delta_ns'] / 1e6:.3f} ms, {100 * r['delta_share']:+.2f}% of the "
            f"step; interval [{r['ci_low_ns'] / 1e6:+.3f}, {r['ci_high_ns'] / 1e6:+.3f}] ms at {confidence:.0%} "
            f"for the whole table)")


def prune_step_samples(con, jobs: list[str]) -> None:
    """Keep each job's samples of its KEEP_NIGHTS latest successful nights: what the next comparisons need."""
    if not jobs:
        return
    con.execute(f"""
        DELETE FROM batch_step_samples s WHERE s.job IN ? AND NOT EXISTS (
            SELECT 1 FROM (
                SELECT r.night, r.job, row_number() OVER (PARTITION BY r.job ORDER BY n.seq DESC) AS k
                FROM batch_runs r JOIN batch_nights n USING (night) WHERE r.status = 'ok' AND r.job IN ?) kept
            WHERE kept.k <= {int(KEEP_NIGHTS)} AND kept.night = s.night AND kept.job = s.job)""",
                [list(jobs), list(jobs)])


def diff_html(job: str, d: dict | None) -> str:
    """The index's block for JOB's diff tonight (empty without one)."""
    if not d:
        return ""
    esc = html.escape
    head = (f"<p class='muted'>against night {esc(d['previous_night'])} ({d['steps'][0]} and {d['steps'][1]} "
            f"steps), time per step over all ranks, {d['confidence']:.0%} for the whole table</p>")
    if not d["rows"]:
        return f"<div class='diff'><b>tonight's diff</b>{head}<p>nothing beyond the step-to-step noise</p></div>"
    top = {(r["level"], r["key"]) for r in d["top"]}
    parts = [f"<div class='diff'><b>tonight's diff: significant rows</b>{head}<table><tr><th>level</th>"
             "<th>key</th><th>before ms</th><th>now ms</th><th>delta ms</th><th>of step</th><th>interval ms</th></tr>"]
    for r in d["rows"]:
        key = r["key"] if len(r["key"]) <= 60 else r["key"][:57] + "..."
        cls = " class='bad'" if r["delta_ns"] > 0 and r["level"] == "ledger" else ""
        mark = " ★" if (r["level"], r["key"]) in top else ""
        parts.append(f"<tr{cls}><td>{esc(r['level'])}</td><td title='{esc(r['key'])}'>{esc(key)}{mark}</td>"
                     f"<td>{r['a_ns'] / 1e6:.3f}</td><td>{r['b_ns'] / 1e6:.3f}</td>"
                     f"<td>{r['delta_ns'] / 1e6:+.3f}</td><td>{100 * r['delta_share']:+.2f}%</td>"
                     f"<td>[{r['ci_low_ns'] / 1e6:+.3f}, {r['ci_high_ns'] / 1e6:+.3f}]</td></tr>")
    parts.append("</table><p class='muted'>★ the top contributors named in summary.json</p></div>")
    return "".join(parts)
