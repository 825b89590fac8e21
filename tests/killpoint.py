"""Run simdb's command line and SIGKILL it at a named moment, for tests of what a kill leaves behind.

    python -m tests.killpoint MOMENT [simdb arguments...]

The command is the real one (``simdb.cli.main``) in a process of its own; only the moment is
marked, by wrapping the function that begins or ends it, and the process sends itself SIGKILL
there: no cleanup, no ``finally``, no buffered write flushed. It exits 0 having never met its
moment, which a test takes as a failure. The moments of an ingest are counted from its batch's
last chunk (the one stored with ``final``), those of an export from its first row:

``before-last-commit``   the last chunk is stored in its transaction, not yet committed
``after-last-commit``    the last chunk has committed; neither file has its records yet
``after-rejects``        the rejects file has them; the verdicts file not yet
``mid-verdicts``         the verdicts file has some of them (a kill inside its write)
``after-files``          both files are written; segments are not merged yet, no summary printed
``mid-export``           the export's file has its first rows written
"""

from __future__ import annotations

import os
import signal
import sys

MOMENTS = ("before-last-commit", "after-last-commit", "after-rejects", "mid-verdicts", "after-files", "mid-export")


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(moment: str) -> None:
    """Wrap the functions that mark ``moment`` so that reaching it kills this process."""
    from simdb import exports, ingest, verdicts
    from simdb.pg import chunks

    if moment not in MOMENTS:
        raise SystemExit(f"unknown moment {moment!r}; one of {', '.join(MOMENTS)}")
    last = {"stored": False, "files": 0}
    store_chunk, sync, compact = chunks.store_chunk, verdicts.OutcomeFile.sync, ingest.compact

    def marked_store_chunk(*args, **kwargs):
        result = store_chunk(*args, **kwargs)
        if kwargs["final"]:
            if moment == "before-last-commit":
                die()
            last["stored"] = True
        return result

    def marked_sync(self, position):
        if last["stored"]:  # after the last commit: rejects first, then verdicts
            if (moment, last["files"]) in (("after-last-commit", 0), ("after-rejects", 1)):
                die()
            last["files"] += 1
            if moment == "mid-verdicts" and not self.only_rejected:
                verdicts.jsonlines = Dying(verdicts.jsonlines, after=2)
        return sync(self, position)

    def marked_compact(*args, **kwargs):
        if last["stored"] and moment == "after-files":
            die()
        return compact(*args, **kwargs)

    ingest.store_chunk = marked_store_chunk
    verdicts.OutcomeFile.sync = marked_sync
    ingest.compact = marked_compact
    if moment == "mid-export":
        exports.jsonlines = Dying(exports.jsonlines, after=3)


class Dying:
    """A stand-in for :mod:`simdb.jsonlines` whose ``dumps`` kills the process after ``after`` lines."""

    def __init__(self, module, after: int) -> None:
        self.module, self.left = module, after

    def dumps(self, *args, **kwargs) -> str:
        if not self.left:
            die()
        self.left -= 1
        return self.module.dumps(*args, **kwargs)


if __name__ == "__main__":
    arm(sys.argv[1])
    from simdb.cli import main

    sys.argv = ["simdb", *sys.argv[2:]]
    main()
