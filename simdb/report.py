"""``simdb report``: one self-contained HTML page about an index.

The page shows the archive's growth by batch, the duplicates each batch
brought (new / exact / near, and against the archive / within the batch), the
Hamming distances between a sample of documents and their block-key
candidates (where the threshold *k* sits among what the keys bring back), the
cluster-size distribution and the largest clusters with sample members (and
their texts' beginnings), and, where the index keeps texts, the least similar
pairs side by side with their character-level differences (:mod:`simdb.diff`).

Charts are drawn with matplotlib's object-oriented API (no pyplot state, no
display needed) as SVG with text drawn as paths, and embedded as ``data:``
images, so the file needs nothing but itself to open: no network, fonts,
scripts or style sheets. Every value read from the database is escaped with
:func:`html.escape`, and ``$`` in batch names is escaped for matplotlib's
mathtext.

With ``batch``, the distance sample and the cluster sections only consider
documents of that batch (clusters that include one of them), and the batch is
marked in the per-batch charts, which keep every batch for context.
"""

from __future__ import annotations

import base64
import html
import io
import json
from datetime import datetime, timezone
from string import Template

from .charts import chart_style, new_figure
from .diff import changed_characters, diff, elided
from .methods import Method
from .pg import reads

#: Documents whose candidates are measured for the distance histogram, and its most bars.
SAMPLE_SIZE = 2000
HISTOGRAM_BARS = 130
#: Clusters listed in the table, and sample members shown per cluster.
LARGEST_CLUSTERS = 10
MEMBERS_SHOWN = 3
#: Pairs shown side by side with their differences (where the index keeps texts), and how much of each text.
PAIRS_SHOWN = 6
TEXT_CHARS = 50_000
DIFF_CONTEXT = 120
SAMPLE_TEXT_CHARS = 240
METADATA_CHARS = 160
COLORS = {"before": "#c9d6e3", "added": "#2b6cb0", "new": "#9db4cc", "exact": "#c0392b", "near": "#e67e22",
          "against_archive": "#6c3483", "within_batch": "#27ae60", "histogram": "#2b6cb0", "threshold": "#c0392b",
          "clusters": "#6c3483", "mark": "#111111"}

PAGE = Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>simdb report: $schema</title>
<style>
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Arial, sans-serif; color: #1a202c;
       max-width: 1140px; margin: 24px auto; padding: 0 16px; line-height: 1.45; }
