"""The Panel app: job picker, one tab per view, and the upload page.

Every tab renders the same Bokeh models as the static report (``views.<name>.render(views.<name>.load(...))``),
loaded through ``data_store.cached`` — short read-only connections, results cached until the writer commits.
Only the active tab is rendered; a periodic callback notices new data (the writer bumps a generation counter)
and refreshes the job list, the upload list and the visible tab.
"""
from __future__ import annotations

import traceback

import panel as pn
from bokeh.layouts import column

from dashboards import data_store, queries
from dashboards.style import CSS, esc, fmt_bytes, html_table, note
from dashboards.uploads import ChunkWriter, UploadStore, Writer
from dashboards.views import compare, efficiency, jobs, memory, moe, overview, pipeline, stragglers, timeline, whatif
from store.errors import NinefoldError

TABS = [("jobs", "Jobs"), ("overview", "Overview"), ("timeline", "Timeline"), ("whatif", "What if"),
        ("stragglers", "Stragglers"),
        ("moe", "MoE"), ("pipeline", "Pipeline"), ("memory", "Memory"), ("efficiency", "Efficiency"),
        ("compare", "Compare"), ("upload", "Upload")]
CHUNK_BYTES = 4 << 20


class StreamingFileDropper(pn.widgets.FileDropper):
    """FileDropper whose chunks go straight to disk (content-addressed on the last chunk) instead of memory.

    ``on_chunk_file(name, job)`` is asked for a ChunkWriter at chunk 1; ``on_complete(entry)`` gets the manifest
    entry of a finished file; ``on_error(message)`` any failure."""

    def __init__(self, store: UploadStore, job_of, on_complete, on_error, **params):
        super().__init__(**params)
        self._store, self._job_of = store, job_of
        self._on_complete, self._on_error = on_complete, on_error
        self._writers: dict[str, ChunkWriter | None] = {}

    def abort_all(self) -> None:
        """The browser session ended: its uploads still arriving are dropped, their partial files deleted."""
        for w in list(self._writers.values()):
            if w is not None:
                w.abort()
        self._writers.clear()

    def _process_event(self, event):
        data = event.data
        name = data["name"]
        if event.event_name == "delete_event":
            return
        try:
            if data["chunk"] == 1:
                old = self._writers.pop(name, None)
                if old is not None:
                    old.abort()
                self._writers[name] = ChunkWriter(self._store, name, self._job_of())
            w = self._writers.get(name)
            if w is None:  # an earlier chunk of this file failed; drop the rest
                return
            chunk = data["data"]
            if isinstance(chunk, str):
                chunk = chunk.encode("utf-8")
            w.write(bytes(chunk))
            if data["chunk"] == data["total_chunks"]:
                self._writers.pop(name, None)
                self._on_complete(w.finish())
        except NinefoldError as e:
            w = self._writers.pop(name, None)
            if w is not None:
                w.abort()
            self._writers[name] = None
            self._on_error(str(e))


def _view_pane(name: str, models) -> pn.viewable.Viewable:
    return pn.pane.Bokeh(column(*models, sizing_mode="stretch_width"), sizing_mode="stretch_width",
                         css_classes=[f"nf-view-{name}"])


def _alert(text: str, kind: str = "danger") -> pn.pane.Alert:
    """An alert of TEXT, escaped: an error message may quote a job or file name (Alert renders Markdown, which
    passes HTML through)."""
    return pn.pane.Alert(esc(text), alert_type=kind, css_classes=["nf-alert"])


def uploads_html(entries: list[dict]) -> str:
    if not entries:
        return note("no uploads yet")
    rows = [[e.get("first_ts", "")[:19].replace("T", " "), e.get("job"), e.get("name"), fmt_bytes(e.get("bytes")),
             e.get("status"), e.get("message") or "", (e.get("sha256") or "")[:12]] for e in reversed(entries)]
    return html_table(["uploaded (UTC)", "job", "file", "size", "status", "message", "sha256"], rows,
                      "nf-table nf-uploads")


