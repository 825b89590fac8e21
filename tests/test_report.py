"""`simdb report`: one self-contained HTML page, checked as text and rendered by headless Chromium."""

import base64
import csv
import html
import json
import math
import random
import re
import shutil
import subprocess
from collections import Counter, defaultdict
from html.parser import HTMLParser

import numpy as np
import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from simdb import Index
from simdb.diff import changes, diff
from simdb.report import COLORS
from simdb.samples import corpus

HEADINGS = ["Duplicate rate per batch", "Where each batch's duplicates come from", "Growth by batch",
            "Duplicates per batch", "Similarity of the stored pairs", "Lookup candidates of a sample", "Cluster sizes",
            "Largest clusters", "Pairs whose texts differ"]
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
    assert len(embedded_svgs(page)) == 6
    assert all(svg.startswith("<svg") and 'xmlns="http://www.w3.org/2000/svg"' in svg for svg in embedded_svgs(page))
    for heading in HEADINGS:
        assert f"<h2>{html.escape(heading)}</h2>" in page
    assert f"<dt>documents</dt><dd>{total:,}</dd><dt>batches</dt><dd>2</dd>" in page
    assert f"a random sample of {min(total, 2000):,} documents," in page
    assert "of them near-duplicates by the sketches (left of the dashed line)" in page
    assert "Not the stored pairs, but what a lookup reads" in page
    canonical = largest_cluster(admin_engine, schema)
    table = page[page.index("<h2>Largest clusters</h2>"):]
    assert table.index(f"<code>{html.escape(canonical)}</code>") < table.index("</tr>", table.index("<tbody>"))
    assert "&quot;source&quot;:&quot;python-reference:" in table  # metadata as compact, escaped JSON


def test_a_minhash_report_speaks_of_estimated_jaccard_similarity(run, tmp_path):
    """It said "bits" everywhere: SimHash's unit, not MinHash's; then "5 of 128 signature positions"."""
    ingest_two_batches(run, tmp_path, "--method", "minhash")
    page = write_report(run, tmp_path / "minhash.html")
    text = re.sub(r"<svg.*?</svg>|data:[^\"']*", "", page, flags=re.S)
    assert "bits" not in text
    assert ("Two documents are near-duplicates when they have an estimated Jaccard similarity of at least 0.805 "
            "(at most 25 of 128 signature positions differ).") in text
    assert re.search(r"; to its earliest near-duplicate: estimated Jaccard similarity (1\.000|0\.[89]\d\d)\) <code>",
                     text)  # a cluster member's


def test_an_exact_minhash_report_gives_the_jaccard_similarity_of_the_texts(database_url, schema):
    """It said "979 ten-thousandths of Jaccard distance": now "Jaccard similarity 0.9021", the texts' own,
    held to the shingles of the inputs (lower-case words: a shingle is three consecutive words)."""
    from simdb.report import build_report
    from tests.test_texts import generated, jaccard, shingles

    documents = generated(bases=6, variants=3)
    with Index.create(database_url, schema=schema, method="minhash", verify="exact") as index:
        index.add_many(documents, batch="one")
        page = build_report(index)
    text = re.sub(r"<svg.*?</svg>|data:[^\"']*", "", page, flags=re.S)
    assert "ten-thousandths" not in text
    assert "Two documents are near-duplicates when they have a Jaccard similarity of at least 0.8." in text
    sets = {d["id"]: shingles(d["text"]) for d in documents}
    shown = re.findall(r"<code>([^<]+)</code> \(earlier\) and <code>([^<]+)</code>: Jaccard similarity (0\.\d{4});",
                       text)
    assert len(shown) == 6
    for a, b, similarity in shown:  # exact to four decimals, rounded down (the stored distance is rounded up)
        assert similarity == f"{math.floor(jaccard(sets[a], sets[b]) * 10_000) / 10_000:.4f}", (a, b)


def test_report_for_one_batch(run, tmp_path, admin_engine, schema):
    ingest_two_batches(run, tmp_path)
    page = write_report(run, tmp_path / "second.html", "--batch", "second")
    assert "<dt>batch</dt><dd>second</dd>" in page
    assert "a random sample of " in page and " documents of batch <b>second</b>," in page
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
    result = run("report", "--batch", "nope", "--clusters-csv", str(tmp_path / "c.csv"),
                 "--output", str(tmp_path / "report.html"))
    assert result.exit_code == 1 and not (tmp_path / "c.csv").exists()  # nothing half-written


