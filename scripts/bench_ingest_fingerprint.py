"""bench_ingest's fingerprinting part: simdb's ``fingerprint_stream`` against plain ``jieba.lcut`` on real
Chinese text, on one core and on all of them.

Run through bench_ingest (``--skip empty,archive,peer,cli`` for this part alone), or on its own::

    .venv/bin/python scripts/bench_ingest_fingerprint.py --markdown

which takes bench_ingest's options and leaves its other parts out.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from bench_common import log, ratio

import simdb
from simdb.inputs import Document
from simdb.methods.simhash import SimHash
from simdb.parallel import fingerprint_stream

PARTS = {"fingerprint"}


class Throughput(NamedTuple):
    """What one measurement went through, and in how long."""

    documents: int
    bytes: int
    seconds: float

    def docs_and_mb(self) -> str:
        return f"{self.documents / self.seconds:,.0f} docs/s, {self.bytes / self.seconds / 1e6:.2f} MB/s"


@dataclass(frozen=True)
class Fingerprinting:
    """Plain jieba and simdb's fingerprint_stream on one core and on ``workers``."""

    texts: int  # documents in the set (repeated for each measurement)
    text_bytes: int  # their UTF-8 bytes
    workers: int
    passes_single: int  # repetitions of the set on one core
    passes: int  # repetitions of the set on ``workers``
    jieba_single: Throughput
    jieba_all: Throughput
    simdb_single: Throughput
    simdb_all: Throughput
    simdb_all_first: float  # seconds to the first result on ``workers`` (spawn, jieba load)


def load_texts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def _start_jieba() -> None:
    """Pool initializer: load jieba's dictionary once per worker."""
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()


def _lcut_all(texts: list[str]) -> int:
    import jieba

    return sum(len(jieba.lcut(text, HMM=False)) for text in texts)


def _ready(_: int) -> int:
    time.sleep(0.5)  # long enough that every worker takes one: then all have run their initializer
    return os.getpid()


def repeated(texts: list[str], passes: int):
    for _ in range(passes):
        yield from texts


def _simdb(texts: list[str], text_bytes: int, workers: int, passes: int) -> tuple[Throughput, float]:
    """fingerprint_stream over ``passes`` repetitions of ``texts``; and the seconds to its first result."""
    settings = SimHash.new()  # what `simdb init` stores by default: auto tokenizer, jieba without HMM
    log(f"simdb fingerprint_stream(workers={workers}), {passes} passes")
    if workers == 1:
        list(fingerprint_stream([Document("warm", texts[0])], settings, workers=1))  # load jieba in-process
    documents = (Document(f"d{i}", text) for i, text in enumerate(repeated(texts, passes)))
    done, first, start = 0, None, time.perf_counter()
    for item in fingerprint_stream(documents, settings, workers=workers):
        if first is None:
            first = time.perf_counter() - start
        done += 1
        if isinstance(item, simdb.InputError):
            raise RuntimeError(f"fingerprinting failed: {item}")
    return Throughput(done, passes * text_bytes, time.perf_counter() - start), first


def measure_fingerprinting(texts: list[str], workers: int, min_seconds: float) -> Fingerprinting:
    """Plain jieba and simdb's fingerprint_stream, on one core and on ``workers``, each at least ``min_seconds``."""
    text_bytes = sum(len(text.encode("utf-8")) for text in texts)
    _start_jieba()
    _lcut_all(texts[:20])
    log(f"plain jieba.lcut(HMM=False), 1 core, at least {min_seconds:.0f} s")
    passes_single, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds:
        _lcut_all(texts)
        passes_single += 1
    jieba_single = Throughput(passes_single * len(texts), passes_single * text_bytes, time.perf_counter() - start)
    # enough passes that the all-core measurements last min_seconds too
    single = jieba_single.documents / jieba_single.seconds
    passes = max(1, math.ceil(min_seconds * single * workers / len(texts)))

    log(f"plain jieba.lcut on {workers} cores (spawn pool, {passes} passes)")
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_start_jieba) as pool:
        if len(set(pool.map(_ready, range(workers), chunksize=1))) < workers:
            log("warning: not every pool worker answered the warm-up")
        tasks = [texts[i:i + 64] for i in range(0, len(texts), 64)]
        start = time.perf_counter()
        for _ in pool.imap_unordered(_lcut_all, (task for _ in range(passes) for task in tasks)):
            pass
        jieba_all = Throughput(passes * len(texts), passes * text_bytes, time.perf_counter() - start)

    simdb_single, _ = _simdb(texts, text_bytes, 1, passes_single)
    simdb_all, first = _simdb(texts, text_bytes, workers, passes)  # with one worker it repeats the one above
    return Fingerprinting(texts=len(texts), text_bytes=text_bytes, workers=workers, passes_single=passes_single,
                          passes=passes, jieba_single=jieba_single, jieba_all=jieba_all, simdb_single=simdb_single,
                          simdb_all=simdb_all, simdb_all_first=first)


def fingerprint_rows(f: Fingerprinting) -> list[tuple[str, str, str, str]]:
    n = f.workers
    single = f.jieba_single.documents / f.jieba_single.seconds
    target = 0.8 * single * n
    steady = (f.simdb_all.documents - 1) / (f.simdb_all.seconds - f.simdb_all_first)
    simdb_all_rate = f.simdb_all.documents / f.simdb_all.seconds
    return [
        ("fingerprint zh text, 1 core: `fingerprint_stream(workers=1)`", f.simdb_single.docs_and_mb(),
         f"plain `jieba.lcut(text, HMM=False)`, 1 core: {f.jieba_single.docs_and_mb()}",
         ratio(f.simdb_single.documents / f.simdb_single.seconds / single)),
        (f"fingerprint zh text, {n} cores: `fingerprint_stream(workers={n})`",
         f"{f.simdb_all.docs_and_mb()} (first result after {f.simdb_all_first:.1f} s: spawn, jieba load; "
         f"{steady:,.0f} docs/s after it)",
         f"plain `jieba.lcut` on {n} cores (warm spawn pool): {f.jieba_all.docs_and_mb()}",
         ratio(simdb_all_rate / (f.jieba_all.documents / f.jieba_all.seconds))),
        (f"fingerprint zh text, {n} cores, steady state (after the pool's start): against the target",
         f"{steady:,.0f} docs/s", f"target 0.8 x 1-core jieba x {n} cores = {target:,.0f} docs/s (with the pool's "
         f"start counted: {ratio(simdb_all_rate / target)})", ratio(steady / target)),
    ]


def header_line(f: Fingerprinting, zh_note: str) -> str:
    return (f"fingerprinting: {zh_note}, {f.texts:,} docs ({f.text_bytes / f.texts / 1e3:.1f} KB avg), "
            f"repeated {f.passes_single}x on 1 core and {f.passes}x on {f.workers}; simdb with the default "
            "settings of `simdb init` (auto tokenizer: jieba without HMM, stop words, numpy SimHash); "
            "the all-core simdb figure includes starting its spawn pool")


if __name__ == "__main__":
    import bench_ingest

    bench_ingest.main(sys.argv[1:], parts=PARTS)
