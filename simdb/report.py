"""``simdb report``: one self-contained HTML page about an index.

The page answers a lead's questions first: the share of each batch's documents that duplicate an
earlier document, which batches each batch duplicated, and (``by``) the duplicate rate for each value
of a metadata field. Then the archive's growth by batch, the duplicates each batch brought (new /
exact / near, and against the archive / within the batch), the similarity of the stored pairs, the
distances between a sample of documents and their lookup candidates (what the block or band keys
bring back: where the threshold sits among them), the cluster-size distribution and the largest
clusters with sample members, and, where the index keeps texts, the least similar pairs whose texts
differ, change by change, with where each change is (:mod:`simdb.diff`). Every number is read by SQL
over the stored tables (:func:`simdb.pg.reads.report_data`), set-based.

Charts are drawn with matplotlib's object-oriented API (no pyplot state, no display needed) as SVG with
text drawn as paths, and embedded as ``data:`` images, so the file needs nothing but itself to open: no
network, fonts, scripts or style sheets; the page's own text names a font stack that falls back to
the CJK fonts of each system. A character no installed font can draw in a chart is said, in the page
and through ``warn``. Every value read from the database is escaped with :func:`html.escape`, and
``$`` in batch names is escaped for matplotlib's mathtext.

With ``batch``, the distance sample, the stored pairs, the breakdown and the cluster sections only
consider documents of that batch (clusters that include one of them), and the batch is marked in the
per-batch charts and table, which keep every batch for context. The clusters CSV, written with the
page where asked, holds every cluster's members: the way into the clusters beyond the largest ten.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timezone
from string import Template
from typing import BinaryIO

from .charts import chart_style, new_figure
from .diff import Change, changed_characters, changes, diff, elided
from .methods import Method
from .pg import catalog, reads
from .pg.database import translating

#: Documents whose candidates are measured for the distance histogram, and its most bars.
SAMPLE_SIZE = 2000
HISTOGRAM_BARS = 130
#: Clusters listed in the table, and sample members shown per cluster.
LARGEST_CLUSTERS = 10
MEMBERS_SHOWN = 3
#: Pairs shown with their differences (where the index keeps texts), and how much of each text.
PAIRS_SHOWN = 6
TEXT_CHARS = 50_000
DIFF_CONTEXT = 120
#: Changes listed for each pair, the unchanged characters shown on each side of one, and the most characters of
#: a removal or an addition shown in the list (its beginning and its end; both texts show it whole).
CHANGES_SHOWN = 12
CHANGE_CONTEXT = 40
CHANGE_CHARS = 240
SAMPLE_TEXT_CHARS = 240
METADATA_CHARS = 160
#: Values of the ``by`` field shown, most frequent first (the rest are one row), and their longest shown form.
BY_VALUES = 20
VALUE_CHARS = 80
#: Batches shown as rows of the batch table (the latest), and as its columns (those most duplicated).
BATCH_ROWS = 60
SOURCE_COLUMNS = 10
#: Characters of each member's text in the clusters CSV.
CSV_TEXT_CHARS = 200
COLORS = {"before": "#c9d6e3", "added": "#2b6cb0", "new": "#9db4cc", "exact": "#c0392b", "near": "#e67e22",
          "against_archive": "#6c3483", "within_batch": "#27ae60", "histogram": "#2b6cb0", "threshold": "#c0392b",
          "clusters": "#6c3483", "mark": "#111111", "rate": "#d35400", "pairs": "#1f7a8c"}
FONT_ADVICE = ("install a CJK font (Debian: apt-get install fonts-wqy-microhei; or Noto Sans CJK) and write the "
               "report again")
#: The page's fonts: each system's own, then the CJK fonts of Linux, macOS and Windows, so that Chinese finds a
#: font wherever one is installed.
CJK_STACK = ('"Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei", '
             '"WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Droid Sans Fallback"')

PAGE = Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>simdb report: $schema</title>
<style>
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Arial, $cjk, sans-serif; color: #1a202c;
       max-width: 1140px; margin: 24px auto; padding: 0 16px; line-height: 1.45; }
h1 { font-size: 26px; margin-bottom: 4px; } h2 { font-size: 20px; margin-top: 36px;
     border-bottom: 1px solid #cbd5e0; padding-bottom: 4px; }
dl { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 2px 16px; margin: 12px 0; }
dt { font-weight: 600; } dd { margin: 0; }
dd, td, th, li, p, summary { overflow-wrap: anywhere; }
img { width: 100%; height: auto; display: block; }
.caption { color: #4a5568; font-size: 14px; margin: 4px 0 0; }
.scroll { overflow-x: auto; }
.empty { padding: 24px; background: #f7fafc; border: 1px dashed #a0aec0; font-size: 18px; }
.note { padding: 8px 12px; background: #fffbea; border: 1px solid #d69e2e; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border: 1px solid #e2e8f0; padding: 4px 6px; text-align: left; vertical-align: top; }
th { background: #edf2f7; } td.num { text-align: right; white-space: nowrap; }
thead th { overflow-wrap: normal; } th.size { width: 3.5em; } th.id { width: 9em; } th.seen { width: 6.5em; }
tr.selected th, tr.selected td { font-weight: 700; background: #fefcbf; }
code { font-family: "DejaVu Sans Mono", Menlo, Consolas, "Noto Sans Mono CJK SC", $cjk, monospace; font-size: 12px;
       word-break: break-all; }
ul.members { margin: 0; padding-left: 16px; }
.bar { display: inline-block; height: 10px; background: #d35400; vertical-align: middle; }
del { background: #fed7d7; color: #742a2a; text-decoration: line-through; text-decoration-color: #c53030; }
ins { background: #c6f6d5; color: #22543d; text-decoration: underline; text-decoration-color: #2f855a; }
.mark { display: inline-block; font-weight: 700; color: #4a5568; }
.pair { margin: 18px 0; } .pair p { margin: 4px 0; }
td.where { white-space: nowrap; width: 11em; }
.change, .text { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 13px; }
.texts { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 12px; margin-top: 6px; }
.text { border: 1px solid #e2e8f0; padding: 6px; }
</style>
</head>
<body>
<h1>simdb report</h1>
<dl>$header</dl>
$body
</body>
</html>
""")

