"""`simdb report`: one self-contained HTML page, checked as text and rendered by headless Chromium."""

import base64
import html
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from simdb.diff import changes, diff
from simdb.report import COLORS
from simdb.samples import corpus

HEADINGS = ["Growth by batch", "Duplicates per batch", "Hamming distances among candidate pairs", "Cluster sizes",
            "Largest clusters", "Pairs side by side"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = ("headless Chromium is not installed: install the Debian packages chromium and chromium-driver "
               "(apt-get install chromium chromium-driver; scripts/test does it when run as root)")


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return str(path)


def ingest_two_batches(run, tmp_path, *init) -> int:
    records = list(corpus())
    assert run("init", *init).exit_code == 0
    for name, part in (("first", records[:200]), ("second", records[200:])):
        result = run("ingest", write_jsonl(tmp_path / f"{name}.jsonl", part), "--batch", name)
        assert result.exit_code == 0, result.output
    return len(records)


def write_report(run, path, *options) -> str:
    result = run("report", *options, "--output", str(path))
    assert result.exit_code == 0, result.output
    assert re.fullmatch(rf"wrote {re.escape(str(path))} \((\d+) KB\)\n", result.output)
    size = int(re.search(r"\((\d+) KB\)", result.output).group(1))
    assert abs(size - path.stat().st_size / 1024) <= 1
    return path.read_text(encoding="utf-8")


def embedded_svgs(page: str) -> list[str]:
    return [base64.b64decode(data).decode("utf-8")
            for data in re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', page)]


def external_references(page: str) -> list[str]:
    """Anything in the page or its embedded SVGs that would reach outside the file.

    XML namespace names (xmlns="http://www.w3.org/2000/svg") are identifiers, never fetched, so they are allowed.
    """
    found = []
    for document in [page, *embedded_svgs(page)]:
        found += re.findall(r"https?://[^\s\"'<>)]*", re.sub(r"\sxmlns(:\w+)?=\"[^\"]*\"", "", document))
        found += re.findall(r"(?:src|href)\s*=\s*[\"'](?!data:|#)[^\"']*[\"']", document)
        found += re.findall(r"url\(\s*[\"']?(?!data:|#)[^)]*\)", document)
        found += re.findall(r"@import|<script|<link|<iframe|<object|<embed", document, flags=re.I)
    return found


def largest_cluster(admin_engine, schema, batch=None) -> str:
    scope = (f"WHERE cluster_id IN (SELECT d.cluster_id FROM {schema}.documents d JOIN {schema}.batches b "
             "ON b.id = d.batch_id WHERE b.name = :batch)") if batch else ""
    with admin_engine.connect() as connection:
        return connection.execute(sa.text(
            f"SELECT canonical_id FROM {schema}.duplicate_clusters {scope} ORDER BY size DESC, cluster_id LIMIT 1"),
            {"batch": batch}).scalar_one()


def test_report_is_one_self_contained_page(run, tmp_path, admin_engine, schema):
    total = ingest_two_batches(run, tmp_path)
    page = write_report(run, tmp_path / "report.html")
    assert external_references(page) == []
    assert len(embedded_svgs(page)) == 4
    assert all(svg.startswith("<svg") and 'xmlns="http://www.w3.org/2000/svg"' in svg for svg in embedded_svgs(page))
    for heading in HEADINGS:
        assert f"<h2>{heading}</h2>" in page
    assert f"<dt>documents</dt><dd>{total:,}</dd><dt>batches</dt><dd>2</dd>" in page
    assert f"A random sample of {min(total, 2000):,} documents," in page
    assert "within k = 4 (left of the dashed line)" in page
    canonical = largest_cluster(admin_engine, schema)
    table = page[page.index("<h2>Largest clusters</h2>"):]
    assert table.index(f"<code>{html.escape(canonical)}</code>") < table.index("</tr>", table.index("<tbody>"))
    assert "&quot;source&quot;:&quot;python-reference:" in table  # metadata as compact, escaped JSON


def test_a_minhash_report_speaks_of_signature_positions(run, tmp_path):
    """It said "bits" everywhere: SimHash's unit, not MinHash's."""
    ingest_two_batches(run, tmp_path, "--method", "minhash")
    page = write_report(run, tmp_path / "minhash.html")
    text = re.sub(r"<svg.*?</svg>|data:[^\"']*", "", page, flags=re.S)
    assert "bits" not in text
    assert "near-duplicates are within 25 of 128 signature positions of an earlier document" in text
    assert " of 128 signature positions) <code>" in text  # a cluster member's distance


def test_report_for_one_batch(run, tmp_path, admin_engine, schema):
    ingest_two_batches(run, tmp_path)
    page = write_report(run, tmp_path / "second.html", "--batch", "second")
    assert "<dt>batch</dt><dd>second</dd>" in page
    assert "A random sample of " in page and " documents of batch <b>second</b>," in page
    assert "Clusters that include a document of batch <b>second</b>" in page
    assert f"<code>{html.escape(largest_cluster(admin_engine, schema, 'second'))}</code>" in page
    rows = re.findall(r"<tr><td class=\"num\">.*?</tr>", page)
    assert rows and all(re.search(r"<td>[^<]*\bsecond\b[^<]*</td>", row) for row in rows)
    assert external_references(page) == []


def test_empty_index_says_there_is_nothing_yet(run, tmp_path):
    run("init")
    page = write_report(run, tmp_path / "empty.html")
    assert "Nothing to report yet: the index has no documents." in page
    assert "<img" not in page and external_references(page) == []


def test_unknown_batch_is_a_one_line_error(run, tmp_path):
    run("init")
    run("ingest", write_jsonl(tmp_path / "a.jsonl", [{"id": "a", "text": "some text"}]), "--batch", "one")
    result = run("report", "--batch", "nope", "--output", str(tmp_path / "report.html"))
    assert result.exit_code == 1
    assert result.output == "Error: no batch named 'nope'; `simdb stats` lists the batches\n"
    assert not (tmp_path / "report.html").exists()
    assert run("report", "--batch", "one").exit_code == 2  # --output is required


def chromium(tmp_path, *arguments) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'chromium-profile'}", *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


@pytest.mark.slow
def test_report_renders_in_headless_chromium(run, tmp_path):
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    from PIL import Image  # matplotlib depends on Pillow

    ingest_two_batches(run, tmp_path)
    path = tmp_path / "report.html"
    write_report(run, path)

    dom = chromium(tmp_path, "--dump-dom", path.as_uri()).stdout
    assert [html.unescape(h) for h in re.findall(r"<h2>(.*?)</h2>", dom)] == HEADINGS
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/svg\+xml;base64,', dom)) == 4
    assert "<table>" in dom

    screenshot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={screenshot}", "--window-size=1200,3000", path.as_uri())
    image = Image.open(screenshot).convert("RGB")
    assert image.size == (1200, 3000)
    pixels = np.asarray(image, dtype=np.int16).reshape(-1, 3)
    assert (pixels != 255).any(axis=1).sum() > len(pixels) // 10, "the screenshot is (nearly) blank"

    def near(color: str) -> int:
        wanted = np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)])
        return int((np.abs(pixels - wanted) <= 8).all(axis=1).sum())

    # the charts' fills are on screen: the SVG images were decoded and drawn, not replaced by their alt text
    for name in ("added", "new", "near", "within_batch", "histogram", "clusters"):
        assert near(COLORS[name]) > 500, f"no {name} bars ({COLORS[name]}) in the screenshot"