def test_report_options_that_cannot_work_are_one_line_errors_and_a_field_no_document_has_is_said(run, tmp_path):
    run("init")
    run("ingest", write_jsonl(tmp_path / "a.jsonl", [{"id": "a", "text": "some text", "source": "x"},
                                                     {"id": "b", "text": "some text", "lang": "en"}]), "--batch", "one")
    page = tmp_path / "report.html"
    result = run("report", "--clusters-csv", str(page), "--output", str(page))
    assert result.exit_code == 1 and result.output == (f"Error: --clusters-csv {page} is the same file as --output: "
                                                       "one would overwrite the other (choose another --clusters-csv "
                                                       "file)\n")
    result = run("report", "--by", " ", "--output", str(page))
    assert result.exit_code == 2 and "Invalid value for --by: give the name of a metadata field, e.g. --by source" \
                                      in result.output
    result = run("report", "--clusters-csv", str(tmp_path / "no" / "c.csv"), "--output", str(page))
    assert result.exit_code == 1 and result.output == (f"Error: {tmp_path / 'no' / 'c.csv'}: cannot write the "
                                                       "clusters CSV there: the folder does not exist (create the "
                                                       "folder, or choose another --clusters-csv file)\n")
    assert not page.exists()
    (tmp_path / "out").mkdir()
    result = run("report", "--by", "sorce", "--clusters-csv", str(tmp_path / "every cluster.csv"),
                 "--output", str(tmp_path / "out" / "report.html"))
    assert result.exit_code == 0
    assert result.stderr == ("warning: no document has the metadata field 'sorce' (fields of the first stored "
                             "documents: lang, source)\n")
    shown = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "No document has the metadata field <code>sorce</code>." in shown
    assert '<a href="../every%20cluster.csv">' in shown  # relative to the page, as a URL
    rows = list(csv.reader((tmp_path / "every cluster.csv").open(encoding="utf-8", newline="")))
    assert rows[0] == ["cluster_size", "canonical_id", "id", "batch", "stored_at", "duplicate_of", "distance",
                       "similarity", "metadata", "text"]
    assert [row[2] for row in rows[1:]] == ["a", "b"]


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
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/svg\+xml;base64,', dom)) == 6
    assert '<table class="clusters">' in dom

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


# -- what a lead asks first: rates, where duplicates come from, a breakdown, every cluster ----------------------


class Cells(HTMLParser):
    """The rows of every table of a page, by the table's class: each row its cells' text, headers included."""

    def __init__(self, page: str):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.rows: list[list[str]] | None = None
        self.cell: list[str] | None = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.rows = self.tables.setdefault(dict(attrs).get("class") or "", [])
        elif tag == "tr" and self.rows is not None:
            self.rows.append([])
        elif tag in ("td", "th") and self.rows is not None:
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "table":
            self.rows = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def table(page: str, css_class: str) -> list[dict[str, str]]:
    """A table of the page as {header: cell} rows."""
    header, *rows = Cells(page).tables[css_class]
    return [dict(zip(header, row)) for row in rows]


def planted_archive(seed: int = 38) -> list[tuple[str, str, int, dict]]:
    """(batch, external id, fingerprint, metadata) in input order: random fingerprints, and copies of earlier
    ones (of this batch or an earlier one) with 0 to 6 bits flipped, so that some are within k = 4 and some
    not; a "source" field with many values (one of them Chinese), missing or null in some documents."""
    rng = random.Random(seed)
    documents, number = [], 0
    for batch, size in (("first", 120), ("第二批", 90), ("third", 90)):
        for _ in range(size):
            if documents and rng.random() < 0.45:
                original = rng.choice(documents)[2]
                fingerprint = original
                for bit in rng.sample(range(64), rng.randint(0, 6)):
                    fingerprint ^= 1 << bit
            else:
                fingerprint = rng.getrandbits(64)
            draw = rng.random()
            metadata = ({} if draw < 0.1 else {"source": None} if draw < 0.15
                        else {"source": rng.choice(["feed-a", "feed-b", "新闻", "feed-c", "feed-d"])} if draw < 0.8
                        else {"source": f"rare-{number}"})
            documents.append((batch, f"doc-{number:03d}", fingerprint, metadata))
            number += 1
    return documents