Warn = Callable[[str], None]


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _utc(moment: datetime) -> str:
    return f"{moment.astimezone(timezone.utc):%Y-%m-%d %H:%M}"


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def _label(name: str, width: int = 18) -> str:
    """A batch name for a chart: shortened, and with ``$`` escaped so matplotlib never reads it as mathtext."""
    name = name if len(name) <= width else name[:width - 1] + "…"
    return name.replace("$", r"\$")


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _embed(figure, alt: str) -> str:
    """The figure as an <img> with an SVG data: URI (each chart its own document, so ids never collide)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buffer.getvalue().decode("utf-8")
    svg = svg[svg.index("<svg"):]  # drop the XML declaration and the DOCTYPE (which names a DTD URL)
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/svg+xml;base64,{data}">'


def _scrolling(table: str) -> str:
    """A table in a box of the page's width: where its columns cannot all fit, it scrolls inside the box."""
    return f'<div class="scroll">{table}</div>'


def _section(title: str, content: str, caption: str) -> str:
    return f"<h2>{_e(title)}</h2>\n{content}\n<p class=\"caption\">{caption}</p>"


def _mark_batch(axes, names: list[str], batch: str | None) -> None:
    """Thin the x labels when there are many batches; make the selected batch's label bold."""
    step = max(1, len(names) // 30)
    positions = [i for i in range(len(names)) if i % step == 0 or names[i] == batch]
    axes.set_xticks(positions, [_label(names[i]) for i in positions], rotation=30 if len(names) > 6 else 0,
                    ha="right" if len(names) > 6 else "center")
    for tick, i in zip(axes.get_xticklabels(), positions):
        if names[i] == batch:
            tick.set_fontweight("bold")
            tick.set_color(COLORS["mark"])
    if batch in names:
        axes.axvspan(names.index(batch) - 0.5, names.index(batch) + 0.5, color="#f6e05e", alpha=0.35, zorder=0)


def _legend(axes) -> None:
    axes.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncols=3, frameon=False, fontsize=10)


def _count_axis(axes) -> None:
    """Whole numbers only, with thousands separators."""
    from matplotlib.ticker import MaxNLocator

    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.yaxis.set_major_formatter("{x:,.0f}")


def _log_counts(axes, label: str) -> None:
    """Log-scale counts with plain tick labels (1, 10, 100, 1,000)."""
    from matplotlib.ticker import NullFormatter

    axes.set_yscale("log")
    axes.set_ylim(bottom=0.7)
    axes.yaxis.set_major_formatter("{x:,.0f}")
    axes.yaxis.set_minor_formatter(NullFormatter())
    axes.set_ylabel(label)


