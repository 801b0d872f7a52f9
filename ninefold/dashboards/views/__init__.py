"""One module per view. Each has ``load(con, job, ...)`` (named queries only) and ``render(data)``, which
returns Bokeh models; the Panel app and the static report show the same models."""

# the app's tabs in order, (key, label): a view module per key but "upload" (the app's own upload page)
TABS = [("jobs", "Jobs"), ("overview", "Overview"), ("timeline", "Timeline"), ("whatif", "What if"),
        ("stragglers", "Stragglers"), ("moe", "MoE"), ("pipeline", "Pipeline"), ("memory", "Memory"),
        ("efficiency", "Efficiency"), ("compare", "Compare"), ("upload", "Upload")]
