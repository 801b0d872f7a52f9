"""The nightly index page, rendered with Bokeh like the per-job reports (one self-contained HTML file, BokehJS
inline, no network): the regressions first, then per job its status, links, ledger shares across nights (a line
figure named ``trend-<job>`` and the table of shares per night), tonight's significant diff against its previous
night (ninefold.batch.diff) and its top kernels by lost time (``batch_lost_kernels``: the last night that has
them, so an unchanged job still shows its rows)."""
from __future__ import annotations

import math
from pathlib import Path

from bokeh.document import Document
from bokeh.embed import file_html
from bokeh.events import DocumentReady
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, CustomJS, Div, FactorRange, HoverTool, Legend
from bokeh.plotting import figure
from bokeh.resources import INLINE

from ninefold.analysis.ledgers import LEDGERS
from ninefold.dashboards.style import LEDGER_COLORS, esc, fmt_ns
from ninefold.dashboards.views._common import div

from ninefold.batch.catalog import lost_kernels_of
from ninefold.batch.diff import diff_html
from ninefold.batch.tasks import _atomic_write_text

HISTORY_NIGHTS = 30
INDEX_ROOT = "ninefold_index"

INDEX_CSS = """
:host { font: 14px/1.45 system-ui, sans-serif; color: #222; }
table { border-collapse: collapse; margin: 6px 0 18px; font: 13px/1.4 system-ui, sans-serif; }
th, td { border: 1px solid #ddd; padding: 2px 7px; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
.bad { background: #fde2e1; } .failed { color: #b00020; } .muted { color: #777; }
.tag { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 12px; margin-left: 6px; }
.tag.reg { background: #d62728; color: #fff; } .tag.fail { background: #555; color: #fff; }
.tag.ok { background: #2ca02c; color: #fff; } .tag.skip { background: #c7c7c7; }
h1, h2 { font-family: system-ui, sans-serif; } h2 { margin-bottom: 2px; }
.side { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; } .diff table { margin-top: 2px; }
.diff td:nth-child(2) { text-align: left; }
td.kernel { text-align: left; max-width: 46em; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
"""

# Each Div renders in its own shadow root, where the browser does not look for a #fragment's target: the page
# finds it there itself (on load and when a link such as the regressions' changes the fragment).
JUMP_JS = """
function find(root, id) {
  const el = root.getElementById(id);
  if (el) return el;
  for (const host of root.querySelectorAll("*")) {
    const got = host.shadowRoot ? find(host.shadowRoot, id) : null;
    if (got) return got;
  }
  return null;
}
function jump() {
  const id = decodeURIComponent(window.location.hash.slice(1));
  const el = id ? find(document, id) : null;
  if (el) el.scrollIntoView();
}
window.addEventListener("hashchange", jump);
setTimeout(jump, 50);
"""


def _div(text: str, **kw) -> Div:
    return div(text, css=INDEX_CSS, **kw)


def _trend(job: str, jn: list[str], sh: dict):
    """JOB's ledger shares (%) across its nights JN: one line (and its points) per ledger."""
    p = figure(name=f"trend-{job}", x_range=FactorRange(*jn), height=240, width=560, tools="",
               toolbar_location=None, y_axis_label="share of the step %", title=f"{job}: ledger shares")
    items, lines = [], []
    for led in LEDGERS:
        pct = [(100 * v) if (v := sh.get(n, {}).get(led)) is not None else math.nan for n in jn]
        src = ColumnDataSource({"night": list(jn), "pct": pct, "ledger": [led] * len(jn)})
        ln = p.line("night", "pct", source=src, color=LEDGER_COLORS[led], line_width=2, name=f"trend-{job}-{led}")
        pt = p.scatter("night", "pct", source=src, color=LEDGER_COLORS[led], size=5)
        items.append((led, [ln, pt]))
        lines.append(ln)
    p.add_layout(Legend(items=items, label_text_font_size="11px", spacing=0, padding=4), "right")
    p.add_tools(HoverTool(renderers=lines, tooltips=[("night", "@night"), ("ledger", "@ledger"),
                                                     ("share", "@pct{0.00} %")]))
    p.y_range.start = 0
    return p


def _share_table(j: str, jn: list[str], status: dict, sh: dict, night: str, bad_leds: set) -> str:
    head = "".join(f"<th style='border-bottom:3px solid {LEDGER_COLORS[n]}'>{esc(n)} %</th>" for n in LEDGERS)
    parts = [f"<table><tr><th>night</th><th>status</th>{head}</tr>"]
    for n in jn:
        st, _ = status[j][n]
        shares = sh.get(j, {}).get(n, {})
        cells = "".join(f"<td{' class=bad' if n == night and led in bad_leds else ''}>"
                        f"{'' if led not in shares else f'{100 * shares[led]:.2f}'}</td>" for led in LEDGERS)
        parts.append(f"<tr><td>{esc(n)}</td><td class='{'failed' if st != 'ok' else ''}'>{esc(st)}</td>"
                     f"{cells}</tr>")
    parts.append("</table>")
    return "".join(parts)


