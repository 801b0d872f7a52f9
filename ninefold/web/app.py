"""The Panel app: job picker, one tab per view, and the upload page.

Every tab renders the same Bokeh models as the static report (``views.<name>.render(views.<name>.load(...))``),
loaded through ``data_store.cached`` — short read-only connections, results cached until the generation changes.
Only the active tab is rendered. A read never waits on the server's event loop: when the store is locked (by
another process's ``ninefold ingest``, or by this server's writer) the page says the store is busy and by whom,
and a periodic callback tries again; the same callback notices new data (this server's writer, or another
process's write seen on the store file) and refreshes the job list, the upload list and the visible tab.
"""
from __future__ import annotations

import traceback

import panel as pn
from bokeh.layouts import column

from ninefold.web import data_store
from ninefold.dashboards import queries
from ninefold.web.data_store import StoreBusy
from ninefold.dashboards.style import CSS, esc, fmt_bytes, html_table, note
from ninefold.web.uploads import ChunkWriter, UploadStore, Writer
from ninefold.dashboards.views import (TABS, compare, efficiency, jobs, memory, moe, overview, pipeline, stragglers,
                              timeline, whatif)
from ninefold.store.errors import NinefoldError

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


# one job's views: (module, whether its load takes the selected step)
JOB_VIEWS = {"overview": (overview, False), "timeline": (timeline, True), "stragglers": (stragglers, False),
             "moe": (moe, False), "pipeline": (pipeline, True), "memory": (memory, False),
             "whatif": (whatif, True), "efficiency": (efficiency, False)}
STEP_VIEWS = ("timeline", "pipeline", "whatif")
TICK_MS = 700


def busy_html(e: StoreBusy) -> str:
    """What a page shows while the store is locked: who holds it, and that it tries again."""
    return (f"<style>{CSS}</style><div class='nf-store-busy'>"
            + note(f"the store is busy ({e.holder}), retrying", "warn") + "</div>")


