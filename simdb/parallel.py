"""Documents -> fingerprints on every core, streaming, in input order.

Tokenization (jieba above all) is the slow step of an ingest, so it runs in a
pool of worker processes, each of which loads jieba once. Documents are read
lazily and sent to the workers in small chunks, with at most a few chunks in
flight per worker, so memory stays flat however large the input is; results
come back in input order.

With one worker everything runs in this process (no start-up cost).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from .errors import InputError
from .inputs import Document
from .methods import Method
from .text import content_hash

#: Documents per task sent to a worker: large enough to amortise the inter-process
#: round trip, small enough to keep every core busy and memory low.
TASK_SIZE = 256
TASKS_IN_FLIGHT_PER_WORKER = 4


@dataclass(frozen=True)
class Fingerprinted:
    document: Document
    sketch: int | bytes  # SimHash fingerprint or MinHash signature bytes
    content_hash: bytes
    #: The sketch's key values (a row of ``method.keys``) as little-endian int64 bytes, computed by the worker
    #: beside the sketch: MinHash's 21 band hashes cost 36 us a document, which the process that stores the
    #: chunks would otherwise spend while the workers wait. Bytes, not ints: 8 bytes a key, where a tuple of
    #: Python ints takes about 1 KB for MinHash's 21.
    keys: bytes | None = None
    #: Whether the text is too short for the method (:meth:`Method.is_short`), for the first ``judge_first``
    #: texts of a stream; None for the rest.
    short: bool | None = None


def key_rows(keys: Sequence[bytes | None], sketches: Sequence, method: Method) -> np.ndarray:
    """The sketches' key values, ``(len(sketches), len(method.key_columns))``: the workers' ``keys`` where every
    sketch has them, else computed here."""
    if sketches and len(keys) == len(sketches) and all(row is not None for row in keys):
        return np.frombuffer(b"".join(keys), dtype="<i8").reshape(len(sketches), -1)
    return method.keys(sketches)


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_method: Method | None = None


def _exit_with_parent(parent: int) -> None:
    """End this worker when the process that started it dies, even by SIGKILL.

    Linux delivers SIGKILL to a child whose parent dies once asked (``PR_SET_PDEATHSIG``); a
    watcher thread covers other systems and the moment before the request took effect.
    """
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the watcher alone
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="simdb-parent-watch", daemon=True).start()


def _start_worker(method: Method, parent: int | None) -> None:
    """Worker set-up (``parent`` None: the work runs in this process)."""
    global _method
    _method = method
    if parent is not None:
        _exit_with_parent(parent)
        method.sketch("预热 jieba 與 OpenCC")  # load jieba's dictionary and OpenCC now, once per worker


def _fingerprint_texts(task: tuple[list[str], int]) -> list[tuple[int | bytes, bytes, bytes, bool | None]
                                                             | tuple[str, str | None, None, None]]:
    """(sketch, content hash, key values, short) per text of ``(texts, judge)``, or (reason, hint, None, None)
    for a text that has no sketch; ``short`` (:meth:`Method.is_short`) for the first ``judge`` texts that have
    one, None for the rest."""
    texts, judge = task
    results = _method.sketch_many(texts)
    sketches = [result for result in results if not isinstance(result, InputError)]
    keys = iter(_method.keys(sketches).astype("<i8")) if sketches else iter(())
    answers = []
    for text, result in zip(texts, results):
        if isinstance(result, InputError):
            answers.append((result.reason, result.hint, None, None))
            continue
        short = _method.is_short(text) if judge > 0 else None
        judge -= 1
        answers.append((result, content_hash(text), next(keys).tobytes(), short))
    return answers


def batched(items: Iterable, size: int) -> Iterator[list]:
    """Lists of ``size`` items (the last one shorter)."""
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def fingerprint_stream(items: Iterable[Document | InputError], method: Method, *, workers: int | None = None,
                       judge_first: int = 0) -> Iterator[Fingerprinted | InputError]:
    """Fingerprint documents in input order; read errors pass through, fingerprint errors become InputErrors.
    The first ``judge_first`` documents are also judged short or not (``Fingerprinted.short``) where they are
    sketched: the process reading the stream need not load the tokenizer to tell."""
    def tasks() -> Iterator[tuple[list, tuple[list[str], int]]]:
        judge = judge_first  # a task judges at most this many; a text without a sketch is not judged
        for chunk in batched(items, TASK_SIZE):
            texts = [d.text for d in chunk if isinstance(d, Document)]
            yield chunk, (texts, judge)
            judge = max(0, judge - len(texts))

    for chunk, results in ordered_map(_fingerprint_texts, tasks(), workers=workers, initializer=_start_worker,
                                      initargs=(method,)):
        yield from _merge(chunk, results)


_text_function: Callable[[str], object] | None = None


def _start_text_worker(function: Callable[[str], object], parent: int | None) -> None:
    global _text_function
    _text_function = function
    if parent is not None:
        _exit_with_parent(parent)


def _map_texts(texts: list[str]) -> list:
    return [_text_function(text) for text in texts]


def map_texts(function: Callable[[str], object], texts: Iterable[str], *, workers: int | None = None) -> Iterator:
    """``function(text)`` of each text, in input order, on ``workers`` processes (None: every core); ``function``
    is sent to them, so it pickles (a module's function, or a ``functools.partial`` of one). What a method
    learns from a sample of the archive (:meth:`simdb.methods.Method.learn`, ``simdb init --idf-from``) is
    computed this way."""
    tasks = ((None, chunk) for chunk in batched(texts, TASK_SIZE))
    for _, results in ordered_map(_map_texts, tasks, workers=workers, initializer=_start_text_worker,
                                  initargs=(function,)):
        yield from results


def ordered_map(function: Callable[[list], list], tasks: Iterable[tuple[object, list]], *, workers: int | None,
                initializer: Callable, initargs: tuple) -> Iterator[tuple[object, list]]:
    """``(key, function(payload))`` for each ``(key, payload)`` task, in order, on ``workers`` processes.

    ``initializer(*initargs, parent_pid)`` prepares each worker (in this process too, when it does the work
    itself: with one worker, or when the tasks are too few to be worth starting a pool). At most a few tasks
    per worker are in flight, so memory stays flat however many tasks there are."""
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    tasks = iter(tasks)
    # Starting workers costs a second or two (each loads its dictionaries): not worth it for a small input.
    head = list(itertools.islice(tasks, workers)) if workers > 1 else []
    if workers == 1 or len(head) < workers:
        initializer(*initargs, None)
        for key, payload in itertools.chain(head, tasks):
            yield key, function(payload)
        return
    import multiprocessing  # here (with the pool): a command that starts no worker need not load them
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # no inherited locks, connections or threads
    with ProcessPoolExecutor(workers, mp_context=context, initializer=initializer,
                             initargs=(*initargs, os.getpid())) as pool:
        pending: deque[tuple[object, Future]] = deque()
        for key, payload in itertools.chain(head, tasks):
            pending.append((key, pool.submit(function, payload)))
            if len(pending) >= workers * TASKS_IN_FLIGHT_PER_WORKER:
                done_key, future = pending.popleft()
                yield done_key, future.result()
        while pending:
            done_key, future = pending.popleft()
            yield done_key, future.result()


def _merge(chunk: list, results: list) -> Iterator[Fingerprinted | InputError]:
    answers = iter(results)
    for item in chunk:
        if isinstance(item, InputError):
            yield item
            continue
        first, second, keys, short = next(answers)
        if isinstance(first, str):
            yield InputError(first, path=item.path, line=item.line, hint=second)
        else:
            yield Fingerprinted(item, first, second, keys, short)