def planted_oracle(documents, k: int) -> dict:
    """What the report must say, from the inputs alone: each document's earliest earlier document within k
    (in input order), the pairs by distance, and the clusters (connected components, canonical = earliest)."""
    earliest, pairs, parent = {}, Counter(), list(range(len(documents)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for j, (_, _, fingerprint, _) in enumerate(documents):
        for i in range(j):
            distance = bin(documents[i][2] ^ fingerprint).count("1")
            if distance <= k:
                earliest.setdefault(j, (i, distance))
                pairs[(documents[j][0], distance)] += 1
                ri, rj = root(i), root(j)
                parent[max(ri, rj)] = min(ri, rj)
    clusters = defaultdict(list)
    for i in range(len(documents)):
        clusters[root(i)].append(i)
    return {"earliest": earliest, "pairs": pairs, "clusters": {c: m for c, m in clusters.items() if len(m) > 1}}


@pytest.mark.citus
@pytest.mark.slow_on_citus
def test_rates_sources_breakdown_pairs_and_clusters_csv_are_the_oracles(run, tmp_path, database_url, schema,
                                                                       monkeypatch):
    """The numbers a lead asks for first, each held to what the inputs say: the duplicate rate per batch, the
    batches each batch duplicated, the rate by a metadata field (top values, other, none), the stored pairs
    by distance, and every cluster member in the CSV; and again for one batch."""
    from simdb import report
    from simdb.ingest import FingerprintedBatch
    from simdb.text import content_hash

    monkeypatch.setattr(report, "BY_VALUES", 3)
    monkeypatch.setattr(report, "SOURCE_COLUMNS", 1)  # the third batch's duplicates of the first are "other"
    documents = planted_archive()
    with Index.create(database_url, schema=schema) as index:
        k = index.settings.method.max_distance
        for name in dict.fromkeys(batch for batch, *_ in documents):
            chunk = FingerprintedBatch()
            for batch, external_id, fingerprint, metadata in documents:
                if batch == name:
                    chunk.append(external_id, fingerprint, content_hash(external_id), 10, metadata, external_id)
            index.add_fingerprinted(chunk, batch=name)
    oracle = planted_oracle(documents, k)
    batches = list(dict.fromkeys(batch for batch, *_ in documents))
    duplicates = {j for j in oracle["earliest"]}

    path, csv_path = tmp_path / "report.html", tmp_path / "clusters.csv"
    result = run("report", "--by", "source", "--clusters-csv", str(csv_path), "--output", str(path))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1].startswith(f"wrote {csv_path} (")
    page = path.read_text(encoding="utf-8")
    assert f"<dt>duplicates</dt><dd>{len(duplicates):,} ({100 * len(duplicates) / len(documents):.1f} % of the " \
           "documents)</dd>" in page

    # rate per batch and where the duplicates come from: the batch itself, the batch duplicated most, the rest
    rows = {row["batch"]: row for row in table(page, "batches")}
    assert list(rows) == batches
    flows = Counter((documents[j][0], documents[i][0]) for j, (i, _) in oracle["earliest"].items())
    most = max(Counter({source: n for (batch, source), n in flows.items() if batch != source}).items(),
               key=lambda item: (item[1], -batches.index(item[0])))[0]
    for batch in batches:
        members = [j for j, d in enumerate(documents) if d[0] == batch]
        found = [j for j in members if j in duplicates]
        row = rows[batch]
        assert (row["documents"], row["duplicates"]) == (f"{len(members):,}", f"{len(found):,}")
        assert row["rate"] == f"{100 * len(found) / len(members):.1f} %"
        assert row["within the batch"] == (f"{flows[(batch, batch)]:,}" if flows[(batch, batch)] else "")
        assert row[most] == (f"{flows[(batch, most)]:,}" if batch != most and flows[(batch, most)] else "")
        rest = sum(n for (b, source), n in flows.items() if b == batch and source not in (batch, most))
        assert row["other batches"] == (f"{rest:,}" if rest else "")

    # the rate by source: the 3 most frequent values, then the others together, then (none)
    def by_source(members: list[int]) -> list[list[str]]:
        values = Counter()
        for j in members:
            values[documents[j][3].get("source")] += 1
        ranked = sorted((value for value in values if value is not None), key=lambda v: (-values[v], v))

        def line(label, group):
            found = sum(1 for j in group if j in duplicates)
            return [label, f"{len(group):,}", f"{found:,}", f"{100 * found / len(group):.1f} %"]

        expected = [line(value, [j for j in members if documents[j][3].get("source") == value])
                    for value in ranked[:3]]
        if ranked[3:]:
            expected.append(line(f"other ({len(ranked) - 3:,} values)",
                                 [j for j in members if documents[j][3].get("source") in ranked[3:]]))
        if values[None]:
            expected.append(line("(none)", [j for j in members if documents[j][3].get("source") is None]))
        return expected

    def shown_by_source(page: str) -> list[list[str]]:
        return [[row["source"], row["documents"], row["duplicates"], row["rate"]]
                for row in table(page, "breakdown")]

    assert shown_by_source(page) == by_source(list(range(len(documents))))

    # the stored pairs by distance (in the chart's text alternative) and in all
    def pairs_shown(page: str) -> dict[int, int]:
        alt = re.search(r'<img alt="stored pairs: ([^"]*)"', page).group(1)
        return {int(d): int(n.replace(",", "")) for d, n in re.findall(r"(\d+) bits apart: ([\d,]+)", alt)}

    assert pairs_shown(page) == {d: sum(n for (_, dd), n in oracle["pairs"].items() if dd == d)
                                 for d in range(k + 1) if any(dd == d for _, dd in oracle["pairs"])}
    assert f"Every stored pair ({sum(oracle['pairs'].values()):,}: " in page

    # every cluster member, largest cluster first, with its earliest near-duplicate
    def members_shown() -> list[tuple]:
        with csv_path.open(encoding="utf-8", newline="") as file:
            shown = list(csv.DictReader(file))
        assert all(float(r["similarity"]) == pytest.approx(1 - int(r["distance"]) / 64, abs=5e-5)
                   for r in shown if r["distance"])
        return [(r["cluster_size"], r["canonical_id"], r["id"], r["batch"], r["duplicate_of"], r["distance"],
                 json.loads(r["metadata"])) for r in shown]

    def members(batch: str | None = None) -> list[tuple]:
        ranked = sorted(((canonical, members) for canonical, members in oracle["clusters"].items()
                         if batch is None or any(documents[j][0] == batch for j in members)),
                        key=lambda c: (-len(c[1]), c[0]))
        return [(str(len(members)), documents[canonical][1], documents[j][1], documents[j][0],
                 documents[oracle["earliest"][j][0]][1] if j in oracle["earliest"] else "",
                 str(oracle["earliest"][j][1]) if j in oracle["earliest"] else "", documents[j][3])
                for canonical, members in ranked for j in members]

    assert members_shown() == members()
    assert '<a href="clusters.csv">clusters.csv</a>' in page

    # one batch: its rows of the breakdown and its pairs; the batch table keeps every batch, this one marked
    result = run("report", "--batch", "第二批", "--by", "source", "--clusters-csv", str(csv_path),
                 "--output", str(tmp_path / "second.html"))
    assert result.exit_code == 0, result.output
    assert members_shown() == members("第二批")
    page = (tmp_path / "second.html").read_text(encoding="utf-8")
    second = [j for j, d in enumerate(documents) if d[0] == "第二批"]
    assert shown_by_source(page) == by_source(second)
    assert pairs_shown(page) == {d: n for (batch, d), n in oracle["pairs"].items() if batch == "第二批"}
    assert '<tr class="selected"><th>第二批</th>' in page and len(table(page, "batches")) == 3


# -- pairs whose texts differ, change by change -------------------------------------------------------------------


def test_a_one_character_change_at_distance_zero_is_shown_where_it_is(database_url, schema):
    """SimHash puts a one-character change in a long text at distance 0: the report showed only pairs at a
    distance above 0, so the pair was never shown though its texts differ; and in a long Chinese text the
    change could not be found. Pairs are chosen by their texts (content hashes), and each change is listed
    with its position, marked by colour and by [-…-] / {+…+}."""
    from simdb.report import build_report

    lines = [f"第{i}行：今天天气很好，我们去公园散步，然后去图书馆看书，晚上回家做饭。" for i in range(120)]
    text = "\n".join(lines)
    position = text.index("很好", text.index("第97行"))
    changed = text[:position] + "不" + text[position + 1:]
    with Index.create(database_url, schema=schema, store_text=True) as index:
        method = index.settings.method
        assert method.sketch(text) == method.sketch(changed)  # the sketches cannot tell them apart
        index.add_many([{"id": "a", "text": text}, {"id": "a-copy", "text": text}], batch="one")
        page = build_report(index)
        assert "No stored pair whose texts differ: every one of them is an exact copy (the same text)." in page
        index.add_many([{"id": "b", "text": changed}], batch="two")
        page = build_report(index)
        only_copies = build_report(index, "one")
    pairs = page[page.index("<h2>Pairs whose texts differ</h2>"):]
    assert "<code>a</code> (earlier) and <code>b</code>: 0 bits apart; 1 change, 1 character removed and 1 " \
           "added." in pairs
    assert "<code>a</code> (earlier) and <code>a-copy</code>" not in pairs  # an exact copy is no pair to look at
    line = text[:position].count("\n") + 1
    assert (f'<td class="where">character {position + 1:,}<br>line {line}</td><td class="change">…'
            f'{html.escape(text[position - 40:position])}<del><span class="mark">[-</span>很<span class="mark">-]'
            f'</span></del><ins><span class="mark">{{+</span>不<span class="mark">+}}</span></ins>'
            f'{html.escape(text[position + 1:position + 41])}…</td>').replace("\n", "↵") in pairs
    style = page[page.index("<style>"):page.index("</style>")]
    assert re.search(r"del \{[^}]*text-decoration: line-through", style)  # what the caption says is struck is
    assert "No stored pair found when batch <b>one</b> was ingested whose texts differ" in only_copies


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


# -- fonts: the page's stack falls back to CJK fonts, and the charts say what they could not draw ---------------


def test_characters_the_charts_cannot_draw_are_said_in_the_page_and_on_stderr(run, tmp_path, monkeypatch):
    """Without a CJK font, a Chinese batch name was drawn as boxes in the charts, silently."""
    from simdb import charts

    monkeypatch.setattr(charts, "CJK_FONTS", ())  # a machine without any CJK font
    monkeypatch.setattr(charts, "_fontconfig_cjk", lambda installed: [])
    run("init")
    records = list(corpus())[:40]
    assert run("ingest", write_jsonl(tmp_path / "a.jsonl", records), "--batch", "二月").exit_code == 0
    result = run("report", "--output", str(tmp_path / "report.html"))
    assert result.exit_code == 0, result.output
    warning = ("warning: the charts draw 2 characters as boxes, as no installed font has them: 二 月; install a CJK "
               "font (Debian: apt-get install fonts-wqy-microhei; or Noto Sans CJK) and write the report again\n")
    assert result.stderr == warning
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert f'<p class="note" role="note">{html.escape(warning[9].upper() + warning[10:-1])}.</p>' in page


def test_the_page_names_cjk_fonts_and_its_charts_draw_chinese_where_a_font_exists(run, tmp_path):
    from simdb.charts import CJK_FONTS, chart_style

    run("init")
    records = list(corpus())[:40]
    assert run("ingest", write_jsonl(tmp_path / "a.jsonl", records), "--batch", "二月").exit_code == 0
    result = run("report", "--output", str(tmp_path / "report.html"))
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    body_fonts = re.search(r"body \{ font-family: ([^;]*);", page).group(1)
    for font in ("Noto Sans CJK SC", "PingFang SC", "Microsoft YaHei", "WenQuanYi Micro Hei"):
        assert f'"{font}"' in body_fonts
    assert body_fonts.endswith("sans-serif")
    with chart_style():
        import matplotlib

        drawn_with = set(matplotlib.rcParams["font.family"])
    if not drawn_with & set(CJK_FONTS):
        pytest.skip(f"no CJK font installed (one of {', '.join(CJK_FONTS)}; Debian: apt-get install "
                    "fonts-wqy-microhei, which scripts/test does as root)")
    assert result.stderr == "" and 'class="note"' not in page


# -- rendered in Chromium: nothing wider than the page, no boxes for Chinese where a CJK font exists --------------

#: Run in the rendered page (a copy of the report with it added): every <details> opened, then every element
#: whose box reaches past the page's sides, outside a box that scrolls (a wide table scrolls inside its own box,
#: which is itself measured), and every Han character of the page's text that its fonts draw as the box of a
#: character no font has (U+10FFFD), or not at all; written into the DOM for --dump-dom.
MEASURE = r"""<script>
for (const d of document.querySelectorAll('details')) d.open = true;
const page = document.documentElement.clientWidth, wide = [];
function clipped(el) {
  for (let p = el.parentElement; p && p !== document.body; p = p.parentElement)
    if (getComputedStyle(p).overflowX !== 'visible') return true;
  return false;
}
for (const el of document.body.querySelectorAll('*')) {
  const r = el.getBoundingClientRect();
  if ((r.width || r.height) && !clipped(el) && (r.left < -0.5 || r.right > page + 0.5))
    wide.push(`${el.tagName}.${el.className} ${Math.round(r.left)}..${Math.round(r.right)}: `
              + (el.textContent || '').slice(0, 50));
}
function ink(ch, family) {
  const c = document.createElement('canvas'); c.width = 48; c.height = 48;
  const x = c.getContext('2d'); x.font = `32px ${family}`; x.textBaseline = 'top'; x.fillText(ch, 4, 4);
  return Array.from(x.getImageData(0, 0, 48, 48).data.filter((_, i) => i % 4 === 3), a => a > 96 ? 1 : 0).join('');
}
const fonts = [...new Set([...document.querySelectorAll('body, code, .text, td, th')].map(
  el => getComputedStyle(el).fontFamily))];
const han = [...new Set(document.body.innerText.match(/\p{Script=Han}/gu) || [])], boxes = [];
for (const family of fonts) {
  const box = ink('\u{10FFFD}', family);
  if (ink('\u{10FFFC}', family) !== box) boxes.push('the test cannot tell a box: ' + family);
  for (const ch of han) { const drawn = ink(ch, family); if (drawn === box || !drawn.includes('1')) boxes.push(ch); }
}
document.body.setAttribute('data-measured', JSON.stringify({page, scroll: document.documentElement.scrollWidth,
                                                            wide, han: han.length, boxes}));
</script>"""


def hard_to_lay_out(corpus_records) -> list[dict]:
    """Texts that overflowed the page: a line of box-drawing characters and a long token (neither can wrap at
    a space), long Chinese text with a one-character change, a long metadata value; and Chinese sources."""
    box = "┌" + "─" * 3000 + "┐\n│ 表格 │\n└" + "─" * 3000 + "┘\n"
    token = "abc" * 1200
    chinese = "\n".join(f"第{i}行：今天天气很好，我们去公园散步，然后去图书馆看书，晚上回家做饭。" for i in range(150))
    position = chinese.index("很好", chinese.index("第97行"))
    records = [dict(r, source=r["source"].split(":")[0]) for r in corpus_records]
    return records + [
        {"id": "box", "text": box + chinese, "source": "新闻"},
        {"id": "box-changed", "text": box.replace("表格", "表单") + chinese[:position] + "不" + chinese[position + 1:],
         "source": "微博"},
        {"id": "token", "text": f"{token}\n{corpus_records[0]['text']}", "source": "s" * 400},
        {"id": "token-changed", "text": f"{token}x\n{corpus_records[0]['text']}", "source": "新闻"}]


@pytest.mark.slow
@pytest.mark.parametrize("init", [["--method", "minhash", "--verify", "exact"], ["--store-text"]],
                         ids=["minhash-exact", "simhash"])
def test_nothing_is_wider_than_the_page_and_chinese_is_no_boxes_in_chromium(run, tmp_path, init):
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    records = hard_to_lay_out([r for r in corpus() if "copy_of" not in r][:60])  # these four are the pairs
    assert run("init", *init).exit_code == 0
    for name, part in (("第一批", records[:40]), ("batch-" + "x" * 120, records[40:])):
        assert run("ingest", write_jsonl(tmp_path / "in.jsonl", part), "--batch", name).exit_code == 0
    page = write_report(run, tmp_path / "report.html", "--by", "source")
    assert "<code>box</code> (earlier) and <code>box-changed</code>" in page  # the hard texts are in the page
    assert "<code>token</code> (earlier) and <code>token-changed</code>" in page
    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</body>", MEASURE + "\n</body>"), encoding="utf-8")
    for width in (1280, 800):
        dom = chromium(tmp_path, "--dump-dom", f"--window-size={width},2000", measured.as_uri()).stdout
        found = json.loads(html.unescape(re.search(r'data-measured="([^"]*)"', dom).group(1)))
        assert found["page"] > 0.9 * width - 40
        assert found["wide"] == [] and found["scroll"] <= found["page"], (width, found["wide"])
        assert found["han"] > 20
        cjk = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True).stdout.strip() \
            if shutil.which("fc-list") else ""
        if cjk:  # where a CJK font exists, no Chinese character is a box: not in the page, not in a chart
            assert found["boxes"] == [], found["boxes"]
            assert 'class="note"' not in page