class Session:
    """One browser session's page: the job pickers, one pane per tab, the upload page, the periodic tick."""

    def __init__(self, db_path, store: UploadStore, writer: Writer, max_upload_bytes: int):
        self.db, self.store, self.writer = str(db_path), store, writer
        self.max_upload_bytes = max_upload_bytes
        self.state = {"gen": -1, "mine": set(), "switched": set(), "retry": False}
        self.qp = pn.state.location.query_params if pn.state.location else {}
        self.want_job = self.qp.get("job")   # applied once the job list could be read
        self.holder = "another process"       # who held the store when the job list could not be read
        self.shown: dict = {}                  # tab -> the busy message it shows
        self.job = pn.widgets.Select(name="job", options=[], width=260)
        self.step = pn.widgets.Select(name="step", options=[], width=120)
        self.job_b = pn.widgets.Select(name="compare with", options=[], width=260)
        self.contents = {key: pn.Column(sizing_mode="stretch_width", css_classes=[f"nf-tab-{key}"])
                         for key, _ in TABS}
        self.banner = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["nf-banner"])
        self.errors = pn.Column(sizing_mode="stretch_width")
        self._upload_page()
        self.tabs = pn.Tabs(*[(label, self.contents[key]) for key, label in TABS], dynamic=False,
                            sizing_mode="stretch_width")
        self.keys = [k for k, _ in TABS]
        self.job.param.watch(self.on_job, "value")
        self.step.param.watch(lambda _: self.render(self.active_key()) if self.active_key() in STEP_VIEWS
                              else None, "value")
        self.job_b.param.watch(lambda _: self.render("compare") if self.active_key() == "compare" else None,
                               "value")
        self.tabs.param.watch(lambda _: self.render(self.active_key()), "active")
        # initial state from the URL: ?job=NAME&view=moe
        self.state["gen"] = data_store.generation()
        self.refresh_jobs()
        if self.qp.get("view") in self.keys:
            self.tabs.active = self.keys.index(self.qp["view"])
        self.render(self.active_key())
        pn.state.add_periodic_callback(self.tick, period=TICK_MS)

    def q(self, fn, *a, **k):
        """A named query through the read cache; StoreBusy at once when the store is locked (no waiting here:
        this runs on the server's event loop)."""
        return data_store.cached(self.db, fn, *a, wait_s=0, **k)

    def busy(self, e: StoreBusy) -> None:
        html = busy_html(e)
        if self.banner.object != html:  # the same message again sends nothing to the browser
            self.banner.object = html
        self.state["retry"] = True

    # ------------------------------------------------------------------ upload page
    def _upload_page(self) -> None:
        store, writer = self.store, self.writer
        upload_job = pn.widgets.TextInput(name="job name for the uploaded files",
                                          value=self.qp.get("upload_job", "upload"), width=300)
        self.progress = pn.indicators.Progress(active=False, value=0, max=100, width=300, visible=False,
                                               css_classes=["nf-progress"])
        self.busy_text = pn.pane.HTML("", css_classes=["nf-busy"])
        self.table = pn.pane.HTML(uploads_html(store.entries()), sizing_mode="stretch_width",
                                  css_classes=["nf-upload-list"])

        def completed(entry):
            self.state["mine"].add(entry["job"])
            writer.submit(entry)
            self.table.object = uploads_html(store.entries())

        def failed(msg):
            self.errors.append(_alert(msg))

        limit_mb = max(1, self.max_upload_bytes // 2 ** 20)
        dropper = StreamingFileDropper(store, lambda: upload_job.value, completed, failed, multiple=True,
                                       chunk_size=CHUNK_BYTES, max_file_size=f"{limit_mb}MB",
                                       sizing_mode="stretch_width", css_classes=["nf-dropper"])
        try:  # a closed browser tab leaves no partial file behind
            pn.state.on_session_destroyed(lambda _ctx, d=dropper: d.abort_all())
        except Exception:  # outside a server session (the static report, tests)
            pass
        self.contents["upload"].objects = [
            pn.pane.HTML(f"<style>{CSS}</style><h2 class='nf'>Upload traces</h2>"
                         + note("drop Kineto .json / .json.gz, Nsight Systems .sqlite or NCCL .log files; they are "
                                f"stored by sha256 beside the store, ingested and attributed in the background "
                                f"(limit {fmt_bytes(self.max_upload_bytes)} a file)"), sizing_mode="stretch_width"),
            upload_job, dropper, pn.Row(self.progress, self.busy_text), self.errors, self.table]

    # ------------------------------------------------------------------ views
    def active_key(self) -> str:
        return self.keys[self.tabs.active]

    def _models(self, key: str):
        """The Bokeh models of tab KEY, or an HTML note when there is nothing to draw (None: leave it)."""
        j = self.job.value
        if key == "jobs":
            return jobs.render(self.q(jobs.load))
        if key == "upload":
            return None
        if not j:
            return note("no job selected: upload traces or run ninefold ingest")
        if key in JOB_VIEWS:
            view, takes_step = JOB_VIEWS[key]
            args = (j, self.step.value) if takes_step else (j,)
            return view.render(self.q(view.load, *args))
        if key == "compare":
            b = self.job_b.value
            if not b:
                return note("pick a second job in 'compare with': what changed from this job to that one, beyond "
                            "the step-to-step noise (two nights of a job: ingest each night as its own job)")
            return compare.render(self.q(compare.load, j, b))
        return None

    def render(self, key: str) -> None:
        area = self.contents[key]
        try:
            if self.state["retry"] and key != "upload" and not self.job.options:
                raise StoreBusy("the job list is not read yet", self.holder)  # still waiting for the store
            models = self._models(key)
            if models is None:
                return
            area.objects = [pn.pane.HTML(models) if isinstance(models, str) else _view_pane(key, models)]
            self.shown.pop(key, None)
        except StoreBusy as e:
            self.busy(e)
            html = busy_html(e)
            if self.shown.get(key) != html:  # a retry that meets the same holder leaves the page alone
                area.objects = [pn.pane.HTML(html, sizing_mode="stretch_width")]
                self.shown[key] = html
        except NinefoldError as e:
            self.shown.pop(key, None)
            area.objects = [_alert(str(e))]
        except Exception as e:  # show, do not kill the session
            self.shown.pop(key, None)
            traceback.print_exc()
            area.objects = [_alert(f"{type(e).__name__}: {e}")]

    def refresh_jobs(self) -> bool:
        """Read the job list (and the selected job's steps); False when the store is busy."""
        try:
            names = self.q(queries.jobs)["job"].to_list()
        except StoreBusy as e:
            self.holder = e.holder
            self.busy(e)
            return False
        except NinefoldError as e:
            self.errors.objects = [_alert(str(e))]
            names = []
        job = self.job
        if names != list(job.options):
            cur = self.want_job if self.want_job in names else job.value
            self.want_job = None
            job.options = names
            if cur in names:
                job.value = cur
            elif names:
                job.value = names[0]
            self.job_b.options = [""] + names
        return self.refresh_steps()

    def refresh_steps(self) -> bool:
        j = self.job.value
        try:
            steps = self.q(queries.job_steps, j) if j else []
        except StoreBusy as e:
            self.busy(e)
            return False
        if steps != list(self.step.options):
            self.step.options = steps
            if steps:
                self.step.value = steps[len(steps) // 2]
        return True

    def on_job(self, _) -> None:
        self.refresh_steps()
        self.render(self.active_key())

    # ------------------------------------------------------------------ the periodic tick
    def _show_writer(self) -> bool:
        writer = self.writer
        busy = not writer.idle()
        self.progress.visible = busy
        self.progress.active = busy
        self.progress.value = -1 if busy else 0
        cur = writer.current
        self.busy_text.object = (f"<span class='nf-busy-text'>ingesting and attributing {esc(cur['name'])} "
                                 f"into job {esc(cur['job'])}…</span>"
                                 if busy and cur else ("<span class='nf-busy-text'>queued…</span>" if busy else ""))
        return busy

    def tick(self) -> None:
        busy = self._show_writer()
        data_store.notice_external_writes(self.db)
        g = data_store.generation()
        if g == self.state["gen"] and not self.state["retry"]:
            return
        self.state["gen"] = g
        self.state["retry"] = False
        entries = self.store.entries()
        self.table.object = uploads_html(entries)
        if not self.refresh_jobs():
            self.render(self.active_key())
            return
        if self.banner.object:
            self.banner.object = ""
        # when this page's uploads are all done, show the job they landed in
        if not busy:
            done = [e for e in entries if e.get("job") in self.state["mine"] - self.state["switched"]
                    and e.get("status") == "attributed"]
            if done:
                target = done[-1]["job"]
                self.state["switched"].add(target)
                if target in self.job.options:
                    self.job.value = target
                    self.tabs.active = self.keys.index("overview")
        self.render(self.active_key())

    def layout(self) -> pn.viewable.Viewable:
        header = pn.pane.HTML(f"<style>{CSS}</style><h1 class='nf' style='margin:4px 0'>ninefold</h1>"
                              f"<div style='font:12px system-ui;color:#666'>{esc(self.db)}</div>")
        return pn.Column(header, self.banner, pn.Row(self.job, self.step, self.job_b), self.tabs,
                         sizing_mode="stretch_width", css_classes=["nf-app"])


def make_app(db_path, store: UploadStore, writer: Writer, max_upload_bytes: int):
    """A function that builds one browser session's page."""

    def session():
        return Session(db_path, store, writer, max_upload_bytes).layout()

    return session