def _rates(batches, batch: str | None) -> str:
    """The share of each batch's stored documents that have an earlier near-duplicate, in percent."""
    names = [row.name for row in batches]
    rates = [_percent(row.duplicates, row.stored) for row in batches]
    figure = new_figure(11, 3.0)
    axes = figure.subplots()
    bars = axes.bar(range(len(names)), rates, color=COLORS["rate"])
    if len(names) <= 24:
        axes.bar_label(bars, [f"{rate:.1f} %" for rate in rates], fontsize=9, padding=2)
    axes.set_ylim(0, max(max(rates) * 1.2, 1))
    axes.yaxis.set_major_formatter("{x:g} %")
    axes.set_ylabel("duplicates, % of the batch")
    _mark_batch(axes, names, batch)
    stored, duplicates = sum(row.stored for row in batches), sum(row.duplicates for row in batches)
    caption = (f"The share of each batch's stored documents that duplicate an earlier document (exactly or "
               f"nearly): {duplicates:,} of {stored:,} documents in all ({_percent(duplicates, stored):.1f} %). "
               "The table below gives the numbers and where each batch's duplicates first appeared.")
    alt = "duplicate rate per batch: " + ", ".join(f"{name} {rate:.1f} %" for name, rate in zip(names, rates))
    return _section("Duplicate rate per batch", _embed(figure, _short(alt, 2000)), caption)


def _growth(batches, batch: str | None) -> str:
    names = [row.name for row in batches]
    added = [row.stored for row in batches]
    before = [sum(added[:i]) for i in range(len(added))]
    figure = new_figure(11, 3.6)
    axes = figure.subplots()
    positions = range(len(names))
    axes.bar(positions, before, color=COLORS["before"], label="stored before the batch")
    axes.bar(positions, added, bottom=before, color=COLORS["added"], label="stored by the batch")
    axes.set_ylabel("documents in the archive")
    _count_axis(axes)
    _legend(axes)
    _mark_batch(axes, names, batch)
    total = sum(added)
    caption = (f"Documents stored now, by the batch that brought them: {total:,} in {len(names):,} batches"
               + (f"; batch <b>{_e(batch)}</b> is highlighted." if batch else "."))
    return _section("Growth by batch", _embed(figure, "cumulative documents per batch"), caption)


def _duplicates(batches, batch: str | None, method: Method) -> str:
    names = [row.name for row in batches]
    positions = range(len(names))
    figure = new_figure(11, 3.8)
    kinds, where = figure.subplots(1, 2, sharex=True)
    bottom = [0] * len(names)
    for column, label in (("new", "new"), ("exact_duplicates", "exact duplicates"),
                          ("near_duplicates", "near-duplicates")):
        values = [getattr(row, column) for row in batches]
        kinds.bar(positions, values, bottom=bottom, label=label, color=COLORS[column.split("_")[0]])
        bottom = [b + v for b, v in zip(bottom, values)]
    kinds.set_ylabel("documents of the batch")
    bottom = [0] * len(names)
    for column, label in (("against_archive", "matched the archive"), ("within_batch", "matched within the batch")):
        values = [getattr(row, column) for row in batches]
        where.bar(positions, values, bottom=bottom, label=label, color=COLORS[column])
        bottom = [b + v for b, v in zip(bottom, values)]
    where.set_ylabel("duplicates: what they matched")
    for axes in (kinds, where):
        _count_axis(axes)
        _legend(axes)
        _mark_batch(axes, names, batch)
    caption = ("Counted at ingest (batch_summary): an exact duplicate has the text of an earlier document, a "
               "near-duplicate is near one. Two documents are near-duplicates when they "
               f"{_e(method.report_terms()['rule'])}.")
    if batch:
        row = next(row for row in batches if row.name == batch)
        caption += (f" Batch <b>{_e(batch)}</b>: {row.documents:,} documents, {row.new:,} new, "
                    f"{row.exact_duplicates:,} exact and {row.near_duplicates:,} near duplicates, "
                    f"{row.against_archive:,} matched the archive and {row.within_batch:,} within the batch.")
    return _section("Duplicates per batch", _embed(figure, "duplicates per batch"), caption)


def _shade(count: int, whole: int) -> str:
    """A cell's count, its background as dark as its share of ``whole``."""
    if not count:
        return '<td class="num"></td>'
    share = count / whole if whole else 0
    return (f'<td class="num" style="background: rgba(230, 126, 34, {0.1 + 0.6 * share:.2f})" '
            f'title="{_percent(count, whole):.1f} % of the batch\'s duplicates">{count:,}</td>')


