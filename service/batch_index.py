"""The nightly index page: each job's ledger shares across nights (table + sparklines) beside tonight's diff
against its previous night (service.batch_diff), regressions first."""
from __future__ import annotations

import html
from pathlib import Path

from analysis.ledgers import LEDGERS

from .batch_diff import diff_html
from .batch_tasks import _atomic_write_text

HISTORY_NIGHTS = 30


def _sparkline(values: list[float | None], color: str, w: int = 90, h: int = 22) -> str:
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    if not pts:
        return ""
    top = max(max(v for _, v in pts), 1e-9)
    n = max(len(values) - 1, 1)

    def xy(i, v):
        return f"{2 + i * (w - 4) / n:.1f},{h - 2 - v / top * (h - 4):.1f}"

    poly = " ".join(xy(i, v) for i, v in pts)
    last = xy(*pts[-1])
    return (f'<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">'
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{poly}"/>'
            f'<circle cx="{last.split(",")[0]}" cy="{last.split(",")[1]}" r="2" fill="{color}"/></svg>')


INDEX_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 6px 0 18px; }
th, td { border: 1px solid #ddd; padding: 2px 7px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.bad { background: #fde2e1; } .failed { color: #b00020; } .muted { color: #777; }
.tag { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 12px; margin-left: 6px; }
.tag.reg { background: #d62728; color: #fff; } .tag.fail { background: #555; color: #fff; }
.tag.ok { background: #2ca02c; color: #fff; } .tag.skip { background: #c7c7c7; }
h2 { margin-bottom: 2px; } .spark { vertical-align: middle; }
.side { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; } .diff table { margin-top: 2px; }
"""


def write_index(con, reports: Path, night: str, summary: dict) -> Path:
    """reports/index.html: each job's ledger shares across nights (table + sparklines), regressions first."""
    from dashboards.style import LEDGER_COLORS

    esc = html.escape
    nights = [r[0] for r in con.execute("SELECT night FROM batch_nights ORDER BY seq DESC LIMIT ?",
                                        [HISTORY_NIGHTS]).fetchall()][::-1]
    runs = con.execute("""SELECT r.job, r.night, r.status, r.error FROM batch_runs r
                          JOIN batch_nights n USING (night) ORDER BY r.job, n.seq""").fetchall()
    shares = con.execute("SELECT job, night, ledger, share FROM batch_shares").fetchall()
    sh: dict = {}
    for j, n, led, s in shares:
        sh.setdefault(j, {}).setdefault(n, {})[led] = s
    status: dict = {}
    for j, n, st, err in runs:
        status.setdefault(j, {})[n] = (st, err)
    regs: dict = {}
    for r in summary["regressions"]:
        regs.setdefault(r["job"], []).append(r)
    this = {**{j: "processed" for j in summary["jobs"]["processed"]},
            **{j["job"]: "skipped" for j in summary["jobs"]["skipped"]},
            **{j["job"]: "failed" for j in summary["jobs"]["failed"]}}
    jobs = sorted(set(status) | set(this), key=lambda j: (j not in regs, this.get(j) != "failed", j))
    c = summary["counts"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>ninefold batch {esc(night)}</title>"
             f"<style>{INDEX_CSS}</style></head><body>",
             f"<h1>ninefold nightly batch: {esc(night)}</h1>",
             f"<p>{c['processed']} processed, {c['skipped']} unchanged, {c['failed']} failed, "
             f"{len(summary['regressions'])} regressions (the step or a ledger significantly longer per step than "
             f"on the job's previous run: the bootstrap interval over the steps excludes zero at "
             f"{summary.get('confidence', 0.95):.0%} for the whole table).</p>"]
    if summary["regressions"]:
        parts.append("<h2>Regressions</h2><table><tr><th>job</th><th>ledger</th><th>previous night</th>"
                     "<th>before ms</th><th>now ms</th><th>delta ms</th><th>of step</th><th>interval ms</th></tr>")
        for r in summary["regressions"]:
            parts.append(f"<tr class='bad'><td><a href='#job-{esc(r['job'])}'>{esc(r['job'])}</a></td>"
                         f"<td>{esc(r['ledger'])}</td><td>{esc(r['previous_night'])}</td>"
                         f"<td>{r['previous_ns'] / 1e6:.3f}</td><td>{r['current_ns'] / 1e6:.3f}</td>"
                         f"<td>{r['delta_ns'] / 1e6:+.3f}</td><td>{100 * r['delta_share']:+.2f}%</td>"
                         f"<td>[{r['ci_low_ns'] / 1e6:+.3f}, {r['ci_high_ns'] / 1e6:+.3f}]</td></tr>")
        parts.append("</table>")
    for j in jobs:
        tag = {"processed": "<span class='tag ok'>processed</span>", "skipped": "<span class='tag skip'>unchanged"
               "</span>", "failed": "<span class='tag fail'>failed</span>"}.get(this.get(j), "")
        if j in regs:
            tag += "<span class='tag reg'>regression: " + esc(", ".join(r["ledger"] for r in regs[j])) + "</span>"
        if j not in this:
            tag += "<span class='tag skip'>not in tonight's drop</span>"
        links = ([f"<a href='{esc(j)}.html'>report</a>"] if (reports / f"{j}.html").exists() else []) + [
            f"<a href='logs/{esc(j)}.log'>log</a>"]
        parts.append(f"<h2 id='job-{esc(j)}'>{esc(j)}{tag}</h2><p>{' · '.join(links)}</p>")
        err = status.get(j, {}).get(night, (None, None))[1]
        if this.get(j) == "failed" and err:
            parts.append(f"<p class='failed'>{esc(err)}</p>")
        jn = [n for n in nights if n in status.get(j, {})]
        block = diff_html(j, summary.get("diffs", {}).get(j))
        if not jn:
            parts.append(block)
            continue
        bad_leds = {r["ledger"] for r in regs.get(j, [])}
        head = "".join(f"<th style='border-bottom:3px solid {LEDGER_COLORS[n]}'>{esc(n)} %</th>" for n in LEDGERS)
        parts.append(f"<div class='side'><table><tr><th>night</th><th>status</th>{head}</tr>")
        for n in jn:
            st, _ = status[j][n]
            row = sh.get(j, {}).get(n, {})
            cells = "".join(
                f"<td{' class=bad' if n == night and led in bad_leds else ''}>"
                f"{'' if led not in row else f'{100 * row[led]:.2f}'}</td>" for led in LEDGERS)
            parts.append(f"<tr><td>{esc(n)}</td><td class='{'failed' if st != 'ok' else ''}'>{esc(st)}</td>"
                         f"{cells}</tr>")
        sparks = "".join(
            f"<td>{_sparkline([sh.get(j, {}).get(n, {}).get(led) for n in jn], LEDGER_COLORS[led])}</td>"
            for led in LEDGERS)
        parts.append(f"<tr><td class='muted'>trend</td><td></td>{sparks}</tr></table>{block}</div>")
    parts.append("</body></html>")
    out = reports / "index.html"
    _atomic_write_text(out, "\n".join(parts))
    return out
