"""JSON lines out: one object per line, readable by any line splitter.

``json.dumps(..., ensure_ascii=False)`` keeps non-ASCII text readable but leaves U+0085, U+2028 and
U+2029 raw inside strings, and ``str.splitlines()`` (and some other readers) end a line at each of
them. They are escaped here, which is still the same JSON.
"""

from __future__ import annotations

import json

_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def dumps(value, **options) -> str:
    """``value`` as one line of JSON (without the newline), non-ASCII text kept as it is."""
    return json.dumps(value, ensure_ascii=False, **options).translate(_LINE_BREAKS)
