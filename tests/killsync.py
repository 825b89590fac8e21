"""Run ``simdb sync run ...`` and SIGKILL it at its N-th chunk, before or after that chunk commits.

    python -m tests.killsync N before|after [simdb arguments...]

``before``: inside the chunk's transaction, once the chunk and the source's new watermark are written,
not committed. ``after``: once it has committed, before its verdicts and rejects are written. The process
exits normally if the run has fewer chunks, which a test sees as exit status 0 or 3.
"""

from __future__ import annotations

import sys

from tests.killpoint import die


def arm(chunk: int, when: str) -> None:
    from simdb import ingest
    from simdb.pg import sync

    if when not in ("before", "after"):
        raise SystemExit(f"unknown moment {when!r}; before or after")
    counted = {"advanced": 0, "synced": 0}
    advance, sync_all = sync.advance, ingest.sync_all

    def marked_advance(*args, **kwargs):
        advance(*args, **kwargs)
        counted["advanced"] += 1
        if when == "before" and counted["advanced"] == chunk:
            die()

    def marked_sync_all(files, position):
        if when == "after" and counted["advanced"] == chunk:
            die()
        return sync_all(files, position)

    sync.advance = marked_advance
    ingest.sync_all = marked_sync_all


if __name__ == "__main__":
    arm(int(sys.argv[1]), sys.argv[2])
    sys.argv = ["simdb", *sys.argv[3:]]
    from simdb.cli import main

    main()
