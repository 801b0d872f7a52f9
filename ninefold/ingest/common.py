"""Small helpers the loaders share."""
import re
from pathlib import Path

from ninefold.store.errors import TraceFormatError


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


def nested_too_deep(what: str = "JSON") -> str:
    """The one-line reason for a WHAT document nested deeper than Python's parser goes (it recurses once per
    level, so its reach is the interpreter's recursion limit less the frames already on the stack)."""
    import sys

    depth, f = 0, sys._getframe()
    while f is not None:
        depth, f = depth + 1, f.f_back
    return f"{what} nested deeper than {sys.getrecursionlimit() - depth} levels"


def load_json(data, path, where=None, repair: bool = False):
    """json.loads(DATA) (with lone surrogates repaired when REPAIR); a document nested deeper than the parser
    goes is a one-line TraceFormatError naming PATH, not a RecursionError. Other parse errors pass through."""
    import json

    try:
        doc = json.loads(data)
        return repair_strings(doc) if repair else doc
    except RecursionError:
        raise TraceFormatError(path, where, nested_too_deep()) from None