def _sources(batches, sources, batch: str | None) -> str:
    """Batch by batch: documents, duplicates and their rate, and the batches their earliest near-duplicates
    are in: the batch itself, then the batches duplicated most (each a column), then the rest together."""
    names = {row.batch_id: row.name for row in batches}
    found: dict[int, dict[int, int]] = defaultdict(dict)
    elsewhere: Counter[int] = Counter()
    for row in sources:
        found[row.batch_id][row.source_id] = row.documents
        if row.source_id != row.batch_id:
            elsewhere[row.source_id] += row.documents
    columns = sorted(source for source, _ in elsewhere.most_common(SOURCE_COLUMNS))
    rest = set(elsewhere) - set(columns)
    shown = [row for row in batches if row.stored]
    left_out, shown = len(shown[:-BATCH_ROWS]), shown[-BATCH_ROWS:]
    head = ("<tr><th>batch</th><th>documents</th><th>duplicates</th><th>rate</th><th>within the batch</th>"
            + "".join(f'<th title="{_e(names[s])}">{_e(_short(names[s], 24))}</th>' for s in columns)
            + ("<th>other batches</th>" if rest else "") + "</tr>")
    rows = []
    for row in shown:
        counts = found.get(row.batch_id, {})
        cells = [_shade(counts.get(row.batch_id, 0), row.duplicates)]
        cells += [_shade(counts.get(s, 0) if s != row.batch_id else 0, row.duplicates) for s in columns]
        if rest:
            cells.append(_shade(sum(counts.get(s, 0) for s in rest if s != row.batch_id), row.duplicates))
        selected = ' class="selected"' if row.name == batch else ""
        rows.append(f'<tr{selected}><th>{_e(row.name)}</th>'
                    f'<td class="num">{row.stored:,}</td><td class="num">{row.duplicates:,}</td>'
                    f'<td class="num">{_percent(row.duplicates, row.stored):.1f} %</td>' + "".join(cells) + "</tr>")
    table = _scrolling(f'<table class="batches"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>')
    caption = ("Each row is a batch: its stored documents, those that duplicate an earlier document (exactly or "
               "nearly) and their share; then in which batch each duplicate's earliest near-duplicate is: the batch "
               f"itself, {f'the {len(columns)} batches' if len(columns) != 1 else 'the batch'} duplicated most"
               + (f", and the {len(rest)} others together" if rest else "")
               + ". A cell's colour is its share of the row's duplicates.")
    if left_out:
        caption += f" The {left_out:,} earliest batches are left out of the rows (not of the columns)."
    return _section("Where each batch's duplicates come from", table, caption)


def _breakdown(field: str, rows: list[reads.Breakdown], batch: str | None, fields: list[str]) -> str:
    """The duplicate rate for each value of a metadata field, most frequent values first."""
    title = f"Duplicates by {field}"
    whose = f" of batch <b>{_e(batch)}</b>" if batch else ""
    if all(row.kind == "none" for row in rows):
        found = ", ".join(f"<code>{_e(name)}</code>" for name in fields) or "none"
        return _section(title, f'<p class="empty">No document{whose} has the metadata field '
                               f"<code>{_e(field)}</code>. Fields of the first stored documents: {found}.</p>", "")
    highest = max(_percent(row.duplicates, row.documents) for row in rows) or 1
    body = []
    for row in rows:
        if row.kind == "value":
            label = f"<code>{_e(_short(row.value, VALUE_CHARS) or chr(34) * 2)}</code>"  # "" for the empty text
        elif row.kind == "other":
            label = f"<i>other ({row.values:,} values)</i>"
        else:
            label = "<i>(none)</i>"
        rate = _percent(row.duplicates, row.documents)
        body.append(f"<tr><td>{label}</td><td class=\"num\">{row.documents:,}</td>"
                    f"<td class=\"num\">{row.duplicates:,}</td><td class=\"num\">{rate:.1f} %</td>"
                    f"<td><span class=\"bar\" style=\"width: {100 * rate / highest:.1f}%\"></span></td></tr>")
    table = _scrolling("<table class=\"breakdown\"><thead><tr><th>" + _e(field) + "</th><th>documents</th>"
                       "<th>duplicates</th><th>rate</th><th>rate (bars scaled to the highest)</th></tr></thead>"
                       "<tbody>" + "".join(body) + "</tbody></table>")
    caption = (f"Documents{whose} by the value of their metadata field <code>{_e(field)}</code>, the {BY_VALUES} "
               "most frequent values first, the rest as <i>other</i>; <i>(none)</i> is the documents without the "
               "field or with null. Duplicates: documents with an earlier near-duplicate (exact or near).")
    return _section(title, table, caption)


