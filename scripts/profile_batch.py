"""Where a warm batch of lookups spends its time outside the index descents: ``Index.query_fingerprints``.

On the archive ``bench_segments.py --connections ... --reuse`` kept (with ``--reuse``; without, one bulk-loaded
here and dropped at the end), runs ``--rounds`` batches of
``--batch`` new probes (half near copies of stored fingerprints), each after one batch that reads their
pages (so every batch measured is warm and repeated), and prints the seconds of each SQL statement
shape (every connection) and of the whole call, and the rate.

    .venv/bin/python scripts/profile_batch.py --archive 3000000 --rounds 10 --connections 1 --reuse \\
        --database-url postgresql://postgres@127.0.0.1:5541/postgres
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import DATABASE_HELP, Server, load_average  # noqa: E402
from bench_segments import near_and_random  # noqa: E402
from profile_chunk import after, archive_in_use, before, reuse_option, statements  # noqa: E402

import simdb  # noqa: E402
from simdb.methods.simhash.blocks import DEFAULT_MAX_DISTANCE  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help=DATABASE_HELP)
    parser.add_argument("--archive", type=int, default=3_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--max-distance", type=int, default=DEFAULT_MAX_DISTANCE)
    parser.add_argument("--seed", type=int, default=11)
    reuse_option(parser)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    with Server(args.database_url) as server:
        with archive_in_use(server, args, rng) as (schema, stored):
            measured_batches(server, schema, stored, args, rng)


def measured_batches(server: Server, schema: str, stored: np.ndarray, args, rng: np.random.Generator) -> None:
    """``args.rounds`` warm batches on ``schema``, timed; prints the table."""
    with simdb.Index.open(server.url, schema=schema) as index:
        index.query_fingerprints(near_and_random(stored, args.batch, rng).tolist(), connections=args.connections)
        load = load_average()
        seconds, measured = [], collections.Counter()
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", before)
        sa.event.listen(sa.engine.Engine, "after_cursor_execute", after)
        for _ in range(args.rounds):
            probes = near_and_random(stored, args.batch, rng).tolist()
            index.query_fingerprints(probes, connections=args.connections)  # its pages read
            statements.clear()
            start = time.perf_counter()
            index.query_fingerprints(probes, connections=args.connections)
            seconds.append(time.perf_counter() - start)
            measured.update(statements)
    total = sum(seconds)
    print(f"load before {load}, after {load_average()}; {args.rounds} batches of {args.batch}, "
          f"{args.connections} connection(s): median {args.batch / float(np.median(seconds)):,.0f} q/s, "
          f"{1e3 * total / args.rounds:.1f} ms a batch")
    print("\n| statement (all connections) | ms a batch |\n|---|---:|")
    for text, spent in measured.most_common(14):
        print(f"| `{text}` | {1e3 * spent / args.rounds:.1f} |")
    print(f"| the rest (Python, numpy, the driver) | {1e3 * (total - sum(measured.values())) / args.rounds:.1f} |")


if __name__ == "__main__":
    main()
