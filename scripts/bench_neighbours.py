"""Time simdb_neighbours on a distributed index: the routed function (0021) beside the view reader it replaced.

Builds, on a Citus coordinator, the quickstart corpus in two batches as a SimHash index with the keyed layout,
one with the layout by id, and a MinHash index deciding exactly (the layout by id), each with 4 shards; in each,
the view reader (what simdb_neighbours ran before 0021: the ``document_neighbours`` view, a repartition join) is
made as a temporary function beside it, and both are called for the same documents, interleaved, with
simdb's session settings (``citus.repartition_join_bucket_count_per_node`` is the servers': the tests set 1).
Prints per-call medians and their ratio. Its schemas are dropped at the end.

    .venv/bin/python scripts/bench_neighbours.py --database-url postgresql://postgres@127.0.0.1:9710/postgres
"""

from __future__ import annotations

import argparse
import statistics
import time

import sqlalchemy as sa

from bench_common import load_average

from simdb import Index
from simdb.samples import corpus

VIEW_READER = """CREATE FUNCTION pg_temp.view_neighbours(external_id text) RETURNS SETOF {schema}.document_neighbours
    LANGUAGE plpgsql STABLE AS $$
    #variable_conflict use_column
    BEGIN
    RETURN QUERY SELECT * FROM {schema}.document_neighbours n WHERE n.external_id = view_neighbours.external_id;
    END $$"""

INDEXES = {"simhash, keyed": {"distributed_layout": "keyed"}, "simhash, by id": {"distributed_layout": "id"},
           "minhash exact, by id": {"method": "minhash", "verify": "exact"}}


def timed(connection: sa.Connection, function: str, name: str) -> float:
    start = time.perf_counter()
    connection.execute(sa.text(f"SELECT * FROM {function}(:n)"), {"n": name}).all()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="a Citus coordinator")
    parser.add_argument("--calls", type=int, default=10, help="documents looked up, each by both functions")
    args = parser.parse_args()
    documents = list(corpus())
    print(f"load before: {load_average()}")
    print("| index | view reader (s/call) | routed (ms/call) | ratio |\n|---|---|---|---|")
    for title, options in INDEXES.items():
        schema = "simdb_bench_neighbours_" + title.replace(",", "").replace(" ", "_")
        try:
            with Index.create(args.database_url, schema=schema, distributed=True, shards=4, **options) as index:
                index.add_many(documents[:180], batch="first")
                index.add_many(documents[180:], batch="second")
                with index.database.engine.connect() as connection:
                    connection.exec_driver_sql(f"SET search_path TO {schema}")
                    connection.connection.dbapi_connection.execute(VIEW_READER.format(schema=schema))
                    names = connection.exec_driver_sql("SELECT DISTINCT external_id FROM document_neighbours "
                                                       f"ORDER BY 1 LIMIT {args.calls}").scalars().all()
                    timed(connection, "simdb_neighbours", names[0])  # each session plans once
                    timed(connection, "pg_temp.view_neighbours", names[0])
                    old = [timed(connection, "pg_temp.view_neighbours", name) for name in names]
                    new = [timed(connection, "simdb_neighbours", name) for name in names]
            print(f"| {title} | {statistics.median(old):.2f} | {statistics.median(new) * 1000:.1f} | "
                  f"{statistics.median(old) / statistics.median(new):,.0f} |")
        finally:
            with sa.create_engine(args.database_url).begin() as connection:
                connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
