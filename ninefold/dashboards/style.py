"""Colours, number formats and small HTML pieces shared by every view and the static report."""
from __future__ import annotations

import html
import re

from ninefold.analysis.ledgers import DESCRIPTIONS, LEDGERS

# one colour per ledger, fixed everywhere (productive greens, host/io browns, comm blues, waiting reds, idle grey)
LEDGER_COLORS = {
    "compute": "#2ca02c",
    "recompute": "#98df8a",
    "host": "#8c564b",
    "exposed_comm": "#1f77b4",
    "memcpy": "#17becf",
    "io": "#bcbd22",
    "bubble": "#ff7f0e",
    "straggler": "#d62728",
    "idle": "#c7c7c7",
}
PALETTE = [LEDGER_COLORS[n] for n in LEDGERS]
PREDICTED_COLOR = "#7f7f7f"


def fmt_ns(ns) -> str:
    """Human duration of integer/float ns: 1.23 s, 4.56 ms, 7.8 µs, 90 ns."""
    if ns is None:
        return "–"
    v = float(ns)
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g} s"
    if a >= 1e6:
        return f"{v / 1e6:.4g} ms"
    if a >= 1e3:
        return f"{v / 1e3:.4g} µs"
    return f"{v:.0f} ns"


def fmt_bytes(b) -> str:
    if b is None:
        return "–"
    v = float(b)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.4g} {unit}" if unit != "B" else f"{v:.0f} B"
        v /= 1024
    return f"{v:.4g} TiB"


def fmt_pct(x) -> str:
    return "–" if x is None else f"{100 * float(x):.1f} %"


# control characters and bidirectional overrides are shown as their escapes, never emitted raw (a NUL or a
# right-to-left override in a kernel name must not reach a page)
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def safe_text(x) -> str:
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", "" if x is None else str(x))


def esc(x) -> str:
    return html.escape(safe_text(x))


def html_table(header: list[str], rows: list[list], css_class: str = "nf-table") -> str:
    """A plain HTML table (cells escaped); used both in Panel panes and in the static report."""
    th = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{css_class}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def note(text: str, kind: str = "info") -> str:
    return f'<div class="nf-note nf-{kind}">{esc(text)}</div>'


def ledger_legend_html() -> str:
    items = "".join(f'<span class="nf-key" title="{esc(DESCRIPTIONS[n])}"><span class="nf-swatch" '
                    f'style="background:{LEDGER_COLORS[n]}"></span>{esc(n)}</span>' for n in LEDGERS)
    return f'<div class="nf-legend">{items}</div>'


CSS = """
.nf-table { border-collapse: collapse; font: 13px/1.4 system-ui, sans-serif; margin: 4px 0 12px; }
.nf-table th, .nf-table td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
.nf-table th { background: #f4f4f4; }
.nf-table td:first-child, .nf-table th:first-child { text-align: left; }
.nf-note { font: 14px system-ui, sans-serif; padding: 6px 10px; margin: 6px 0; border-left: 4px solid #1f77b4;
           background: #f0f6fb; }
.nf-warn { border-left-color: #ff7f0e; background: #fff6ec; }
.nf-error { border-left-color: #d62728; background: #fdeeee; }
.nf-legend { font: 12px system-ui, sans-serif; margin: 4px 0; }
.nf-key { margin-right: 12px; white-space: nowrap; }
.nf-swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
h1.nf, h2.nf { font-family: system-ui, sans-serif; }
"""
