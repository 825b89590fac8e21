"""Labelled pairs -> precision and recall of every setting -> a recommendation.

``simdb calibrate`` reads pairs of texts that a person (or an exact measure)
has labelled near-duplicate or not, and scores each pair the way an index
would: the SimHash distance in bits (default recipe) and the MinHash estimate
of Jaccard similarity (default shingles, 128 permutations). Sweeping the
distance ``k`` and the threshold ``t`` gives precision, recall and F1 for
every setting; the best F1 of each method becomes the recommended ``simdb
init`` command, and a plot shows the curves.

The decision for one pair is exactly the index's: a SimHash index finds every
pair within ``k`` bits, and a MinHash index verifies every candidate by the
same estimate (it can miss a pair at the threshold with the small probability
its band layout states).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import outputs
from .errors import InputError, OutputError, place
from .inputs import check_paths, input_files, read_documents, records
from .methods import Method


@dataclass(frozen=True)
class LabelledPair:
    a: str
    b: str
    duplicate: bool
    origin: str


@dataclass(frozen=True)
class Point:
    setting: float
    precision: float
    recall: float
    f1: float
    flagged: int


@dataclass(frozen=True)
class Curve:
    """One method's points: its setting swept (``axis`` says what it is)."""

    method: Method
    points: list[Point]

    @property
    def best(self) -> Point:
        # highest F1; among equals the stricter setting (fewer flagged pairs)
        return max(self.points, key=lambda p: (p.f1, -p.flagged))


@dataclass(frozen=True)
class Calibration:
    pairs: int
    positives: int
    curves: dict[str, Curve]

    def __getattr__(self, name: str) -> list[Point]:
        """``result.simhash``, ``result.minhash``: a method's points."""
        curves = self.__dict__.get("curves", {})
        if name in curves:
            return curves[name].points
        raise AttributeError(name)

    def best(self, method: str) -> Point:
        return self.curves[method].best

    def recommended(self) -> tuple[Method, Point]:
        """The method and setting with the best F1 of all; a tie goes to the curve listed last."""
        order = list(self.curves)
        name = max(order, key=lambda n: (self.curves[n].best.f1, order.index(n)))
        return self.curves[name].method, self.curves[name].best


def read_pairs(path: str | Path, *, documents: str | Path | None = None, label_field: str = "duplicate",
               id_field: str = "id", text_field: str = "text") -> Iterator[LabelledPair]:
    """Labelled pairs from JSON lines (``{"a": ..., "b": ..., "<label_field>": true|false}``) or Parquet (the
    columns ``a``, ``b`` and the label, a boolean column).

    ``a`` and ``b`` are the two texts, or, with ``documents`` (any files ``simdb ingest``
    reads: a folder or a pattern too), the two documents' ids.
    """
    path = str(path)
    files = input_files([str(documents)]) if documents is not None else []
    check_paths([path, *files])
    texts = None
    if documents is not None:
        texts = {d.external_id: d.text for d in read_documents(files, id_field=id_field, text_field=text_field)}
    for line_number, record in records(path):
        missing = [name for name in ("a", "b", label_field) if name not in record]
        if missing:
            raise InputError(f"the pair has no {', '.join(map(repr, missing))} field", path=path,
                             line=line_number, hint='each record needs "a", "b" and the label (--label-field)')
        empty = [name for name in ("a", "b") if record[name] is None]
        if empty:
            raise InputError(f"the pair's {empty[0]!r} is null", path=path, line=line_number,
                             hint="give both texts (or ids) of every pair")
        label = record[label_field]
        if not isinstance(label, bool):
            raise InputError(f"the label {label_field!r} is {label!r}, not true or false", path=path,
                             line=line_number, hint="label each pair with a boolean (JSON true or false)")
        a, b = str(record["a"]), str(record["b"])
        if texts is not None:
            unknown = [i for i in (a, b) if i not in texts]
            if unknown:
                raise InputError(f"no document with id {unknown[0]!r} in {documents}", path=path,
                                 line=line_number, hint="pass the documents file the pairs refer to")
            a, b = texts[a], texts[b]
        yield LabelledPair(a, b, label, place(path, line_number))


