"""Charts for the report and the calibration plot: matplotlib without pyplot or a display.

Figures come from matplotlib's object-oriented API (no global pyplot state), and text is drawn
as paths in SVG so that a chart needs no font where it is opened. A CJK font is used after DejaVu
Sans where one is installed, and the characters no font could draw are told, not drawn as boxes quietly.
"""

from __future__ import annotations

import contextlib
import re
import warnings

#: CJK fonts the charts draw Chinese (and Japanese, Korean) with, after DejaVu Sans, where installed: Linux's, then
#: macOS's and Windows'. Where none of them is, any font fontconfig says covers Chinese is used.
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Source Han Sans SC", "Noto Sans SC", "WenQuanYi Zen Hei",
             "WenQuanYi Micro Hei", "Droid Sans Fallback", "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei",
             "SimHei", "Arial Unicode MS")
#: matplotlib's warning for a character that no font in the list can draw (it draws a box instead).
_MISSING_GLYPH = re.compile(r"Glyph (\d+) .*missing from font")


def new_figure(width: float, height: float):
    from matplotlib.figure import Figure  # lazy: only `simdb report` pays for importing matplotlib

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


@contextlib.contextmanager
def chart_style():
    """Text as paths, stable SVG ids, and a CJK font after DejaVu Sans where one is installed.

    Yields a list that, once the block ends, holds the characters the charts drew as boxes because no
    font in use has them, each once; other warnings pass on as they were."""
    import matplotlib
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    if not installed.intersection(CJK_FONTS):
        installed |= _fonts_installed_since_cached(font_manager)
    cjk = [name for name in CJK_FONTS if name in installed] or _fontconfig_cjk(installed)
    style = {"svg.fonttype": "path", "svg.hashsalt": "simdb", "font.family": ["DejaVu Sans", *cjk]}
    missing: list[str] = []
    recorded: list[warnings.WarningMessage] = []
    with matplotlib.rc_context(style), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield missing
        recorded = caught
    for warning in recorded:  # outside catch_warnings, so that the others reach the caller's filters
        found = _MISSING_GLYPH.match(str(warning.message))
        if found is None:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        elif chr(int(found.group(1))) not in missing:
            missing.append(chr(int(found.group(1))))


def _fontconfig_cjk(installed: set[str]) -> list[str]:
    """The first font family that fontconfig says covers Chinese and matplotlib knows, or none."""
    import shutil
    import subprocess

    if shutil.which("fc-list") is None:
        return []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listed = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=10).stdout
        for line in sorted(listed.splitlines()):
            for family in line.split(","):
                if family.strip() in installed:
                    return [family.strip()]
    return []


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
