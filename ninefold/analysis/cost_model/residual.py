"""The residual of a prediction, one definition for every place that shows it (``ninefold compare``, the report,
the app): measured − predicted, as a share of the measured step (the sum of the measured ledgers, mean per
rank-step). A share of the step, not of the ledger's own prediction: a ledger predicted near zero does not blow
up, and the rows add up to the step's residual."""
from __future__ import annotations

HEADING = "residual, % of measured step"


def residual_share(residual_ns, measured_step_ns) -> float | None:
    """RESIDUAL_NS / MEASURED_STEP_NS; None when either is unknown or the step is zero."""
    if residual_ns is None or not measured_step_ns:
        return None
    return residual_ns / measured_step_ns


def residual_text(residual_ns, measured_step_ns) -> str:
    """The share as '+5.4 %' ('–' when unknown)."""
    s = residual_share(residual_ns, measured_step_ns)
    return "–" if s is None else f"{100 * s:+.1f} %"