def _curve(distances: np.ndarray, labels: np.ndarray, method: Method) -> list[Point]:
    positives = labels.sum()
    points = []
    for setting, max_distance in method.calibration_settings():
        flagged = distances <= max_distance
        tp = int((flagged & labels).sum())
        n = int(flagged.sum())
        precision = tp / n if n else 1.0
        recall = tp / positives if positives else 1.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        points.append(Point(setting, precision, recall, f1, n))
    return points


def calibrate(pairs: list[LabelledPair], methods: list[Method] | None = None) -> Calibration:
    """Score the pairs as an index of each method (default: every method with its default settings) would."""
    if not pairs:
        raise InputError("there are no labelled pairs", hint="give at least one pair of each label")
    labels = np.array([p.duplicate for p in pairs])
    if labels.all() or not labels.any():
        raise InputError("every pair has the same label: precision and recall need both kinds",
                         hint="add pairs that are not near-duplicates (or ones that are)")
    texts = sorted({t for p in pairs for t in (p.a, p.b)})
    position = {t: i for i, t in enumerate(texts)}
    a = [position[p.a] for p in pairs]
    b = [position[p.b] for p in pairs]
    curves = {}
    for method in methods or [Method.named(name).new() for name in Method.names()]:
        sketches = method.sketch_all(texts)
        distances = np.array([int(method.distances(sketches[i], method.stored([sketches[j]]))[0])
                              for i, j in zip(a, b)])
        curves[method.name] = Curve(method, _curve(distances, labels, method))
    return Calibration(pairs=len(pairs), positives=int(labels.sum()), curves=curves)


#: What a plot can be written as, by its file name's extension (none: PNG, as matplotlib does).
PLOT_FORMATS = ("svg", "png", "pdf")


def plot_format(path: str | Path) -> str:
    """The format of the plot written to ``path``, or an error before any work if its extension names none."""
    suffix = Path(path).suffix.lower().lstrip(".") or "png"
    if suffix not in PLOT_FORMATS:
        raise OutputError(f"cannot write a plot as .{suffix}", path=str(path),
                          hint=f"give «plot» a .{', .'.join(PLOT_FORMATS)} file")
    return suffix


def plot(result: Calibration, path: str | Path) -> None:
    """Precision, recall and F1 against the setting, one panel per method (SVG, PNG or PDF by extension),
    written by the rules of :mod:`simdb.outputs`."""
    from .charts import chart_style, new_figure

    kind, target = plot_format(path), outputs.check(path, "plot", "plot")
    with chart_style(), outputs.written(path, "plot", binary=True, target=target) as file:
        _plot(result, file, new_figure(9.0, 3.6), kind)


def _plot(result: Calibration, file, fig, kind: str) -> None:
    for index, curve in enumerate(result.curves.values()):
        axes = fig.add_subplot(1, len(result.curves), index + 1)
        x = [p.setting for p in curve.points]
        for field, style in (("precision", "-"), ("recall", "--"), ("f1", "-")):
            axes.plot(x, [getattr(p, field) for p in curve.points], style, label=field,
                      linewidth=2 if field == "f1" else 1)
        best = curve.best
        axes.axvline(best.setting, color="grey", linewidth=0.8)
        axes.set_title(f"{curve.method.title}: best F1 {best.f1:.3f} at {best.setting:g}")
        axes.set_xlabel(curve.method.calibration_axis)
        axes.set_ylim(0, 1.02)
        axes.legend(loc="best")
    fig.suptitle(f"{result.pairs:,} labelled pairs, {result.positives:,} near-duplicates")
    fig.savefig(file, format=kind)