def _tick_formatter(method: Method):
    from matplotlib.ticker import FuncFormatter

    template = method.report_terms()["tick"]
    return FuncFormatter(lambda x, _: template.format(distance=round(x), similarity=method.similarity(round(x))))


def _histogram(counts: list[int], method: Method, label: str, color: str):
    """Bars of counts by distance (binned where distances are many), on a log scale, the axis in the
    method's words; returns the figure and its axes."""
    top = len(counts) - 1
    figure = new_figure(11, 3.6)
    axes = figure.subplots()
    step = -(-(top + 1) // HISTOGRAM_BARS)  # distances per bar: ten-thousandths (MinHash, exact) are binned
    binned = [sum(counts[i:i + step]) for i in range(0, top + 1, step)]
    axes.bar(range(0, top + 1, step), binned, width=0.85 * step, align="edge" if step > 1 else "center",
             color=color)
    _log_counts(axes, label)
    axes.set_xlim(-1, top + 1)
    axes.set_ylim(top=max(binned) * 6)  # headroom for a label
    every = next(n for n in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500) if top // n < 12)
    axes.set_xticks(range(0, top + 1, every))  # distances that exist: none below 0, or above the largest
    axes.xaxis.set_major_formatter(_tick_formatter(method))
    return figure, axes


def _stored_pairs(rows, method: Method, batch: str | None) -> str:
    """The stored pairs by distance: every pair within the threshold, found once at ingest."""
    terms = method.report_terms()
    scope = f" found when batch <b>{_e(batch)}</b> was ingested" if batch else ""
    total = sum(row.pairs for row in rows)
    if not total:
        return _section("Similarity of the stored pairs", f'<p class="empty">No stored pair{scope}.</p>', "")
    counts = [0] * (max(method.max_distance, max(row.distance for row in rows)) + 1)
    for row in rows:
        counts[row.distance] += row.pairs
    figure, axes = _histogram(counts, method, "stored pairs (log scale)", COLORS["pairs"])
    axes.set_xlabel(terms["measure"])
    template = terms["pair"]
    alt = "stored pairs: " + ", ".join(
        f"{template.format(distance=row.distance, similarity=method.similarity(row.distance))}: {row.pairs:,}"
        for row in rows)
    caption = (f"Every stored pair{scope} ({total:,}: each pair of near-duplicates, found once, when its later "
               f"document was ingested), by {_e(terms['measure'])}. Two documents are near-duplicates when they "
               f"{_e(terms['rule'])}.")
    return _section("Similarity of the stored pairs", _embed(figure, _short(alt, 2000)), caption)


def _candidates(counts: list[int], sampled: int, method: Method, batch: str | None) -> str:
    """What a lookup reads: the candidates of a sample of documents by distance, the threshold marked."""
    pairs = sum(counts)
    k = method.max_distance
    terms = method.report_terms()
    whose = f"documents of batch <b>{_e(batch)}</b>" if batch else "documents"
    if not pairs:
        content = f'<p class="empty">No sampled document shares a {terms["key"]} key with another document.</p>'
    else:
        figure, axes = _histogram(counts, method, "candidate pairs (log scale)", COLORS["histogram"])
        axes.axvspan(-1, k + 0.5, color=COLORS["threshold"], alpha=0.08, zorder=0)
        axes.axvline(k + 0.5, color=COLORS["threshold"], linewidth=2, linestyle="--")
        axes.text(k + 1 + len(counts) / 200, 0.98, f"near-duplicates: {terms['threshold']}",
                  color=COLORS["threshold"], transform=axes.get_xaxis_transform(), va="top", fontsize=10)
        axes.set_xlabel(f"{terms['estimate']}, between a sampled document and a lookup candidate")
        content = _embed(figure, "histogram of the distances between sampled documents and their lookup candidates")
    near = sum(counts[:k + 1])
    caption = (f"Not the stored pairs, but what a lookup reads: a random sample of {sampled:,} {whose}, each "
               f"compared with every stored document that shares at least one {terms['key']} key with it: "
               f"{pairs:,} candidate pairs, {near:,} of them near-duplicates by the sketches (left of the dashed "
               f"line). The rest are the work the keys cost.")
    return _section("Lookup candidates of a sample", content, caption)


def _size_bins(sizes) -> tuple[list[str], list[int]]:
    """Cluster counts for each size 2..max when the largest is small, else for power-of-two ranges of sizes."""
    largest = max(size for size, _ in sizes)
    if largest <= 24:
        bins = [(n, n) for n in range(2, largest + 1)]
    else:
        bins, low = [(2, 2), (3, 3), (4, 4)], 5
        while low <= largest:
            bins.append((low, 2 * low - 2))
            low = 2 * low - 1
    counts = [sum(c for size, c in sizes if low <= size <= high) for low, high in bins]
    return [str(low) if low == high else f"{low:,}–{high:,}" for low, high in bins], counts


def _cluster_sizes(sizes, singletons: int, batch: str | None) -> str:
    if not sizes:
        content = '<p class="empty">No clusters: no document has a near-duplicate.</p>'
    else:
        figure = new_figure(11, 3.2)
        axes = figure.subplots()
        labels, counts = _size_bins(sizes)
        bars = axes.bar(range(len(labels)), counts, width=0.8, color=COLORS["clusters"])
        axes.bar_label(bars, [f"{c:,}" if c else "" for c in counts], fontsize=9, padding=2)
        axes.set_xticks(range(len(labels)), labels)
        _log_counts(axes, "clusters (log scale)")
        axes.set_ylim(top=max(counts) * 2.5)
        axes.set_xlabel("documents in the cluster")
        content = _embed(figure, "cluster-size distribution")
    scope = f" that include a document of batch <b>{_e(batch)}</b>" if batch else ""
    caption = (f"Clusters{scope} are connected groups of near-duplicates: {sum(c for _, c in sizes):,} clusters "
               f"of two or more documents; {singletons:,} documents have no near-duplicate.")
    return _section("Cluster sizes", content, caption)


def _compact(metadata: dict) -> str:
    text = json.dumps(metadata, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    return text if len(text) <= METADATA_CHARS else text[:METADATA_CHARS - 1] + "…"


def _snippet(text: str, width: int = SAMPLE_TEXT_CHARS) -> str:
    return _short(" ".join(text.split()), width)


def _largest(clusters, members, batch: str | None, method: Method, clusters_link: str | None) -> str:
    if not clusters:
        return _section("Largest clusters", '<p class="empty">No clusters yet.</p>', "")
    rows, template = [], method.report_terms()["pair"]
    for cluster in clusters:
        sample = []
        for m in members.get(cluster.cluster_id, []):
            close = "" if m.duplicate_distance is None else "; to its earliest near-duplicate: " + template.format(
                distance=m.duplicate_distance, similarity=method.similarity(m.duplicate_distance))
            sample.append(f"<li><code>{_e(m.external_id)}</code> ({_e(m.batch + close)}) "
                          f"<code>{_e(_compact(m.metadata))}</code>"
                          + (f"<br>{_e(_snippet(m.text))}" if m.text else "") + "</li>")
        rows.append(f"<tr><td class=\"num\">{cluster.size:,}</td><td><code>{_e(cluster.canonical_id)}</code></td>"
                    f"<td>{_utc(cluster.first_seen)}</td><td>{_utc(cluster.last_seen)}</td>"
                    f"<td>{_e(', '.join(cluster.batches))}</td>"
                    f"<td><ul class=\"members\">{''.join(sample)}</ul></td></tr>")
    table = _scrolling("<table class=\"clusters\"><thead><tr><th class=\"size\">size</th>"
                       "<th class=\"id\">canonical id</th><th class=\"seen\">first seen (UTC)</th>"
                       "<th class=\"seen\">last seen (UTC)</th><th class=\"id\">batches</th><th>sample members: id "
                       "(batch; how close to the document it duplicates) metadata (and text, where the index keeps "
                       "texts)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    scope = f" that include a document of batch <b>{_e(batch)}</b>" if batch else ""
    if clusters_link is not None:
        every = (f' Every cluster, member by member: <a href="{_e(clusters_link)}">{_e(clusters_link)}</a> '
                 "(CSV, written beside this page).")
    else:
        every = (" Every cluster, member by member: <code>simdb report --clusters-csv clusters.csv</code> writes "
                 "them beside the page as CSV; in SQL, the view <code>cluster_members</code>.")
    return _section("Largest clusters", table, f"The {len(clusters)} largest clusters{scope}, canonical (earliest) "
                    f"document first; up to {MEMBERS_SHOWN} members each, metadata as compact JSON.{every}")


def _visible(text: str, compact: bool) -> str:
    """Changed text made visible: a line break as ↵ (and still a break, unless ``compact``), and the spaces
    and tabs of a change that is nothing else as ␣ and ⇥."""
    if not text.strip():
        text = text.replace(" ", "␣").replace("\t", "⇥")
    return text.replace("\n", "↵" if compact else "↵\n")


def _marked(text: str, kind: str, compact: bool) -> str:
    """A removal or an addition: a colour, a line through or under it, and the markers [-…-] or {+…+} that
    say which it is without colour (as ``simdb show`` prints them); ``compact``, a long one cut in its middle."""
    if not text:
        return ""
    tag, opening, closing = ("del", "[-", "-]") if kind == "removed" else ("ins", "{+", "+}")
    shown = _e(_visible(text, compact))
    if compact and len(text) > CHANGE_CHARS:
        half = CHANGE_CHARS // 2
        shown = (f"{_e(_visible(text[:half], True))}<span class=\"mark\"> … {len(text) - 2 * half:,} more "
                 f"characters … </span>{_e(_visible(text[-half:], True))}")
    return f'<{tag}><span class="mark">{opening}</span>{shown}<span class="mark">{closing}</span></{tag}>'


def _change_row(change: Change, a_length: int) -> str:
    before = ("…" if change.a_offset > len(change.before) else "") + change.before.replace("\n", "↵")
    end = change.a_offset + len(change.removed) + len(change.after)
    after = change.after.replace("\n", "↵") + ("…" if end < a_length else "")
    return (f'<tr><td class="where">character {change.a_offset + 1:,}<br>line {change.a_line:,}</td>'
            f'<td class="change">{_e(before)}{_marked(change.removed, "removed", True)}'
            f'{_marked(change.added, "added", True)}{_e(after)}</td></tr>')


def _side(runs, keep: str) -> str:
    """One text of a pair: its unchanged runs, and its own changes marked."""
    return "".join(_e(text) if kind == "same" else _marked(text, kind, False) for kind, text in runs
                   if kind in ("same", keep))


def _pairs(pairs, stored_pairs: int, batch: str | None, method: Method, texts: bool) -> str:
    title = "Pairs whose texts differ"
    if not texts:
        return _section(title, '<p class="empty">The index keeps no texts: create it with '
                               "<code>simdb init --store-text</code> to see pairs side by side.</p>", "")
    scope = f" found when batch <b>{_e(batch)}</b> was ingested" if batch else ""
    if not pairs:
        why = ("every one of them is an exact copy (the same text)" if stored_pairs else "there is none yet")
        return _section(title, f'<p class="empty">No stored pair{scope} whose texts differ: {why}.</p>', "")
    template, shown = method.report_terms()["pair"], []
    for number, pair in enumerate(pairs, 1):
        a, b = pair.a_text or "", pair.b_text or ""
        runs = diff(a, b)
        found = changes(runs, CHANGE_CONTEXT, join=1)
        removed, added = changed_characters(runs)
        listed = "".join(_change_row(change, len(a)) for change in found[:CHANGES_SHOWN])
        more = (f'<tr><td></td><td>… and {len(found) - CHANGES_SHOWN:,} more changes: see both texts below</td></tr>'
                if len(found) > CHANGES_SHOWN else "")
        short = elided(runs, DIFF_CONTEXT)
        shown.append(
            f'<div class="pair" id="pair-{number}"><p><b>{number}.</b> <code>{_e(pair.a_external_id)}</code> '
            f"(earlier) and <code>{_e(pair.b_external_id)}</code>: "
            f"{_e(template.format(distance=pair.distance, similarity=method.similarity(pair.distance)))}; "
            f"{len(found):,} change{'s' if len(found) != 1 else ''}, {removed:,} character"
            f"{'s' if removed != 1 else ''} removed and {added:,} added.</p>"
            '<div class="scroll"><table class="changes"><thead><tr><th>where (earlier text)</th>'
            f"<th>change, with the unchanged text around it</th></tr></thead><tbody>{listed}{more}</tbody></table>"
            "</div>"
            "<details><summary>Both texts side by side</summary><div class=\"texts\">"
            f"<div class=\"text\">{_side(short, 'removed')}</div><div class=\"text\">{_side(short, 'added')}</div>"
            "</div></details></div>")
    caption = (f"The {len(pairs)} least similar stored pairs{scope} whose texts differ (by their content hash: "
               "the sketches may put a pair that differs by a character at distance 0), where the threshold "
               "decides. Each change is listed with where it starts in the earlier text (character and line) "
               f"and up to {CHANGE_CONTEXT} unchanged characters on each side: removed text "
               f"{_marked('struck through, on red', 'removed', True)}, added text "
               f"{_marked('underlined, on green', 'added', True)}; ↵ is a line break; one longer than "
               f"{CHANGE_CHARS} characters is cut in its middle. Under each pair, both texts "
               f"side by side, long unchanged stretches cut to {DIFF_CONTEXT} characters around each change; "
               f"texts to their first {TEXT_CHARS:,} characters.")
    return _section(title, "\n".join(shown), caption)


def _notes(lines: list[str]) -> str:
    return "".join(f'<p class="note" role="note">{line}</p>' for line in lines)


# it reads the index's tables itself (and their key columns: an index opened before a relayout is told so)
@translating(lambda args, kwargs: args[0].database.engine.url,
             lambda args, kwargs, error: catalog.relaid_out(args[0].database.engine, args[0].settings.method, error,
                                                                   args[0].context.keyed))
def build_report(index, batch: str | None = None, *, by: str | None = None, clusters_csv: BinaryIO | None = None,
                 clusters_link: str | None = None, warn: Warn | None = None) -> str:
    """The report on ``index`` (optionally focused on one batch; with ``by``, the duplicate rate by that metadata
    field) as an HTML page; with ``clusters_csv``, every cluster's members written there as CSV from the same
    snapshot, and linked from the page as ``clusters_link``. What a reader should know about the page itself
    (characters the charts could not draw, a ``by`` field no document has) is said in it and passed to
    ``warn``, one line each."""
    method = index.settings.method
    with index.database.engine.begin() as connection:
        data = reads.report_data(connection, index.context, batch, sample_size=SAMPLE_SIZE, clusters=LARGEST_CLUSTERS,
                                 members=MEMBERS_SHOWN, pairs=PAIRS_SHOWN if index.settings.texts else 0,
                                 text_chars=TEXT_CHARS, sample_chars=SAMPLE_TEXT_CHARS, by=by, by_values=BY_VALUES)
        fields = reads.metadata_fields(connection) if data.get("by") and all(
            row.kind == "none" for row in data["by"]) else []
        if clusters_csv is not None:
            for chunk in reads.cluster_members_csv(connection, method, batch, CSV_TEXT_CHARS):
                clusters_csv.write(chunk)
    batches = data["batches"]
    duplicates = sum(row.duplicates for row in batches)
    header = {"index": f"schema {index.database.schema} of {index.database.display_url}",
              "layout": method.describe(), "key columns": ", ".join(method.key_columns),
              "documents": f"{data['stored']:,}", "batches": f"{len(batches):,}",
              "duplicates": f"{duplicates:,} ({_percent(duplicates, data['stored']):.1f} % of the documents)",
              **({"batch": batch} if batch else {}),
              "generated": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"}
    notes: list[str] = []
    if not data["stored"]:
        body = ('<p class="empty">Nothing to report yet: the index has no documents. Add a batch with '
                "<code>simdb ingest FILE --batch NAME</code>, then run <code>simdb report</code> again.</p>")
    else:
        if fields:
            notes.append(f"no document{' of batch ' + repr(batch) if batch else ''} has the metadata field {by!r} "
                         f"(fields of the first stored documents: {', '.join(fields) or 'none'})")
        with chart_style() as missing:
            sections = [_rates(batches, batch), _sources(batches, data["sources"], batch),
                        *([_breakdown(by, data["by"], batch, fields)] if by is not None else []),
                        _growth(batches, batch), _duplicates(batches, batch, method),
                        _stored_pairs(data["pair_distances"], method, batch),
                        _candidates(data["counts"], data["sampled"], method, batch),
                        _cluster_sizes(data["sizes"], data["singletons"], batch),
                        _largest(data["clusters"], data["members"], batch, method, clusters_link),
                        _pairs(data["pairs"], sum(row.pairs for row in data["pair_distances"]), batch, method,
                               index.settings.texts)]
        if missing:
            notes.append(f"the charts draw {len(missing)} character{'s' if len(missing) > 1 else ''} as boxes, as "
                         f"no installed font has {'them' if len(missing) > 1 else 'it'}: {' '.join(missing[:20])}"
                         f"{' …' if len(missing) > 20 else ''}; {FONT_ADVICE}")
        body = "\n".join(sections)
    for line in notes:
        if warn is not None:
            warn(line)
    note_html = _notes([_e(line[0].upper() + line[1:]) + "." for line in notes])
    header_html = "".join(f"<dt>{_e(key)}</dt><dd>{_e(value)}</dd>" for key, value in header.items())
    return PAGE.substitute(schema=_e(index.database.schema), header=header_html, body=note_html + body,
                           cjk=CJK_STACK)