h1 { font-size: 26px; margin-bottom: 4px; } h2 { font-size: 20px; margin-top: 36px;
     border-bottom: 1px solid #cbd5e0; padding-bottom: 4px; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; margin: 12px 0; }
dt { font-weight: 600; } dd { margin: 0; }
img { width: 100%; height: auto; display: block; }
.caption { color: #4a5568; font-size: 14px; margin: 4px 0 0; }
.empty { padding: 24px; background: #f7fafc; border: 1px dashed #a0aec0; font-size: 18px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border: 1px solid #e2e8f0; padding: 4px 6px; text-align: left; vertical-align: top; }
th { background: #edf2f7; } td.num { text-align: right; white-space: nowrap; }
code { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px; word-break: break-all; }
ul.members { margin: 0; padding-left: 16px; }
del { background: #fed7d7; text-decoration: none; } ins { background: #c6f6d5; text-decoration: none; }
.text { white-space: pre-wrap; font-size: 13px; width: 50%; }
</style>
</head>
<body>
<h1>simdb report</h1>
<dl>$header</dl>
$body
</body>
</html>
""")


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _utc(moment: datetime) -> str:
    return f"{moment.astimezone(timezone.utc):%Y-%m-%d %H:%M}"


def _label(name: str, width: int = 18) -> str:
    """A batch name for a chart: shortened, and with ``$`` escaped so matplotlib never reads it as mathtext."""
    name = name if len(name) <= width else name[:width - 1] + "…"
    return name.replace("$", r"\$")


def _embed(figure, alt: str) -> str:
    """The figure as an <img> with an SVG data: URI (each chart its own document, so ids never collide)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buffer.getvalue().decode("utf-8")
    svg = svg[svg.index("<svg"):]  # drop the XML declaration and the DOCTYPE (which names a DTD URL)
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/svg+xml;base64,{data}">'


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
    caption = ("Counted at ingest (batch_summary): exact duplicates share the text; near-duplicates are within "
               f"{method.max_distance} {method.report_terms()['unit']} of an earlier document.")
    if batch:
        row = next(row for row in batches if row.name == batch)
        caption += (f" Batch <b>{_e(batch)}</b>: {row.documents:,} documents, {row.new:,} new, "
                    f"{row.exact_duplicates:,} exact and {row.near_duplicates:,} near duplicates, "
                    f"{row.against_archive:,} matched the archive and {row.within_batch:,} within the batch.")
    return _section("Duplicates per batch", _embed(figure, "duplicates per batch"), caption)


def _distances(counts: list[int], sampled: int, method: Method, batch: str | None) -> str:
    """Histogram of candidate distances, in the method's unit, with its threshold marked."""
    pairs = sum(counts)
    top = len(counts) - 1
    k = method.max_distance
    terms = method.report_terms()
    whose = f"documents of batch <b>{_e(batch)}</b>" if batch else "documents"
    if not pairs:
        content = f'<p class="empty">No sampled document shares a {terms["key"]} key with another document.</p>'
    else:
        figure = new_figure(11, 3.6)
        axes = figure.subplots()
        step = -(-(top + 1) // HISTOGRAM_BARS)  # distances per bar: ten-thousandths (MinHash, exact) are binned
        axes.bar(range(0, top + 1, step), [sum(counts[i:i + step]) for i in range(0, top + 1, step)],
                 width=0.85 * step, align="edge" if step > 1 else "center", color=COLORS["histogram"])
        _log_counts(axes, "candidate pairs (log scale)")
        axes.set_xlim(-1, top + 1)
        axes.set_ylim(top=max(sum(counts[i:i + step]) for i in range(0, top + 1, step)) * 6)  # headroom for the threshold's label
        axes.axvspan(-1, k + 0.5, color=COLORS["threshold"], alpha=0.08, zorder=0)
        axes.axvline(k + 0.5, color=COLORS["threshold"], linewidth=2, linestyle="--")
        axes.text(k + 1, 0.98, f"k = {k}: at most {k} {terms['unit']} apart = near-duplicate",
                  color=COLORS["threshold"], transform=axes.get_xaxis_transform(), va="top", fontsize=10)
        axes.set_xlabel(terms["axis"])
        content = _embed(figure, "histogram of distances among candidate pairs")
    near = sum(counts[:k + 1])
    caption = (f"A random sample of {sampled:,} {whose}, each compared with every stored document that shares at "
               f"least one {terms['key']} key with it (the candidates a lookup reads): "
               f"{pairs:,} candidate pairs, {near:,} of them within k = {k} (left of the dashed line).")
    return _section(terms["title"], content, caption)


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


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SAMPLE_TEXT_CHARS else text[:SAMPLE_TEXT_CHARS - 1] + "…"


def _largest(clusters, members, batch: str | None, method: Method) -> str:
    if not clusters:
        return _section("Largest clusters", '<p class="empty">No clusters yet.</p>', "")
    rows, unit = [], method.report_terms()["unit"]
    for cluster in clusters:
        sample = "".join(f"<li><code>{_e(m.external_id)}</code> ({_e(m.batch)}"
                         + (f", {m.duplicate_distance} {_e(unit)}" if m.duplicate_distance is not None else "")
                         + f") <code>{_e(_compact(m.metadata))}</code>"
                         + (f"<br>{_e(_snippet(m.text))}" if m.text else "") + "</li>"
                         for m in members.get(cluster.cluster_id, []))
        rows.append(f"<tr><td class=\"num\">{cluster.size:,}</td><td><code>{_e(cluster.canonical_id)}</code></td>"
                    f"<td>{_utc(cluster.first_seen)}</td><td>{_utc(cluster.last_seen)}</td>"
                    f"<td>{_e(', '.join(cluster.batches))}</td><td><ul class=\"members\">{sample}</ul></td></tr>")
    table = ("<table><thead><tr><th>size</th><th>canonical id</th><th>first seen (UTC)</th><th>last seen (UTC)</th>"
             "<th>batches</th><th>sample members: id (batch, distance from the document it duplicates) metadata "
             "(and text, where the index keeps texts)"
             "</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    scope = f" that include a document of batch <b>{_e(batch)}</b>" if batch else ""
    return _section("Largest clusters", table, f"The {len(clusters)} largest clusters{scope}, canonical (earliest) "
                    f"document first; up to {MEMBERS_SHOWN} members each, metadata as compact JSON.")


def _side(runs, keep: str, tag: str) -> str:
    """One text of a pair: its unchanged runs and its own changes marked with ``tag``."""
    return "".join(_e(text) if kind == "same" else f"<{tag}>{_e(text)}</{tag}>" for kind, text in runs
                   if kind in ("same", keep))


def _pairs(pairs, batch: str | None, method: Method, texts: bool) -> str:
    title = "Pairs side by side"
    if not texts:
        return _section(title, '<p class="empty">The index keeps no texts: create it with '
                               "<code>simdb init --store-text</code> to see pairs side by side.</p>", "")
    if not pairs:
        return _section(title, '<p class="empty">No pair yet that is not an exact copy.</p>', "")
    rows = []
    for pair in pairs:
        runs = elided(diff(pair.a_text or "", pair.b_text or ""), DIFF_CONTEXT)
        removed, added = changed_characters(runs)
        rows.append(f"<tr><th><code>{_e(pair.a_external_id)}</code></th><th><code>{_e(pair.b_external_id)}</code> "
                    f"(similarity {method.similarity(pair.distance):.3f}; {removed:,} characters removed, "
                    f"{added:,} added)</th></tr><tr><td class=\"text\">{_side(runs, 'removed', 'del')}</td>"
                    f"<td class=\"text\">{_side(runs, 'added', 'ins')}</td></tr>")
    scope = f" whose later document is in batch <b>{_e(batch)}</b>" if batch else ""
    return _section(title, "<table><tbody>" + "".join(rows) + "</tbody></table>",
                    f"The {len(pairs)} least similar stored pairs{scope} that are not exact copies: where the "
                    f"threshold decides. Earlier document on the left; characters only in it struck in red, "
                    f"characters only in the later one in green; long unchanged stretches cut to "
                    f"{DIFF_CONTEXT} characters around each change, texts to their first {TEXT_CHARS:,}.")


def build_report(index, batch: str | None = None) -> str:
    """The report on ``index`` (optionally focused on one batch) as an HTML page."""
    method = index.settings.method
    with index.database.engine.begin() as connection:
        data = reads.report_data(connection, method, batch, sample_size=SAMPLE_SIZE, clusters=LARGEST_CLUSTERS,
                                 members=MEMBERS_SHOWN, pairs=PAIRS_SHOWN if index.settings.texts else 0,
                                 text_chars=TEXT_CHARS, sample_chars=SAMPLE_TEXT_CHARS)
    batches = data["batches"]
    header = {"index": f"schema {index.database.schema} of {index.database.display_url}",
              "layout": method.describe(), "key columns": ", ".join(method.key_columns),
              "documents": f"{data['stored']:,}", "batches": f"{len(batches):,}", **({"batch": batch} if batch else {}),
              "generated": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"}
    if not data["stored"]:
        body = ('<p class="empty">Nothing to report yet: the index has no documents. Add a batch with '
                "<code>simdb ingest FILE --batch NAME</code>, then run <code>simdb report</code> again.</p>")
    else:
        with chart_style():
            body = "\n".join([_growth(batches, batch), _duplicates(batches, batch, method),
                              _distances(data["counts"], data["sampled"], method, batch),
                              _cluster_sizes(data["sizes"], data["singletons"], batch),
                              _largest(data["clusters"], data["members"], batch, method),
                              _pairs(data["pairs"], batch, method, index.settings.texts)])
    header_html = "".join(f"<dt>{_e(key)}</dt><dd>{_e(value)}</dd>" for key, value in header.items())
    return PAGE.substitute(schema=_e(index.database.schema), header=header_html, body=body)
