"""Charts for the report and the calibration plot: matplotlib without pyplot or a display.

Figures come from matplotlib's object-oriented API (no global pyplot state), and text is drawn
as paths in SVG so that a chart needs no font where it is opened. CJK fonts are used after DejaVu
Sans where they are installed.
"""

from __future__ import annotations

import contextlib
import warnings

CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Droid Sans Fallback")


def new_figure(width: float, height: float):
    from matplotlib.figure import Figure  # lazy: only `simdb report` pays for importing matplotlib

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


@contextlib.contextmanager
def chart_style():
    """Text as paths, stable SVG ids, and CJK fonts after DejaVu Sans where installed (else boxes, quietly)."""
    import matplotlib
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    if not installed.intersection(CJK_FONTS):
        installed |= _fonts_installed_since_cached(font_manager)
    fonts = ["DejaVu Sans", *(name for name in CJK_FONTS if name in installed)]
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "simdb", "font.family": fonts}), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
        yield


def _fonts_installed_since_cached(font_manager) -> set[str]:
    """The names of system fonts matplotlib's cached font list does not know, now added to it.

    matplotlib lists the system's fonts once and caches the list on disk: a CJK font installed after
    that (``apt-get install fonts-wqy-microhei``) stays unknown to it, and Chinese is drawn as boxes.
    Fonts that cannot be read are left out."""
    manager = font_manager.fontManager
    known, before = {font.fname for font in manager.ttflist}, len(manager.ttflist)
    for path in font_manager.findSystemFonts():
        if path not in known:
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                manager.addfont(path)  # a font collection (.ttc) adds each of its faces
    return {font.name for font in manager.ttflist[before:]}