def test_a_cjk_font_installed_after_matplotlib_cached_its_font_list_is_used(monkeypatch):
    """matplotlib caches the system's font list on disk once: a CJK font installed later (as scripts/test
    does, after earlier runs built the cache) was never used, and Chinese came out as boxes."""
    import matplotlib
    from matplotlib import font_manager

    from simdb.charts import CJK_FONTS, chart_style

    # the cached list as it was before the font was installed: without any face of a CJK font's file
    cjk_files = {font.fname for font in font_manager.fontManager.ttflist if font.name in CJK_FONTS}
    stale = [font for font in font_manager.fontManager.ttflist if font.fname not in cjk_files]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", stale)
    on_disk = set()
    for path in font_manager.findSystemFonts():
        try:
            on_disk.add(font_manager.ttfFontProperty(font_manager.get_font(path)).name)
        except (OSError, RuntimeError, ValueError):
            continue
    if not on_disk & set(CJK_FONTS):
        pytest.skip(f"no CJK font installed (one of {', '.join(CJK_FONTS)}; Debian: apt-get install "
                    "fonts-wqy-microhei, which scripts/test does as root)")
    with chart_style():
        families = list(matplotlib.rcParams["font.family"])
    assert set(families) & set(CJK_FONTS)


def test_chinese_labels_are_drawn_with_a_cjk_font_where_one_is_installed():
    """Batch names and clusters' texts in Chinese were drawn as boxes: the charts' fonts must hold the glyphs.
    scripts/test installs fonts-wqy-microhei on Debian; elsewhere the test says what is missing."""
    import matplotlib
    from matplotlib.font_manager import FontProperties, findfont, fontManager, get_font

    from simdb.charts import CJK_FONTS, chart_style

    with chart_style():
        families = list(matplotlib.rcParams["font.family"])
    installed = {font.name for font in fontManager.ttflist} & set(CJK_FONTS)
    assert installed <= set(families)  # every installed CJK font is used
    if not installed:
        pytest.skip(f"no CJK font installed (one of {', '.join(CJK_FONTS)}; Debian: apt-get install "
                    "fonts-wqy-microhei, which scripts/test does as root)")
    fonts = [get_font(findfont(FontProperties(family=name), fallback_to_default=False)) for name in families]
    for character in "批次中文简体繁體":
        assert any(font.get_char_index(ord(character)) for font in fonts), character


@given(st.text("ab\n中", max_size=30), st.text("ab\n中", max_size=30), st.integers(0, 3))
def test_each_change_is_where_it_says_in_both_texts(a, b, join):
    found = changes(diff(a, b), context=4, join=join)
    assert all(c.removed or c.added for c in found)
    rebuilt, end = "", 0
    for change in found:
        assert a[change.a_offset:change.a_offset + len(change.removed)] == change.removed
        assert b[change.b_offset:change.b_offset + len(change.added)] == change.added
        assert change.a_line == a[:change.a_offset].count("\n") + 1
        assert change.b_line == b[:change.b_offset].count("\n") + 1
        assert a[:change.a_offset].endswith(change.before) and len(change.before) <= 4
        assert a[change.a_offset + len(change.removed):].startswith(change.after) and len(change.after) <= 4
        rebuilt += a[end:change.a_offset] + change.added
        end = change.a_offset + len(change.removed)
    assert rebuilt + a[end:] == b  # the changes, applied to the earlier text, give the later one
