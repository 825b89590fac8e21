"""Documents -> fingerprints on every core, streaming, in input order.

Tokenization (jieba above all) is the slow step of an ingest, so it runs in a
pool of worker processes, each of which loads jieba once. Documents are read
lazily and sent to the workers in small chunks, with at most a few chunks in
flight per worker, so memory stays flat however large the input is; results
come back in input order.

With one worker everything runs in this process (no start-up cost).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

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
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="simdb-parent-watch", daemon=True).start()


def _start_worker(method: Method, parent: int) -> None:
    global _method
    _exit_with_parent(parent)
    _method = method
    method.sketch("预热 jieba 與 OpenCC")  # load jieba's dictionary and OpenCC now, once per worker


def _fingerprint_texts(texts: list[str]) -> list[tuple[int | bytes, bytes] | tuple[str, str | None]]:
    """(sketch, content hash) per text, or (reason, hint) for a text that has no sketch."""
    return [(result.reason, result.hint) if isinstance(result, InputError) else (result, content_hash(text))
            for text, result in zip(texts, _method.sketch_many(texts))]


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def fingerprint_stream(items: Iterable[Document | InputError], method: Method, *,
                       workers: int | None = None) -> Iterator[Fingerprinted | InputError]:
    """Fingerprint documents in input order; read errors pass through, fingerprint errors become InputErrors."""
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    items = iter(items)
    # Starting workers costs a second or two (each loads jieba): not worth it for a small input.
    head = list(itertools.islice(items, TASK_SIZE * workers)) if workers > 1 else []
    if workers == 1 or len(head) < TASK_SIZE * workers:
        global _method
        _method = method
        for chunk in _chunks(itertools.chain(head, items), TASK_SIZE):
            yield from _merge(chunk, _fingerprint_texts([d.text for d in chunk if isinstance(d, Document)]))
        return
    items = itertools.chain(head, items)

    context = multiprocessing.get_context("spawn")  # no inherited locks, connections or threads
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                             initargs=(method, os.getpid())) as pool:
        pending: deque[tuple[list, Future]] = deque()
        for chunk in _chunks(items, TASK_SIZE):
            texts = [d.text for d in chunk if isinstance(d, Document)]
            pending.append((chunk, pool.submit(_fingerprint_texts, texts)))
            if len(pending) >= workers * TASKS_IN_FLIGHT_PER_WORKER:
                done_chunk, future = pending.popleft()
                yield from _merge(done_chunk, future.result())
        while pending:
            done_chunk, future = pending.popleft()
            yield from _merge(done_chunk, future.result())


def _merge(chunk: list, results: list) -> Iterator[Fingerprinted | InputError]:
    answers = iter(results)
    for item in chunk:
        if isinstance(item, InputError):
            yield item
            continue
        first, second = next(answers)
        if isinstance(first, str):
            yield InputError(first, path=item.path, line=item.line, hint=second)
        else:
            yield Fingerprinted(item, first, second)
