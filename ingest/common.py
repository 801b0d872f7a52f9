"""Small helpers the loaders share."""
import re
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


_SURROGATE = re.compile("[\ud800-\udfff]")


def repair_strings(x):
    """Lone UTF-16 surrogates (valid JSON escapes, not storable text) become U+FFFD, in keys and values of
    parsed JSON."""
    if isinstance(x, str):
        return _SURROGATE.sub("\ufffd", x) if _SURROGATE.search(x) else x
    if isinstance(x, dict):
        return {repair_strings(k): repair_strings(v) for k, v in x.items()}
    if isinstance(x, list):
        return [repair_strings(v) for v in x]
    return x
