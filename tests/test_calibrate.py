"""simdb calibrate: precision and recall of every setting on labelled pairs, and a recommendation."""

import json
import random

from click.testing import CliRunner

from simdb.calibrate import LabelledPair, calibrate
from simdb.cli import cli
from simdb.samples import edit, sections


def labelled_pairs(count=60):
    rng = random.Random(3)
    texts = [text for _, text in sections()][:2 * count]
    pairs = []
    for i in range(count):
        pairs.append(LabelledPair(texts[i], edit(texts[i], "typo", rng), True, f"p{i}"))
        pairs.append(LabelledPair(texts[i], texts[count + i], False, f"n{i}"))
    return pairs


def test_curves_are_computed_from_the_pairs():
    result = calibrate(labelled_pairs())
    assert (result.pairs, result.positives) == (120, 60)
    recalls = [p.recall for p in result.simhash]
    assert recalls == sorted(recalls)  # a larger distance never finds fewer pairs
    assert [p.recall for p in result.minhash] == sorted((p.recall for p in result.minhash), reverse=True)
    best = result.best("minhash")
    assert best.f1 == max(p.f1 for p in result.minhash) and best.f1 > 0.9
    for point in result.simhash + result.minhash:
        assert 0 <= point.precision <= 1 and 0 <= point.recall <= 1


def test_cli_recommends_writes_a_plot_and_rejects_bad_input(tmp_path):
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps({"a": p.a, "b": p.b, "duplicate": p.duplicate}) + "\n"
                            for p in labelled_pairs()))
    plot = tmp_path / "cal.svg"
    result = CliRunner().invoke(cli, ["calibrate", str(path), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "recommended: simdb init" in result.output and plot.read_text().startswith("<?xml")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": "x", "b": "y", "duplicate": true}\n{"a": "x", "b": "y", "duplicate": "yes"}\n')
    failed = CliRunner().invoke(cli, ["calibrate", str(bad), "--plot", str(tmp_path / "no.svg")])
    assert failed.exit_code != 0 and f"{bad}:2" in failed.output and "not true or false" in failed.output
    assert not (tmp_path / "no.svg").exists()
    one_label = tmp_path / "one.jsonl"
    one_label.write_text('{"a": "x", "b": "y", "duplicate": true}\n')
    failed = CliRunner().invoke(cli, ["calibrate", str(one_label)])
    assert failed.exit_code != 0 and "same label" in failed.output
