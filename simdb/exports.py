"""``simdb export``: documents out as JSON lines, CSV or Parquet, streamed.

JSON lines carry each document's metadata fields at the top level (as ``export`` always has); CSV
and Parquet have fixed columns (``id``, the sketch, ``batch``, ``metadata`` as JSON text), since
metadata fields differ from document to document. Nothing holds the archive in memory: rows are
read with a server-side cursor and Parquet is written a row group at a time.
"""

from __future__ import annotations

import csv
import sys
from contextlib import contextmanager

from .errors import SimdbError
from . import jsonlines, outputs

FORMATS = ("jsonl", "csv", "parquet")
#: Rows per Parquet row group.
ROW_GROUP = 50_000


class Writer:
    def __init__(self, output_format: str, path: str | None) -> None:
        if output_format not in FORMATS:
            raise SimdbError(f"unknown export format {output_format!r}; choose one of {', '.join(FORMATS)}")
        if output_format == "parquet":
            if path is None:
                raise SimdbError("parquet is written to a file: give «output»")
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise SimdbError("writing parquet needs pyarrow: pip install 'simdb[parquet]' (or pyarrow)") from None
        self.format, self.path = output_format, path
        self.target = outputs.check(path, "export") if path is not None else None  # refused before any work

    @contextmanager
    def _text(self):
        if self.path is None:
            yield sys.stdout
            return
        with outputs.written(self.path, "export", target=self.target) as file:
            yield file

    def write(self, index, *, batch: str | None = None, unique: bool = False, canonical: bool = False) -> int:
        """Write the documents ``index.export`` gives (one batch's, the unique or the canonical ones); returns how
        many. A file appears whole or not at all (by the rules of :mod:`simdb.outputs`)."""
        chosen = {"batch": batch, "unique": unique, "canonical": canonical}
        if self.format == "jsonl":
            count = 0
            with self._text() as out:
                for count, record in enumerate(index.export(**chosen), 1):
                    out.write(jsonlines.dumps(record, default=str) + "\n")
            return count
        rows = index.export_rows(**chosen)
        if self.format == "csv":
            return self._csv(rows, index.context.sql.sketch_column[0])
        return self._parquet(rows, index.context.sql.sketch_column[0])

    def _csv(self, rows, sketch: str) -> int:
        count = 0
        with self._text() as out:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(["id", sketch, "batch", "metadata"])
            for count, row in enumerate(rows, 1):
                writer.writerow([row["id"], row["sketch"], row["batch"],
                                 jsonlines.dumps(row["metadata"], default=str)])
        return count

    def _parquet(self, rows, sketch: str) -> int:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema([("id", pa.string()), (sketch, pa.string()), ("batch", pa.string()),
                            ("metadata", pa.string())])
        count, group = 0, []
        with outputs.written(self.path, "export", binary=True, target=self.target) as file, \
                pq.ParquetWriter(file, schema) as out:
            def flush():
                columns = list(zip(*group)) if group else [[], [], [], []]
                out.write_table(pa.Table.from_arrays([pa.array(list(c), pa.string()) for c in columns],
                                                     schema=schema))
                group.clear()

            for row in rows:
                group.append((row["id"], row["sketch"], row["batch"],
                              jsonlines.dumps(row["metadata"], default=str)))
                count += 1
                if len(group) >= ROW_GROUP:
                    flush()
            if group or not count:
                flush()
        return count