def make_app(db_path, store: UploadStore, writer: Writer, max_upload_bytes: int):
    """A function that builds one browser session's page."""

    def session():
        db = str(db_path)
        state = {"gen": -1, "mine": set(), "switched": set()}
        qp = pn.state.location.query_params if pn.state.location else {}

        def q(fn, *a, **k):
            return data_store.cached(db, fn, *a, **k)

        job = pn.widgets.Select(name="job", options=[], width=260)
        step = pn.widgets.Select(name="step", options=[], width=120)
        job_b = pn.widgets.Select(name="compare with", options=[], width=260)
        contents = {key: pn.Column(sizing_mode="stretch_width", css_classes=[f"nf-tab-{key}"]) for key, _ in TABS}

        # ---------------------------------------------------------- upload page
        upload_job = pn.widgets.TextInput(name="job name for the uploaded files", value=qp.get("upload_job", "upload"),
                                          width=300)
        errors = pn.Column(sizing_mode="stretch_width")
        progress = pn.indicators.Progress(active=False, value=0, max=100, width=300, visible=False,
                                          css_classes=["nf-progress"])
        busy_text = pn.pane.HTML("", css_classes=["nf-busy"])
        table = pn.pane.HTML(uploads_html(store.entries()), sizing_mode="stretch_width",
                             css_classes=["nf-upload-list"])

        def completed(entry):
            state["mine"].add(entry["job"])
            writer.submit(entry)
            table.object = uploads_html(store.entries())

        def failed(msg):
            errors.append(_alert(msg))

        limit_mb = max(1, max_upload_bytes // 2 ** 20)
        dropper = StreamingFileDropper(store, lambda: upload_job.value, completed, failed, multiple=True,
                                       chunk_size=CHUNK_BYTES, max_file_size=f"{limit_mb}MB",
                                       sizing_mode="stretch_width", css_classes=["nf-dropper"])
        try:  # a closed browser tab leaves no partial file behind
            pn.state.on_session_destroyed(lambda _ctx, d=dropper: d.abort_all())
        except Exception:  # outside a server session (the static report, tests)
            pass
        contents["upload"].objects = [
            pn.pane.HTML(f"<style>{CSS}</style><h2 class='nf'>Upload traces</h2>"
                         + note("drop Kineto .json / .json.gz, Nsight Systems .sqlite or NCCL .log files; they are "
                                f"stored by sha256 beside the store, ingested and attributed in the background "
                                f"(limit {fmt_bytes(max_upload_bytes)} a file)"), sizing_mode="stretch_width"),
            upload_job, dropper, pn.Row(progress, busy_text), errors, table]

        # ---------------------------------------------------------- views
        # one job's views: (module, whether its load takes the selected step)
        JOB_VIEWS = {"overview": (overview, False), "timeline": (timeline, True), "stragglers": (stragglers, False),
                     "moe": (moe, False), "pipeline": (pipeline, True), "memory": (memory, False),
                     "whatif": (whatif, True), "efficiency": (efficiency, False)}

        def render(key):
            j = job.value
            try:
                if key == "jobs":
                    d = q(jobs.load)
                    models = jobs.render(d)
                elif key == "upload":
                    return
                elif not j:
                    contents[key].objects = [pn.pane.HTML(note("no job selected: upload traces or run "
                                                               "ninefold ingest"))]
                    return
                elif key in JOB_VIEWS:
                    view, takes_step = JOB_VIEWS[key]
                    args = (j, step.value) if takes_step else (j,)
                    models = view.render(q(view.load, *args))
                elif key == "compare":
                    b = job_b.value
                    if not b:
                        contents[key].objects = [pn.pane.HTML(note(
                            "pick a second job in 'compare with': what changed from this job to that one, beyond "
                            "the step-to-step noise (two nights of a job: ingest each night as its own job)"))]
                        return
                    models = compare.render(q(compare.load, j, b))
                else:
                    return
                contents[key].objects = [_view_pane(key, models)]
            except NinefoldError as e:
                contents[key].objects = [_alert(str(e))]
            except Exception as e:  # show, do not kill the session
                traceback.print_exc()
                contents[key].objects = [_alert(f"{type(e).__name__}: {e}")]

        tabs = pn.Tabs(*[(label, contents[key]) for key, label in TABS], dynamic=False, sizing_mode="stretch_width")
        keys = [k for k, _ in TABS]

        def active_key():
            return keys[tabs.active]

        def refresh_jobs():
            try:
                names = q(queries.jobs)["job"].to_list()
            except NinefoldError as e:
                errors.objects = [_alert(str(e))]
                names = []
            if names != list(job.options):
                cur = job.value
                job.options = names
                if cur in names:
                    job.value = cur
                elif names:
                    job.value = names[0]
                job_b.options = [""] + names
            refresh_steps()

        def refresh_steps():
            j = job.value
            steps = q(queries.job_steps, j) if j else []
            if steps != list(step.options):
                step.options = steps
                if steps:
                    step.value = steps[len(steps) // 2]

        def on_job(_):
            refresh_steps()
            render(active_key())

        job.param.watch(on_job, "value")
        step.param.watch(lambda _: render(active_key()) if active_key() in ("timeline", "pipeline", "whatif") else None,
                         "value")
        job_b.param.watch(lambda _: render("compare") if active_key() == "compare" else None, "value")
        tabs.param.watch(lambda _: render(active_key()), "active")

        def tick():
            busy = not writer.idle()
            progress.visible = busy
            progress.active = busy
            progress.value = -1 if busy else 0
            cur = writer.current
            busy_text.object = (f"<span class='nf-busy-text'>ingesting and attributing {esc(cur['name'])} "
                                f"into job {esc(cur['job'])}…</span>"
                                if busy and cur else ("<span class='nf-busy-text'>queued…</span>" if busy else ""))
            g = data_store.generation()
            if g == state["gen"]:
                return
            state["gen"] = g
            entries = store.entries()
            table.object = uploads_html(entries)
            refresh_jobs()
            # when this page's uploads are all done, show the job they landed in
            if not busy:
                done = [e for e in entries if e.get("job") in state["mine"] - state["switched"]
                        and e.get("status") == "attributed"]
                if done:
                    target = done[-1]["job"]
                    state["switched"].add(target)
                    if target in job.options:
                        job.value = target
                        tabs.active = keys.index("overview")
            render(active_key())

        # initial state from the URL: ?job=NAME&view=moe
        refresh_jobs()
        state["gen"] = data_store.generation()
        if qp.get("job") in job.options:
            job.value = qp["job"]
        if qp.get("view") in keys:
            tabs.active = keys.index(qp["view"])
        render(active_key())
        pn.state.add_periodic_callback(tick, period=700)

        header = pn.pane.HTML(f"<style>{CSS}</style><h1 class='nf' style='margin:4px 0'>ninefold</h1>"
                              f"<div style='font:12px system-ui;color:#666'>{esc(db)}</div>")
        return pn.Column(header, pn.Row(job, step, job_b), tabs, sizing_mode="stretch_width",
                         css_classes=["nf-app"])

    return session
