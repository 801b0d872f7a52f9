"""Small helpers the text and dump loaders share."""
from pathlib import Path

from store.errors import TraceFormatError


def read_nonempty(path) -> bytes:
    """The file's bytes; a one-line error for an unreadable or empty (whitespace only) file."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TraceFormatError(path, None, f"cannot read: {e.strerror}") from None
    if not data.strip():
        raise TraceFormatError(path, None, "empty file")
    return data
