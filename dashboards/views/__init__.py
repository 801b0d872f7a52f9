"""One module per view. Each has ``load(con, job, ...)`` (named queries only) and ``render(data)``, which
returns Bokeh models; the Panel app and the static report show the same models."""

VIEWS = ["jobs", "overview", "timeline", "stragglers", "moe", "pipeline", "memory", "compare"]
