"""Progress of a long ingest: a bar when stderr is a terminal; elsewhere silence, or a log line every so often."""

from __future__ import annotations

import sys
import time
from datetime import timedelta


class Progress:
    """Counts documents and input bytes; shows docs/s, MB/s and the ETA from the bytes left."""

    def __init__(self, label: str, total_bytes: int, *, interval: float = 10.0, stream=None,
                 log_lines: bool = False) -> None:
        """``log_lines``: when the stream is not a terminal, print a line every ``interval`` seconds (by
        default nothing: a script's stderr holds its errors, not progress)."""
        self.stream = stream or sys.stderr
        self.label = label
        self.total = total_bytes
        self.documents = 0
        self.bytes = 0
        self.interval = interval
        self.log_lines = log_lines
        self.started = self.last_log = time.monotonic()
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_bytes or None, unit="B", unit_scale=True, desc=label, file=self.stream,
                            dynamic_ncols=True)

    def add_bytes(self, count: int) -> None:
        self.bytes += count
        if self.bar is not None:
            self.bar.update(count)

    def add_documents(self, count: int) -> None:
        self.documents += count
        now = time.monotonic()
        if self.bar is not None:
            if now - self.last_log > 0.5:
                self.bar.set_postfix_str(f"{self.documents:,} docs, {self.documents / (now - self.started):,.0f} docs/s")
                self.last_log = now
        elif self.log_lines and now - self.last_log >= self.interval:
            self.last_log = now
            print(self.line(now), file=self.stream, flush=True)

    def line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        text = (f"{self.label}: {self.documents:,} documents, {self.documents / elapsed:,.0f} docs/s, "
                f"{self.bytes / elapsed / 1e6:,.1f} MB/s")
        if self.total and self.bytes:
            left = elapsed * (self.total - self.bytes) / self.bytes
            text += f", {100 * self.bytes / self.total:.0f}% of the input, ETA {timedelta(seconds=round(left))}"
        return text

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
