"""Typed errors. The CLI turns each into one line naming the file and what is wrong."""


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