def lost_html(night: str, tonight: str | None, lost_night: str | None, rows: list[dict],
              reason: str | None) -> str:
    """The index's table of a job's kernels by lost time (time against the device's peak, summed over ranks);
    TONIGHT: what happened to the job tonight (processed, skipped, failed or None)."""
    if lost_night is None:
        return ""
    when = "" if lost_night == night else (
        f" (night {esc(lost_night)}: the job is unchanged since)" if tonight == "skipped"
        else f" (night {esc(lost_night)}, its latest successful run)")
    parts = [f"<div class='lost'><b>top kernels by lost time{when}</b>"
             "<p class='muted'>lost = time − work / the device's peak, over all ranks; efficiency = ideal time / "
             "time</p>"]
    if rows:
        parts.append("<table><tr><th>kernel</th><th>class</th><th>calls</th><th>time</th><th>lost</th>"
                     "<th>efficiency</th><th>against</th></tr>")
        for r in rows:
            k = r["kernel"] if len(r["kernel"]) <= 80 else r["kernel"][:77] + "..."
            eff = "–" if r["efficiency"] is None else f"{100 * r['efficiency']:.1f}%"
            parts.append(f"<tr><td class='kernel' title='{esc(r['kernel'])}'>{esc(k)}</td><td>{esc(r['kclass'])}"
                         f"</td><td>{r['calls']}</td><td>{esc(fmt_ns(r['time_ns']))}</td>"
                         f"<td>{esc(fmt_ns(r['lost_ns']))}</td><td>{eff}</td><td>{esc(r['unit'] or '')}</td></tr>")
        parts.append("</table>")
    if reason:
        parts.append(f"<p class='muted'>{esc(reason)}</p>")
    parts.append("</div>")
    return "".join(parts)


def _header(night: str, summary: dict) -> str:
    c = summary["counts"]
    parts = [f"<h1>ninefold nightly batch: {esc(night)}</h1>",
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
    return "".join(parts)


def render_index(con, reports: Path, night: str, summary: dict):
    """The index's Bokeh layout (one column, named INDEX_ROOT)."""
    nights = [r[0] for r in con.execute("SELECT night FROM batch_nights ORDER BY seq DESC LIMIT ?",
                                        [HISTORY_NIGHTS]).fetchall()][::-1]
    runs = con.execute("""SELECT r.job, r.night, r.status, r.error FROM batch_runs r
                          JOIN batch_nights n USING (night) ORDER BY r.job, n.seq""").fetchall()
    sh: dict = {}
    for j, n, led, s in con.execute("SELECT job, night, ledger, share FROM batch_shares").fetchall():
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
    models = [_div(_header(night, summary))]
    for j in jobs:
        tag = {"processed": "<span class='tag ok'>processed</span>", "skipped": "<span class='tag skip'>unchanged"
               "</span>", "failed": "<span class='tag fail'>failed</span>"}.get(this.get(j), "")
        if j in regs:
            tag += "<span class='tag reg'>regression: " + esc(", ".join(r["ledger"] for r in regs[j])) + "</span>"
        if j not in this:
            tag += "<span class='tag skip'>not in tonight's drop</span>"
        links = ([f"<a href='{esc(j)}.html'>report</a>"] if (reports / f"{j}.html").exists() else []) + [
            f"<a href='logs/{esc(j)}.log'>log</a>"]
        head = f"<h2 id='job-{esc(j)}'>{esc(j)}{tag}</h2><p>{' · '.join(links)}</p>"
        err = status.get(j, {}).get(night, (None, None))[1]
        if this.get(j) == "failed" and err:
            head += f"<p class='failed'>{esc(err)}</p>"
        models.append(_div(head, name=f"job-{j}"))
        jn = [n for n in nights if n in status.get(j, {})]
        block = diff_html(j, summary.get("diffs", {}).get(j))
        if jn:
            table = _share_table(j, jn, status, sh, night, {r["ledger"] for r in regs.get(j, [])})
            models.append(row(_trend(j, jn, sh.get(j, {})),
                              _div(f"<div class='side'>{table}{block}</div>", name=f"shares-{j}")))
        elif block:
            models.append(_div(block, name=f"diff-{j}"))
        lost = lost_html(night, this.get(j), *lost_kernels_of(con, j, night))
        if lost:
            models.append(_div(lost, name=f"lost-{j}"))
    return column(*models, sizing_mode="stretch_width", name=INDEX_ROOT)


def write_index(con, reports: Path, night: str, summary: dict) -> Path:
    """reports/index.html (atomically): the layout of render_index, BokehJS inline."""
    out = Path(reports) / "index.html"
    doc = Document()
    doc.add_root(render_index(con, Path(reports), night, summary))
    doc.js_on_event(DocumentReady, CustomJS(code=JUMP_JS))
    page = file_html(doc, resources=INLINE, title=f"ninefold batch {night}")
    _atomic_write_text(out, page)
    return out
