"""Typed errors. The CLI turns each into one line naming the file and what is wrong."""
import errno
import os
import re


class NinefoldError(Exception):
    """Base of every error the library raises on purpose."""


class TraceFormatError(NinefoldError):
    """A trace file that cannot be read as what it claims to be."""

    def __init__(self, path, where, reason):
        self.path = str(path)
        self.where = where
        self.reason = reason
        loc = f" at {where}" if where else ""
        super().__init__(f"{self.path}{loc}: {reason}")


class IngestConflict(NinefoldError):
    """A file that would overwrite data already stored (another file claims the same rank)."""

    def __init__(self, path, reason):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class DiskFull(NinefoldError):
    """A write that found no room: the device of PATH is full (or the file hit the size limit the process may
    write). WHAT says what was being written; the transaction it belonged to was rolled back."""

    def __init__(self, path, what: str, detail: str = "no space left on device"):
        self.path = str(path) if path else None
        self.what = what
        self.disk = _mount_of(self.path) if self.path else None
        disk = f" ({self.disk})" if self.disk else ""
        to = f" to {self.path}" if self.path else ""
        super().__init__(f"disk full: {detail}{disk} while writing {what}{to}")


def _mount_of(path: str) -> str:
    """The mount point of PATH's device: the disk that is full."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


_NO_ROOM = {errno.ENOSPC: "no space left on device", errno.EFBIG: "file too large for this process"}
_NO_ROOM_TEXT = {"no space left on device": errno.ENOSPC, "file too large": errno.EFBIG}


def disk_full(e: BaseException | None, path, what: str) -> DiskFull | None:
    """E as a DiskFull when it says a write found no room (an OSError with ENOSPC/EFBIG, or a DuckDB error whose
    text carries that errno's message); else None. PATH is the file blamed when E names none."""
    seen = set()
    while e is not None and id(e) not in seen:    # a later error (a statement on the aborted transaction) can
        seen.add(id(e))                           # hide the write that failed: look down the chain
        code = getattr(e, "errno", None)
        if code not in _NO_ROOM:
            low = str(e).lower()
            code = next((c for t, c in _NO_ROOM_TEXT.items() if t in low), None)
        if code is not None:
            break
        e = e.__cause__ or e.__context__
    else:
        return None
    named = getattr(e, "filename", None)
    if not named:
        m = re.search(r'file \\?"([^"\\]+)\\?"', str(e), re.IGNORECASE)   # quoted, or escaped in JSON
        named = m.group(1) if m else None
    return DiskFull(named or path, what, _NO_ROOM[code])
