"""Time ``check`` (the verdicts of an input, nothing stored) against the same archive, this checkout and a peer.

An index per method gets an archive of ``--archive`` documents (the devset's real texts, and edited copies of
them to reach the count); ``check`` then reads ``--docs`` more (unseen texts, edited and exact copies of the
archive's and of their own) from a JSON-lines file. Each simdb runs it in its own process (``PYTHONPATH``: this
checkout, or the ``--baseline`` checkout), ``--runs`` times, alternately; the table gives the medians and the
ratio of this checkout's to the baseline's (below 1: faster), and whether the two gave the same verdicts.

    git archive 026003e simdb migrations | tar -x -C /tmp/simdb-before && cp simdb/_native*.so /tmp/simdb-before/simdb/
    .venv/bin/python scripts/bench_check.py --baseline /tmp/simdb-before
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from bench_common import DATABASE_HELP, Server, command_line, log, machine, print_table, ratio

from simdb import Index
from simdb.ingest import IngestOptions
from simdb.inputs import Document
from simdb.samples import corpus

ROOT = Path(__file__).resolve().parents[1]
DEVSET = Path(os.environ.get("SIMDB_DEVSET", "/work/shared/devset")) / "docs"
METHODS = {"simhash": {}, "minhash": {"method": "minhash", "threshold": 0.7}}
TIME_CHECK = """
import hashlib, sys, time
from simdb import Index
from simdb.inputs import read_documents
url, schema, path = sys.argv[1:4]
with Index.open(url, schema=schema) as index:
    start = time.perf_counter()
    verdicts = list(index.check(read_documents([path]), batch="b"))
    elapsed = time.perf_counter() - start
digest = hashlib.sha256(repr([(v.status, v.duplicate_of, v.distance) for v in verdicts]).encode()).hexdigest()
print(elapsed, digest)
"""


def texts(count: int, seed: int) -> list[str]:
    """``count`` texts: the devset's (else the sample corpus's), then edited copies of them."""
    base = []
    for path in sorted(DEVSET.glob("*.jsonl")) if DEVSET.exists() else []:
        with path.open(encoding="utf-8") as lines:
            base += [json.loads(line)["text"] for line in lines]
    base = base or [record["text"] for record in corpus()]
    rng = random.Random(seed)
    rng.shuffle(base)
    out = base[:count]
    while len(out) < count:
        text = rng.choice(base)
        at = rng.randrange(len(text) + 1)
        out.append(text[:at] + f" {rng.randrange(10**6)} " + text[at:])
    return out


def timed(simdb_path: Path, url: str, schema: str, path: Path) -> tuple[float, str]:
    environment = {**os.environ, "PYTHONPATH": str(simdb_path)}
    done = subprocess.run([sys.executable, "-c", TIME_CHECK, url, schema, str(path)], env=environment,
                          capture_output=True, text=True, timeout=1800, cwd=tempfile.gettempdir())
    if done.returncode != 0:
        raise SystemExit(f"check with {simdb_path} failed: {done.stderr.strip()[-2000:]}")
    seconds, digest = done.stdout.split()
    return float(seconds), digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=20_000, help="Input records to check.")
    parser.add_argument("--archive", type=int, default=20_000, help="Documents stored before the check.")
    parser.add_argument("--runs", type=int, default=3, help="Timed runs of each simdb.")
    parser.add_argument("--baseline", type=Path, required=True, help="A source checkout of the simdb to compare.")
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=sorted(METHODS))
    parser.add_argument("--database-url", default=None, help=DATABASE_HELP)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    all_texts = texts(args.archive + args.docs, seed=1)
    archive = [Document(f"a{i}", text) for i, text in enumerate(all_texts[:args.archive])]
    rng = random.Random(2)
    new = [{"id": f"n{i}", "text": text} for i, text in enumerate(all_texts[args.archive:])]
    for i in rng.sample(range(len(new)), len(new) // 10):  # exact copies of the archive's texts
        new[i]["text"] = rng.choice(archive).text
    rows = []
    with Server(args.database_url) as server, tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "input.jsonl"
        path.write_text("".join(json.dumps(record) + "\n" for record in new), encoding="utf-8")
        for name in args.methods:
            settings = METHODS[name]
            schema = f"bench_check_{uuid.uuid4().hex[:8]}"
            try:
                with Index.create(server.url, schema=schema, **settings) as index:
                    index.ingest(archive, IngestOptions(batch="archive", chunk_size=10_000))
                log(f"{name}: archive of {len(archive):,} stored")
                seconds: dict[str, list[float]] = {"this": [], "baseline": []}
                digests = set()
                for _ in range(args.runs):
                    for which, where in (("this", ROOT), ("baseline", args.baseline)):
                        elapsed, digest = timed(where, server.url, schema, path)
                        seconds[which].append(elapsed)
                        digests.add(digest)
                        log(f"{name}: {which} {elapsed:.2f} s")
            finally:
                server.drop_schemas(schema)
            this, baseline = statistics.median(seconds["this"]), statistics.median(seconds["baseline"])
            rows.append((f"check {len(new):,} records, {name}" + ("" if len(digests) == 1 else " (VERDICTS DIFFER)"),
                         f"{this:.2f} s", f"baseline {baseline:.2f} s", ratio(this / baseline)))
        header = [machine(server.version(), server.embedded), command_line("bench_check.py"),
                  f"load: {os.getloadavg()[0]:.2f}"]
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
