"""Compare two jobs: what changed beyond the step-to-step noise (ninefold.analysis.diff).

Per ledger, kernel class, collective type and kernel (by normalised name), the time per step over all ranks in
A and B, the delta and its bootstrap interval across steps (held for the whole table); a change is flagged only
when the interval excludes zero and it is at least 0.5 % of A's step. The chart draws each ledger's delta with
its interval, the significant ones solid.
"""
from __future__ import annotations

from bokeh.models import ColumnDataSource, FactorRange, HoverTool, Span, Whisker
from bokeh.plotting import figure

from ninefold.dashboards.style import LEDGER_COLORS, esc, fmt_ns, html_table, note
from ninefold.dashboards.views._common import div

PLOT_NAME = "compare_jobs"
CONFIDENCE = 0.95
TOP = 20


def load(con, a: str, b: str) -> dict:
    from ninefold.analysis.diff import DiffError, diff_jobs, order_rows

    try:
        rows = order_rows(diff_jobs(con, a, b, confidence=CONFIDENCE))
    except DiffError as e:
        return {"a": a, "b": b, "error": str(e)}
    return {"a": a, "b": b, "rows": rows}


def _ms(ns) -> str:
    return f"{ns / 1e6:+.3f}"


def _interval(r) -> str:
    return f"[{_ms(r['ci_low_ns'])}, {_ms(r['ci_high_ns'])}] ms"


def _share(r) -> str:
    return f"{100 * r['delta_share']:+.2f} %"


def render(data):
    a, b = data["a"], data["b"]
    head = f"<h2 class='nf'>Compare: {esc(a)} → {esc(b)}</h2>"
    if data.get("error"):
        return [div(head + note(data["error"], "warn"))]
    rows = data["rows"]
    led = [r for r in rows if r["level"] == "ledger"]
    step = next(r for r in led if r["key"] == "step")
    sig = [r for r in rows if r["significant"]]
    verdict = (f"{len(sig)} significant change{'s' if len(sig) != 1 else ''}" if sig
               else "nothing beyond the step-to-step noise")
    txt = note(f"time per step over all ranks ({step['steps_a']} steps of {a}, {step['steps_b']} of {b}); the "
               f"interval is a bootstrap over the steps at {CONFIDENCE:.0%} for the whole table; a change is "
               f"significant when its interval excludes zero and it is at least 0.5 % of {a}'s step: {verdict}. "
               f"Step {fmt_ns(step['a_ns'])} → {fmt_ns(step['b_ns'])} ({_share(step)}).",
               "warn" if sig else "info")
    out = [div(head + txt)]
    bars = [r for r in led if r["key"] != "step"]
    names = [r["key"] for r in bars]
    src = ColumnDataSource({
        "ledger": names, "delta": [r["delta_ns"] / 1e6 for r in bars],
        "lo": [r["ci_low_ns"] / 1e6 for r in bars], "hi": [r["ci_high_ns"] / 1e6 for r in bars],
        "a": [r["a_ns"] / 1e6 for r in bars], "b": [r["b_ns"] / 1e6 for r in bars],
        "color": [LEDGER_COLORS[n] for n in names], "alpha": [1.0 if r["significant"] else 0.3 for r in bars],
        "sig": ["significant" if r["significant"] else "within the noise" for r in bars]})
    p = figure(x_range=FactorRange(*names), height=300, sizing_mode="stretch_width", name=PLOT_NAME,
               title=f"delta per step, {b} − {a} (ms over all ranks) with its interval; faded: within the noise",
               tools="save")
    p.vbar(x="ledger", top="delta", width=0.6, color="color", fill_alpha="alpha", line_alpha="alpha", source=src)
    p.add_layout(Whisker(base="ledger", lower="lo", upper="hi", source=src, line_color="#333"))
    p.add_layout(Span(location=0, dimension="width", line_color="#999", line_width=1))
    p.add_tools(HoverTool(tooltips=[("ledger", "@ledger"), (a, "@a{0.000} ms"), (b, "@b{0.000} ms"),
                                    ("delta", "@delta{+0.000} ms"), ("interval", "[@lo{+0.000}, @hi{+0.000}] ms"),
                                    ("", "@sig")]))
    out.append(p)
    table = html_table(["ledger", a, b, "delta", f"of {a}'s step", "interval", "significant"],
                       [[r["key"], fmt_ns(r["a_ns"]), fmt_ns(r["b_ns"]), fmt_ns(r["delta_ns"]), _share(r),
                         _interval(r), "yes" if r["significant"] else "–"] for r in led],
                       css_class="nf-table nf-diff-ledgers")
    other = sorted((r for r in sig if r["level"] != "ledger"), key=lambda r: -abs(r["delta_ns"]))
    table += "<h3 class='nf'>Significant changes by kernel class, collective and kernel</h3>"
    if other:
        table += html_table(["level", "key", a, b, "delta", f"of {a}'s step", "interval"],
                            [[r["level"], r["key"] if len(r["key"]) <= 80 else r["key"][:77] + "...",
                              fmt_ns(r["a_ns"]), fmt_ns(r["b_ns"]), fmt_ns(r["delta_ns"]), _share(r), _interval(r)]
                             for r in other[:TOP]], css_class="nf-table nf-diff-significant")
        if len(other) > TOP:
            table += note(f"… and {len(other) - TOP} more (ninefold diff --format json lists every row)")
    else:
        table += note("none")
    for status, label, col in (("new", f"new in {b}", "b_ns"), ("vanished", f"gone from {b}", "a_ns")):
        ks = sorted((r for r in rows if r["level"] == "kernel" and r["status"] == status), key=lambda r: -r[col])
        if ks:
            table += f"<h3 class='nf'>Kernels {esc(label)}</h3>" + html_table(
                ["kernel (normalised)", "time per step", "significant"],
                [[r["key"][:90], fmt_ns(r[col]), "yes" if r["significant"] else "–"] for r in ks[:10]],
                css_class=f"nf-table nf-diff-{status}")
    out.append(div(table))
    return out
