"""The ``simdb`` command line: a thin layer over :class:`simdb.Index`.

Library errors become one-line messages and a non-zero exit here, and nowhere
else.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import inspect
import json
import os
import re
import shlex
import sys
import time
from datetime import timedelta, timezone

import click

from . import __version__, exports, jsonlines, native, outputs
from .bits import format_fingerprint
from .clock import process_age
from .diff import changed_characters, diff, elided
from .errors import SimdbError
from .ingest_options import DEFAULT_CHUNK_SIZE, DEFAULT_ITERSIZE, ON_CHANGE, ON_ERROR, IngestOptions
from .inputs import DEFAULT_MAX_CHARS, FORMATS, check_paths, input_files, read_documents, total_bytes
from .methods import Method
from .pg import DEFAULT_SCHEMA, DEFAULT_SHARDS
from .settings import DEFAULT_BULK_CHUNK, DEFAULT_MERGE_FACTOR, DEFAULT_SEGMENT_SIZE, MAX_CONNECTIONS, IndexSettings
from .progress import Progress
from .text.tokenize import TOKENIZERS
from .verdicts import STATUSES

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}

#: Exit statuses: done; an error (nothing half-written); a usage error; done, but some records were rejected
#: (``ingest --on-error skip``).
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_REJECTED = 0, 1, 2, 3


def database_options(command):
    """--database-url, --schema and --data-dir, shared by every command that opens an index."""
    command = click.option("--data-dir", envvar="SIMDB_DATA_DIR", type=click.Path(file_okay=False),
                           help="Embedded PostgreSQL data directory, used when no URL is given "
                                "[env SIMDB_DATA_DIR; default ~/.local/share/simdb/postgres].")(command)
    command = click.option("--schema", envvar="SIMDB_SCHEMA", default=DEFAULT_SCHEMA, show_default=True,
                           help="PostgreSQL schema holding the index [env SIMDB_SCHEMA].")(command)
    command = click.option("--database-url", envvar="SIMDB_DATABASE_URL", metavar="URL",
                           help="PostgreSQL server, e.g. postgresql://user@host/db, or libpq's 'host=... "
                                "dbname=...' [env SIMDB_DATABASE_URL]; without it, an embedded PostgreSQL is "
                                "used. Passwords are never printed.")(command)
    return command


def input_options(command):
    """PATHS, --format, --id-field and --text-field: how ``ingest`` and ``check`` read their input."""
    for decorator in reversed([
            click.argument("paths", nargs=-1, required=True, type=click.Path()),
            click.option("--format", "input_format", type=click.Choice(FORMATS), default=None,
                         help="Input format [default: from the file name; .gz and .zst are decompressed]."),
            click.option("--id-field", default="id", show_default=True, help="Field (column) holding the document id."),
            click.option("--text-field", default="text", show_default=True,
                         help="Field (column) holding the text.")]):
        command = decorator(command)
    return command


def user_errors(function):
    """Turn simdb's errors into ClickException's one-line message and exit 1; no message shows a secret the
    command was given. The library raises nothing else for a user to act on: a database error became a
    SimdbError at ``Index``'s boundary (:func:`simdb.pg.database.translating`)."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        # the database layer (SQLAlchemy, psycopg) loads with the first command that opens an index, and with an
        # error to redact: `simdb --help` and `simdb fingerprint` start without it
        try:
            return function(*args, **kwargs)
        except SimdbError as exc:
            from .pg.database import redact

            raise click.ClickException(redact(exc.message(flag), given_secrets(kwargs))) from None
        except click.ClickException as exc:
            from .pg.database import redact

            exc.message = redact(exc.message, given_secrets(kwargs))
            raise
    return wrapper


def given_secrets(params: dict) -> list[str]:
    """The secrets a command was given: the database URL's passwords, libpq's PGPASSWORD, a role's new password."""
    from .pg.database import secrets_in

    url = params.get("database_url") or os.environ.get("SIMDB_DATABASE_URL")
    found = [*secrets_in(url), *secrets_in(params.get("source_url")), os.environ.get("PGPASSWORD", "")]
    if params.get("password_env"):
        found.append(os.environ.get(params["password_env"], ""))
    return [secret for secret in found if secret]


#: API parameters whose flag is not simply --the-name.
_FLAGS = {"ids": "--id"}


def flag(parameter: str) -> str:
    """The command-line flag for a library parameter named in an error message."""
    return _FLAGS.get(parameter, "--" + parameter.replace("_", "-"))


#: Which ``simdb init`` options belong to which method: the parameters of its ``new`` (``idf`` is --idf-from's).
METHOD_OPTIONS = {name: tuple({"idf": "idf_paths"}.get(option, option)
                              for option in inspect.signature(Method.named(name).new).parameters)
                  for name in Method.names()}
OPTION_FLAGS = {"idf_paths": "--idf-from"}
#: The default of every option that is a library parameter, read from the library's signatures (each method's
#: ``new``, :meth:`IndexSettings.new`), where each is defined once.
DEFAULTS = {name: parameter.default
            for function in (IndexSettings.new, *(Method.named(name).new for name in Method.names()))
            for name, parameter in inspect.signature(function).parameters.items()
            if parameter.default is not parameter.empty}
#: What the options state beyond the signatures (:attr:`simdb.methods.Method.option_notes`): an option's largest
#: value, and the usual default of one whose default follows from another option.
NOTES = {name: note for method in Method.names() for name, note in Method.named(method).option_notes.items()}


def distribution(distributed: dict) -> str:
    """The line ``simdb init`` prints of a distributed index: its shards and layout."""
    layout = distributed.get("layout", "id")
    routed = "probes routed by key" if layout == "keyed" else "documents by id"
    return f"distributed: {distributed['shards']} shards per table (Citus), layout {layout} ({routed})"


def resume_command(context: click.Context, batch: str) -> str:
    """The exact command that resumes this ingest: its own arguments, ``--batch`` and ``--resume``."""
    from .pg.database import redact

    words = ["simdb", "ingest", *context.params["paths"]]
    for parameter in context.command.params:
        name = parameter.name
        if name in ("paths", "batch_name", "resume") or \
                context.get_parameter_source(name) is not click.core.ParameterSource.COMMANDLINE:
            continue
        value = context.params[name]
        flag = parameter.opts[0]
        if isinstance(parameter, click.Option) and parameter.is_flag:
            words.append(flag if value else parameter.secondary_opts[0])
        else:
            words += [flag, redact(value) if name == "database_url" else str(value)]
    return shlex.join([*words, "--batch", batch, "--resume"])


def command_started() -> float:
    """When this command began on the ``time.perf_counter()`` clock: its process's start for ``simdb`` itself
    (:func:`main` says when), else (the command called in-process, as tests do) now."""
    given = click.get_current_context().find_root().obj
    return given["started"] if isinstance(given, dict) and "started" in given else time.perf_counter()


def open_index(database_url, schema, data_dir):
    """The index in ``schema``, open (an :class:`simdb.Index`)."""
    from .index import Index

    return Index.open(database_url, schema=schema, data_dir=data_dir)


def learn_idf(method: str, paths, options: dict, workers: int | None):
    """The method's IDF weights learned from the documents in ``paths`` (read like ``simdb ingest`` reads them)
    under the ``options`` asked for, tokenized on ``workers`` processes."""
    from .parallel import map_texts

    progress = Progress("learning IDF weights", total_bytes(paths))
    try:
        return Method.named(method).learn(
            "idf", (document.text for document in read_documents(paths, progress=progress.add_bytes)),
            lambda function, texts: map_texts(function, texts, workers=workers), **options)
    finally:
        progress.close()


def read_text_argument(text: str | None, file) -> str:
    if (text is None) == (file is None):
        raise click.UsageError("give either TEXT or --file")
    if file is None:
        return text
    raw = file.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"{file.name}: invalid UTF-8 at byte offset {exc.start}; "
                                   "re-encode the file as UTF-8") from None


#: The commands that change the index; each writes to standard output only once its change is committed.
CHANGING_COMMANDS = ("init", "ingest", "remove", "relayout", "compact", "grant-reader", "sql-functions", "sync")


class Commands(click.Group):
    """simdb's group of commands, which ends every command's standard output the way a command-line tool should."""

    def invoke(self, ctx: click.Context):
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe or a full disk shows here when the output fits in the buffer
            return result
        except BrokenPipeError:
            _discard_stdout()  # the reader went away (`simdb pairs | head -n 1`): a normal end
            ctx.exit(EXIT_OK)
        except OSError as error:
            if error.filename is not None:  # simdb's own files are reported as SimdbError; this is a bug to see
                raise
            _discard_stdout()
            committed = (f" (what `simdb {ctx.invoked_subcommand}` changed in the index is committed)"
                         if ctx.invoked_subcommand in CHANGING_COMMANDS else "")
            raise click.ClickException(f"cannot write to standard output: {error.strerror}{committed}") from None


def _discard_stdout() -> None:
    """Send what standard output still buffers nowhere, so that the interpreter's last flush cannot fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # no file descriptor (a test's captured output)


@click.group(cls=Commands, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="simdb",
                      message=f"%(prog)s, version %(version)s (compiled fast paths: {native.description()})")
def cli():
    """simdb: a persistent near-duplicate index for text archives, in PostgreSQL.

    Two methods, chosen by `simdb init` for the index's life: SimHash (the
    default), 64-bit fingerprints that are near-duplicates within --max-distance
    bits; and MinHash-LSH (--method minhash), near-duplicates at a Jaccard
    similarity of shingles of at least --threshold, decided on the texts
    themselves with --verify exact: the one for short texts (a sentence or a
    title) and the most accurate. The index lives in a PostgreSQL schema (an
    embedded server unless --database-url or SIMDB_DATABASE_URL names one).

    \b
    Example:
        simdb init                       # or: simdb init --method minhash --verify exact
        simdb ingest archive-2024-05.jsonl --batch 2024-05
        simdb query "text to look up"
        simdb pairs > pairs.jsonl
    """


@cli.command()
@database_options
@click.argument("text", required=False)
@click.option("--file", type=click.File("rb"), help="Read the text from a file ('-' for standard input).")
@click.option("--tokenizer", type=click.Choice(TOKENIZERS), default=None,
              help="The tokenizer of the default settings [default: auto]; not with --index.")
@click.option("--tokens", "show_tokens", is_flag=True, help="Also print the tokens the fingerprint is made of.")
@click.option("--index", "from_index", is_flag=True,
              help="Sketch the text as the index in --schema does (its method and every setting: tokenizer, IDF "
                   "weights, shingles, permutations): a SimHash fingerprint, or a MinHash signature as hex.")
@user_errors
def fingerprint_command(database_url, schema, data_dir, text, file, tokenizer, show_tokens, from_index):
    """Print the fingerprint of TEXT as 16 hex digits (default settings; no database needed), or, with --index,
    the sketch the index would store for it.

    A MinHash signature prints as the hex of its bytes, which SQL reads with decode(..., 'hex'):
    SELECT * FROM simdb_similar(decode('<hex>', 'hex')).

    \b
    Example:
        simdb fingerprint "The quick brown fox"
        simdb fingerprint --file article.txt
        simdb fingerprint --index --schema news --file article.txt
    """
    content = read_text_argument(text, file)
    if from_index:
        if tokenizer is not None:
            raise click.UsageError("--tokenizer is the index's own with --index; give one or the other")
        with open_index(database_url, schema, data_dir) as index:
            sketch, method = index.fingerprint(content), index.sketcher
    else:
        method = Method.named(DEFAULTS["method"]).new(tokenizer=tokenizer or DEFAULTS["tokenizer"])
        sketch = method.sketch(content)
    if show_tokens:
        tokens = method.tokens(content)
        if tokens is None:
            raise click.UsageError(f"--tokens lists a SimHash fingerprint's tokens; this index uses {method.title}")
        click.echo(" ".join(tokens))
    click.echo(method.format(method.stored([sketch])[0]))


cli.add_command(fingerprint_command, name="fingerprint")


@cli.command()
@database_options
@click.option("--max-distance", type=click.IntRange(1, NOTES["max_distance"]["max"]),
              default=DEFAULTS["max_distance"], show_default=True,
              help="Largest Hamming distance that counts as a near-duplicate (k).")
@click.option("--blocks", type=click.IntRange(1, 16), default=None,
              help="Blocks the 64 bits are cut into (m); keys are made of m - k blocks "
                   "[default: the fewest that keep lookups small at --expected-size].")
@click.option("--tokenizer", type=click.Choice(TOKENIZERS), default=DEFAULTS["tokenizer"], show_default=True)
@click.option("--jieba-hmm/--no-jieba-hmm", default=DEFAULTS["jieba_hmm"], show_default=True,
              help="Let jieba guess unknown Chinese words with its HMM.")
@click.option("--shingle-size", type=click.IntRange(1, 16), default=DEFAULTS["shingle_size"], show_default=True,
              help="Characters per shingle for scripts written without spaces.")
@click.option("--stopwords/--no-stopwords", default=DEFAULTS["stopwords"], show_default=True)
@click.option("--weighting", type=click.Choice(["sublinear_tf", "tf", "binary", "tfidf"]), default=None,
              help="Feature weights [default: tfidf with --idf-from, else tf].")
@click.option("--bigrams", type=click.IntRange(0), default=None,
              help="Pairs of adjacent tokens are features too, weighing min(1, N / tokens) times their "
                   f"frequency; 0 for tokens only [default: {NOTES['bigrams']['default']}; 0 with tfidf].")
@click.option("--idf-from", "idf_paths", multiple=True, type=click.Path(),
              help="Learn IDF weights from these documents (a sample of the archive, same formats as ingest; "
                   "repeatable). The table is frozen in the index.")
@click.option("--top-features", type=click.IntRange(0), default=None,
              help="With tfidf: the heaviest features kept per document, 0 for all "
                   f"[default: {NOTES['top_features']['default']}].")
@click.option("--expected-size", type=click.IntRange(1), default=DEFAULTS["expected_size"], show_default=True,
              help="Documents the archive is expected to grow to; chooses --blocks when it is not given.")
@click.option("--method", type=click.Choice(Method.names()), default=DEFAULTS["method"], show_default=True,
              help="simhash: 64-bit fingerprints, distance in bits. minhash: MinHash-LSH signatures, "
                   "near-duplicate = estimated Jaccard similarity of shingles >= --threshold.")
@click.option("--threshold", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=DEFAULTS["threshold"],
              show_default=True, help="MinHash: the Jaccard similarity that makes a near-duplicate.")
@click.option("--num-perm", type=click.IntRange(16, 1024), default=DEFAULTS["num_perm"], show_default=True,
              help="MinHash: signature length (a multiple of 4).")
@click.option("--verify", type=click.Choice(["estimate", "exact"]), default=DEFAULTS["verify"], show_default=True,
              help="MinHash: what decides a candidate pair: the signatures' estimate of Jaccard similarity, or "
                   "the exact Jaccard similarity of the two texts' shingles (keeps the texts: implies "
                   "--store-text).")
@click.option("--store-text/--no-store-text", default=DEFAULTS["store_text"], show_default=True,
              help="Keep each document's text in the index (documents.text, compressed), for `simdb show`, the "
                   "report's side-by-side pairs and the analysts' views.")
@click.option("--segment-size", type=click.IntRange(1000), default=None,
              help="Documents (ids) per new segment: the active segment's indexes must fit in the server's "
                   f"memory [default: {DEFAULT_SEGMENT_SIZE:,}].")
@click.option("--merge-factor", type=click.IntRange(2, 64), default=None,
              help=f"Sealed segments of one size that merge into one [default: {DEFAULT_MERGE_FACTOR}].")
@click.option("--bulk-chunk", type=click.IntRange(1), default=None,
              help="An ingest chunk of at least this many documents is loaded into a segment of its own and "
                   "indexed afterwards, which is faster than inserting it into the active segment's indexes "
                   f"[default: {DEFAULT_BULK_CHUNK:,}].")
@click.option("--distributed", is_flag=True, default=False,
              help="Create a distributed index on a Citus coordinator: its rows sharded across the workers; a "
                   "SimHash index's probes routed by key, a MinHash index's run on every shard (see "
                   "--distributed-layout; docs/scale-out.md).")
@click.option("--shards", type=click.IntRange(1, 4096), default=None,
              help=f"Shards per distributed table, with --distributed [default: {DEFAULT_SHARDS}].")
@click.option("--distributed-layout", "distributed_layout", type=click.Choice(["id", "keyed"]), default=None,
              help="With --distributed: where the rows go. keyed: a keys table sharded by key beside the "
                   "documents (sharded by id), each probe routed to the one shard of its key (SimHash only); id: "
                   "documents sharded by id, every probe sent to every shard (docs/scale-out.md) [default: keyed "
                   "for SimHash, id for MinHash, its only layout].")
@click.option("--copy-from", "copy_from", metavar="SCHEMA", default=None,
              help="With --distributed: make the new index a copy of the index in SCHEMA of the same database "
                   "(settings, batches, documents, pairs, clusters, verdicts), to move an archive onto Citus.")
@click.option("--count-by", "count_by", multiple=True, metavar="FIELD",
              help="Keep, per value of this metadata field, the documents stored and how many are duplicates (the "
                   "table field_counts, for the SQL recipe \"Duplicate rate by a metadata field\"); repeat for "
                   "several. `simdb count-by add` adds one to an existing index.")
@click.option("--workers", type=click.IntRange(1), default=None,
              help="Processes tokenizing the --idf-from sample in parallel [default: all cores].")
@user_errors
def init(database_url, schema, data_dir, max_distance, blocks, tokenizer, jieba_hmm, shingle_size, stopwords,
         weighting, bigrams, idf_paths, top_features, expected_size, method, threshold, num_perm, verify, store_text,
         segment_size, merge_factor, bulk_chunk, distributed, shards, distributed_layout, copy_from, count_by,
         workers):
    """Create an index; its settings are stored with it and checked on every open.

    Running it again with the same settings leaves the index as it is; with
    other settings it is an error.

    \b
    Example:
        simdb init
        simdb init --expected-size 20000000
        simdb init --max-distance 3 --blocks 5
        simdb init --idf-from sample.jsonl
        simdb init --method minhash --threshold 0.8
        simdb init --method minhash --verify exact
        simdb init --store-text
        simdb init --count-by source --count-by language
        simdb init --distributed --database-url postgresql://coordinator/db
        simdb init --distributed --schema archive_citus --copy-from archive
        simdb init --distributed --distributed-layout id
    """
    from .index import Index

    context = click.get_current_context()
    given = {name for name in context.params
             if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE}
    if copy_from is not None:
        settings = sorted(given - {"database_url", "schema", "data_dir", "distributed", "shards",
                                   "distributed_layout", "copy_from"})
        if not distributed or settings:
            raise click.UsageError("--copy-from makes a distributed copy of an index, with that index's own settings: "
                                   "give it with --distributed (and --shards), and without "
                                   + (", ".join(OPTION_FLAGS.get(name, flag(name)) for name in settings) or
                                      "other settings"))
        with Index.copy_to_distributed(database_url, schema=schema, source=copy_from, shards=shards,
                                       data_dir=data_dir, distributed_layout=distributed_layout) as index:
            click.echo(f"created index in schema {index.database.schema!r} of {index.database.display_url}, a "
                       f"distributed copy of schema {copy_from!r}: {index.stats()['documents']:,} documents")
            click.echo(f"layout: {index.settings.method.describe()}")
            click.echo(distribution(index.settings.distributed))
        return
    foreign = sorted(given & (set().union(*METHOD_OPTIONS.values()) - set(METHOD_OPTIONS[method])))
    if foreign:
        owner = next(name for name, names in METHOD_OPTIONS.items() if foreign[0] in names)
        raise click.UsageError(f"these are {Method.named(owner).title} options, not for --method {method}: "
                               + ", ".join(OPTION_FLAGS.get(name, flag(name)) for name in foreign))
    # only what was asked for goes to the library (its defaults are these options' defaults), so an existing
    # index is compared with the settings asked for and with nothing else
    values = {"max_distance": max_distance, "blocks": blocks, "tokenizer": tokenizer, "jieba_hmm": jieba_hmm,
              "shingle_size": shingle_size, "stopwords": stopwords, "weighting": weighting,
              "top_features": top_features, "bigrams": bigrams, "expected_size": expected_size, "threshold": threshold,
              "num_perm": num_perm, "verify": verify, "store_text": store_text}
    options = {name: value for name, value in {"method": method, **values}.items() if name in given}
    options.update({name: value for name, value in (("segment_size", segment_size), ("merge_factor", merge_factor),
                                                     ("bulk_chunk", bulk_chunk), ("shards", shards),
                                                     ("distributed_layout", distributed_layout))
                    if value is not None})
    if distributed:
        options["distributed"] = True
    if count_by:
        options["count_by"] = list(count_by)
    if idf_paths:
        idf_paths = input_files(idf_paths)
        check_paths(idf_paths)
        options["idf"] = learn_idf(method, idf_paths, values, workers)
    with Index.create(database_url, schema=schema, data_dir=data_dir, exist_ok=True, **options) as index:
        verb = "created" if index.created else "found existing"
        click.echo(f"{verb} index in schema {schema!r} of {index.database.display_url}")
        click.echo(f"layout: {index.settings.method.describe()}")
        if index.settings.distributed is not None:
            click.echo(distribution(index.settings.distributed))
        if index.settings.count_by:
            click.echo(f"counts by: {', '.join(index.settings.count_by)}")
        index.settings.check_canaries()
        for line in index.settings.method.creation_notes(expected_size):
            click.echo(line)


@cli.command()
@database_options
@input_options
@click.option("--batch", "batch_name", default=None, help="Name of the batch [default: batch-<UTC time>].")
@click.option("--workers", type=click.IntRange(1), default=None,
              help="Processes fingerprinting in parallel [default: all cores].")
@click.option("--on-error", type=click.Choice(ON_ERROR), default="stop", show_default=True,
              help="At a bad record: stop (nothing of the chunk is stored), or skip it into --rejects.")
@click.option("--rejects", type=click.Path(dir_okay=False), default=None,
              help="File for skipped records, one JSON object each [default: rejects-<batch>.jsonl].")
@click.option("--max-chars", type=click.IntRange(1), default=DEFAULT_MAX_CHARS, show_default=True,
              help="Longest text accepted; longer documents are rejected, never truncated.")
@click.option("--chunk-size", type=click.IntRange(1), default=DEFAULT_CHUNK_SIZE, show_default=True,
              help="Documents per transaction; a batch up to this size lands whole or not at all.")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted batch after its last stored chunk; of a complete batch, write its "
                   "--verdicts and --rejects files again from the database.")
@click.option("--verdicts", "verdicts_path", type=click.Path(dir_okay=False), default=None,
              help="Write every input record's verdict to this file, one JSON object per line, in input order.")
@click.option("--compact/--no-compact", default=True, show_default=True,
              help="After each chunk, merge segments when the index's policy asks for it (see simdb compact).")
@click.option("--connections", type=click.IntRange(1, MAX_CONNECTIONS), default=None,
              help="Database connections sharing a chunk's lookups into the archive's large segments "
                   "[default: this machine's cores, within the server's max_parallel_workers, at most 8].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@user_errors
def ingest(database_url, schema, data_dir, paths, input_format, id_field, text_field, batch_name, workers,
           on_error, rejects, max_chars, chunk_size, resume, verdicts_path, compact, connections, as_json):
    """Add the documents in PATHS as one batch, matched against the archive and each other.

    Fields other than the id and the text are kept as metadata. Ids already
    stored with the same text are skipped, so re-running an input stores each
    document once. Inputs larger than --chunk-size are committed chunk by
    chunk; if such an ingest is interrupted, run it again with --resume.

    \b
    Example:
        simdb ingest articles-2024-05.jsonl --batch 2024-05
        simdb ingest reviews.csv --id-field review_id --text-field body --on-error skip
        simdb ingest huge.jsonl.gz --batch 2024-06 --resume
        simdb ingest new.jsonl --batch 2024-07 --on-error skip --verdicts verdicts.jsonl --json

    Exit status: 0 done; 1 error (what the batch keeps, and how to resume it, is
    said); 2 usage; 3 done, but some records were rejected (--on-error skip).
    The seconds in the summary are the whole command's, from its process's start.
    """
    started = command_started()
    options = IngestOptions(batch=batch_name, source=" ".join(paths), on_error=on_error, rejects=rejects,
                            max_chars=max_chars, chunk_size=chunk_size, workers=workers, resume=resume,
                            verdicts=verdicts_path, compact=compact, connections=connections, spell=flag)
    files = input_files(paths, input_format)
    check_paths(files)
    skipped_to = options.rejects_file(batch_name) if on_error == "skip" and (rejects or batch_name) else None
    outputs.refuse_aliases({"verdicts": verdicts_path, "rejects": skipped_to}, files, stdout=True)
    progress = Progress(f"ingest {options.batch or ''}".strip(), total_bytes(files))
    try:
        documents = read_documents(files, format=input_format, id_field=id_field, text_field=text_field,
                                   skip_errors=on_error == "skip", max_chars=max_chars,
                                   progress=progress.add_bytes)
        with open_index(database_url, schema, data_dir) as index:
            summary = index.ingest(documents, options, progress.add_documents)
    except SimdbError as exc:
        if exc.kept is None:
            raise
        if exc.kept.complete:  # the files after the last chunk: nothing to resume, but a file to get again
            again = getattr(exc, "again", None)
            raise click.ClickException(exc.message(flag) + (f": {again}" if again else "")) from None
        name = exc.kept.batch
        raise click.ClickException(f"{exc.message(flag)}: `{resume_command(click.get_current_context(), name)}` resumes it, "
                                   f"`simdb remove --batch {shlex.quote(name)}` removes it") from None
    finally:
        progress.close()
    summary = dataclasses.replace(summary, seconds=time.perf_counter() - started)
    if print_summary(summary, as_json, verdicts_path, f"{', '.join(paths)} held no records"):
        sys.exit(EXIT_REJECTED)


def print_summary(summary, as_json: bool, verdicts_path, empty: str) -> bool:
    """Print an ingest's (or a sync run's) summary, as text or JSON; ``empty`` says what held no record. True
    when records were rejected (exit status 3)."""
    if as_json:
        click.echo(json.dumps(summary.to_json(verdicts=verdicts_path)))
        if summary.merge_failed:
            click.echo(f"warning: {summary.merge_warning()}", err=True)
    for line in summary.warnings:
        click.echo(f"warning: {line}", err=True)
    if not summary.recorded:
        click.echo(f"warning: {empty}; nothing was stored and no batch was created", err=True)
        return False
    if not as_json:
        click.echo(str(summary))
    return bool(summary.rejected)


@cli.command(name="check")
@database_options
@input_options
@click.option("--batch", "batch_name", default=None, help="Batch name to put in the verdicts [default: null].")
@click.option("--workers", type=click.IntRange(1), default=None,
              help="Processes fingerprinting in parallel [default: all cores].")
@click.option("--max-chars", type=click.IntRange(1), default=DEFAULT_MAX_CHARS, show_default=True,
              help="Longest text accepted; longer documents are rejected.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary on stderr as one JSON object.")
@user_errors
def check_command(database_url, schema, data_dir, paths, input_format, id_field, text_field, batch_name, workers,
                  max_chars, as_json):
    """Print the verdict each record of PATHS would get from ingest, storing nothing.

    One JSON object per input record on standard output, in input order, as
    `ingest --verdicts` writes them; a summary on standard error. It reads the
    archive in one read-only snapshot, so the reader role may run it. Exit
    status 0 whatever it found (1 on an error, 2 on a usage error).

    \b
    Example:
        simdb check new-batch.jsonl > verdicts.jsonl
        simdb check new-batch.jsonl | jq -c 'select(.status == "new")'
    """
    started = command_started()
    files = input_files(paths, input_format)
    check_paths(files)
    outputs.refuse_aliases({}, files, stdout=True)
    counts = dict.fromkeys(("records", *STATUSES), 0)
    progress = Progress("check", total_bytes(files))
    try:
        documents = read_documents(files, format=input_format, id_field=id_field, text_field=text_field,
                                   skip_errors=True, max_chars=max_chars, progress=progress.add_bytes)
        with open_index(database_url, schema, data_dir) as index:
            method = index.settings.method
            for verdict in index.check(documents, batch=batch_name, workers=workers, max_chars=max_chars):
                click.echo(jsonlines.dumps(verdict.to_json(method, flag)))
                counts["records"] += 1
                counts[verdict.status] += 1
                progress.add_documents(1)
    finally:
        progress.close()
    counts["seconds"] = round(time.perf_counter() - started, 3)
    if as_json:
        click.echo(json.dumps(counts), err=True)
    else:
        click.echo(f"checked {counts['records']:,} records: {counts['new']:,} new, {counts['exact']:,} exact "
                   f"duplicates, {counts['near']:,} near-duplicates, {counts['already_stored']:,} already stored, "
                   f"{counts['rejected']:,} rejected in {counts['seconds']:.1f} s; nothing was stored", err=True)


@cli.command()
@database_options
@click.option("--batch", "batch_name", required=True, help="The stored batch whose verdicts to print.")
@click.option("--status", type=click.Choice(STATUSES), default=None,
              help="Only the records with this verdict.")
@user_errors
def verdicts(database_url, schema, data_dir, batch_name, status):
    """Print what became of every input record of a stored batch, in input order.

    The same JSON lines `ingest --verdicts` writes, read from the records
    table (written with each chunk), so they are complete after any kill and
    `--resume`.

    \b
    Example:
        simdb verdicts --batch 2024-07 > verdicts.jsonl
        simdb verdicts --batch 2024-07 --status rejected
    """
    with open_index(database_url, schema, data_dir) as index:
        method = index.settings.method
        for verdict in index.verdicts(batch_name, status=status):
            click.echo(jsonlines.dumps(verdict.to_json(method, flag)))


@cli.command()
@database_options
@click.argument("text", required=False)
@click.option("--file", type=click.File("rb"), help="Read the text from a file ('-' for standard input).")
@click.option("--simhash", help="Look up a fingerprint (16 hex digits) instead of a text.")
@click.option("--max-distance", type=click.IntRange(0), default=None,
              help="Largest distance to report [default: the index's maximum].")
@click.option("--min-similarity", type=float, default=None,
              help="MinHash: smallest estimated Jaccard similarity to report [default: the index's threshold].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per match.")
@user_errors
def query(database_url, schema, data_dir, text, file, simhash, max_distance, min_similarity, as_json):
    """Print the stored documents within --max-distance bits of TEXT (MinHash: at least
    --min-similarity), nearest first.

    \b
    Example:
        simdb query "text to look up"
        simdb query --file article.txt --max-distance 2 --json
    """
    with open_index(database_url, schema, data_dir) as index:
        if min_similarity is not None:
            if max_distance is not None:
                raise click.UsageError("give --max-distance or --min-similarity, not both")
            max_distance = index.distance_for(min_similarity)
        if simhash is not None:
            sketch = not_one = None
            try:
                sketch = index.settings.method.parse(simhash)
            except ValueError as exc:
                not_one = exc
            except SimdbError:  # a method whose sketches are looked up by their texts
                raise click.UsageError(f"--simhash looks up a SimHash fingerprint; this is a "
                                       f"{index.settings.method.title} index: give a text") from None
            if text is not None or file is not None:
                raise click.UsageError("give TEXT, --file or --simhash, not several")
            if not_one is not None:
                raise click.BadParameter(str(not_one), param_hint="--simhash")
            matches = index.query_fingerprint(sketch, max_distance)
        else:
            matches = index.query(read_text_argument(text, file), max_distance)
    if as_json:
        for match in matches:
            click.echo(jsonlines.dumps(match.to_json()))
    elif matches and matches[0].similarity is not None:
        click.echo("similarity  id")
        for match in matches:
            click.echo(f"{match.similarity:>10.3f}  {match.external_id}")
    elif matches:
        click.echo("distance  simhash           id")
        for match in matches:
            click.echo(f"{match.distance:>8}  {format_fingerprint(match.simhash)}  {match.external_id}")
    else:
        click.echo("no stored document is within the distance", err=True)


@cli.command()
@database_options
@click.option("--batch", "batch_name", default=None, help="Only pairs with at least one document of this batch.")
@click.option("--max-distance", type=click.IntRange(0), default=None,
              help="Largest distance to report [default: the index's maximum].")
@click.option("--format", "output_format", type=click.Choice(["jsonl", "csv"]), default="jsonl", show_default=True)
@user_errors
def pairs(database_url, schema, data_dir, batch_name, max_distance, output_format):
    """Print every near-duplicate pair in the archive, earlier document first.

    \b
    Example:
        simdb pairs > pairs.jsonl
        simdb pairs --batch 2024-05 --format csv
    """
    with open_index(database_url, schema, data_dir) as index:
        found = index.pairs(batch=batch_name, max_distance=max_distance)
        if output_format == "csv":
            writer = csv.writer(sys.stdout, lineterminator="\n")
            writer.writerow(["a", "b", "distance"])
            for pair in found:
                writer.writerow([pair.a, pair.b, pair.distance])
        else:
            for pair in found:
                click.echo(jsonlines.dumps(pair.to_json()))


@cli.command()
@database_options
@click.argument("first_id")
@click.argument("second_id", required=False)
@click.option("--context", type=click.IntRange(0), default=None,
              help="With two documents: unchanged characters shown around each change [default: all].")
@click.option("--json", "as_json", is_flag=True, help="Print the document(s) (and the diff) as one JSON object.")
@user_errors
def show(database_url, schema, data_dir, first_id, second_id, context, as_json):
    """Print a stored document, or two with their similarity and a character-level diff.

    The text is there when the index keeps texts (simdb init --store-text, or --verify exact).
    In the diff, [-removed-] is only in the first document and {+added+} only in the second.

    \b
    Example:
        simdb show doc-17
        simdb show doc-17 doc-942 --context 60
    """
    with open_index(database_url, schema, data_dir) as index:
        documents = [index.document(first_id)] + ([index.document(second_id)] if second_id is not None else [])
        method = index.settings.method
        distance = index.distance_between(*documents) if len(documents) == 2 else None
    texts = [d.text for d in documents]
    runs = diff(*texts) if len(documents) == 2 and None not in texts else None
    if as_json:
        result = {"documents": [d.to_json() for d in documents]}
        if distance is not None:
            result.update(distance=distance, similarity=round(method.similarity(distance), 4),
                          near_duplicates=distance <= method.max_distance)
        if runs is not None:
            result["diff"] = [{"kind": kind, "text": text} for kind, text in runs]
        click.echo(jsonlines.dumps(result))
        return
    for document in documents:
        click.echo(f"id: {document.external_id}  batch: {document.batch}  length: {document.length:,} characters  "
                   f"stored: {document.created_at:%Y-%m-%d %H:%M:%S %Z}")
        duplicate = (f"  duplicate of: {document.duplicate_of} (distance {document.duplicate_distance})"
                     if document.duplicate_of else "")
        click.echo(f"cluster: {document.cluster}{duplicate}")
        if document.metadata:
            click.echo(f"metadata: {jsonlines.dumps(document.metadata)}")
    if distance is not None:
        verdict = "near-duplicates" if distance <= method.max_distance else "not near-duplicates"
        click.echo(f"similarity: {method.similarity(distance):.4f} (distance {distance} {method.distance_unit}; "
                   f"{verdict} at the index's maximum distance {method.max_distance})")
    if None in texts:
        click.echo("the index keeps no text of this document: create it with `simdb init --store-text` to see texts",
                   err=True)
        return
    if runs is None:
        click.echo("")
        click.echo(texts[0])
        return
    removed, added = changed_characters(runs)
    click.echo(f"diff: {removed:,} characters only in {first_id}, {added:,} only in {second_id}")
    click.echo("")
    style = {"same": lambda t: t,
             "removed": lambda t: click.style(f"[-{t}-]", fg="red"),
             "added": lambda t: click.style(f"{{+{t}+}}", fg="green")}
    click.echo("".join(style[kind](text) for kind, text in (elided(runs, context) if context is not None else runs)))


@cli.command()
@database_options
@click.option("--batch", "batch_name", default=None, help="Only the documents of this batch.")
@click.option("--unique", is_flag=True,
              help="Only the documents that duplicated nothing stored before them when they arrived (their verdict "
                   "was new; with --batch: the deduplicated batch); later batches and removals do not change it.")
@click.option("--canonical", is_flag=True,
              help="Only one document per cluster as the archive stands: its earliest (a later document can link "
                   "a cluster to an older one, a removal can split one).")
@click.option("--format", "output_format", type=click.Choice(["jsonl", "csv", "parquet"]), default="jsonl",
              show_default=True, help="csv and parquet have the columns id, simhash (or signature), batch and "
                                      "metadata (JSON).")
@click.option("--output", "output_path", type=click.Path(dir_okay=False), default=None,
              help="Write to this file [default: standard output; parquet needs a file].")
@user_errors
def export(database_url, schema, data_dir, batch_name, unique, canonical, output_format, output_path):
    """Print documents as {"id", "simhash", ...metadata}, in the order stored, streamed.

    \b
    Example:
        simdb export > documents.jsonl
        simdb export --batch 2024-07 --unique > deduplicated.jsonl
        simdb export --canonical > one-per-cluster.jsonl
        simdb export --format parquet --output archive.parquet
    """
    if unique and canonical:
        raise click.UsageError("give --unique or --canonical, not both: the documents that were new when they "
                               "arrived, or the earliest of each cluster")
    writer = exports.Writer(output_format, output_path)
    with open_index(database_url, schema, data_dir) as index:
        count = writer.write(index, batch=batch_name, unique=unique, canonical=canonical)
    if output_path is not None:
        click.echo(f"exported {count:,} documents to {output_path}", err=True)


@cli.command()
@database_options
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as one JSON object.")
@click.option("--exact", is_flag=True,
              help="Measure the key buckets over every document, not a sample of 2,000 (an archive of more than "
                   "100,000 documents is sampled: a pass per key takes about 5 s at 10M).")
@user_errors
def stats(database_url, schema, data_dir, as_json, exact):
    """Print the index's size, settings, batches and measured key buckets.

    \b
    Example:
        simdb stats
        simdb stats --exact --json
    """
    with open_index(database_url, schema, data_dir) as index:
        info = index.stats(exact=exact)
    if as_json:
        click.echo(json.dumps(info, default=str, indent=2))
        return
    click.echo(f"index:      schema {info['schema']!r} of {info['database']}")
    click.echo(f"documents:  {info['documents']:,} ({info['duplicates']:,} near or exact duplicates), "
               f"{info['table_bytes'] / 2**20:,.1f} MiB with indexes")
    click.echo(f"layout:     {info['layout']}")
    largest = info["largest_key_buckets"][0]["documents"] if info["largest_key_buckets"] else 0
    expected, measured = info["expected_candidates_per_lookup"], info["measured_candidates_per_lookup"]
    sampled = info["measured_from_sample"]
    if expected is None:
        compared = ""
    elif expected < 1 and measured > 0:  # an index this small shares keys by similarity, not by chance
        compared = (f"; these are texts similar enough to share a key, near-duplicates among them, which a lookup "
                    f"must meet (by chance alone, {info['documents']:,} random fingerprints would give {expected:,})")
    else:
        compared = f", {expected:,} expected for random fingerprints"
    click.echo(f"candidates: {measured:,} per lookup measured"
               + (f" (from {sampled:,} sampled documents; --exact measures all)" if sampled else "") + compared
               + f"; largest key bucket {'the sample met ' if sampled else ''}{largest:,}")
    settings = ", ".join(f"{k}={v}" for k, v in info["settings"].items())
    click.echo(f"settings:   {settings}")
    if info["distributed"] is not None:
        click.echo(distribution(info["distributed"]))
    if info["segmenters"]:
        click.echo(f"segmenters: {', '.join(info['segmenters'])} (same tokens; checked by the canaries on open)")
    click.echo(f"batches:    {len(info['batches'])}")
    for batch in info["batches"]:
        extra = "".join(f", {batch[k]:,} {label}" for k, label in (("already_stored", "already stored"),
                                                                     ("rejected", "rejected")) if batch[k])
        status = batch["status"] if batch["status"] == "complete" else \
            f"{batch['status']}: stopped after {batch['position']:,} input records; continue with --resume"
        click.echo(f"  {batch['name']}: {batch['documents']:,} documents, {batch['new']:,} new, "
                   f"{batch['exact_duplicates']:,} exact, {batch['near_duplicates']:,} near{extra} ({status})")
    policy = info["segment_policy"]
    click.echo(f"segments:   {len(info['segments'])} (new ones span {policy['size']:,} ids, or a whole chunk "
               f"of {policy['bulk_chunk']:,} documents or more; {policy['merge_factor']} of a size merge into one)"
               + ("; a merge is due: simdb compact" if info["compaction_due"] else ""))
    for segment in info["segments"]:
        click.echo(f"  {segment['name']}: ids {segment['first_id']:,}..{segment['end_id'] - 1:,}, "
                   f"{segment['documents']:,} documents, {segment['bytes'] / 2**20:,.1f} MiB"
                   + (" (active)" if segment["active"] else ""))
    if info["advice"]:
        click.echo(f"warning: {info['advice']}", err=True)
    for line in info["server_warnings"]:
        click.echo(f"warning: {line}", err=True)


@cli.command()
@database_options
@click.option("--batch", "batch_name", default=None,
              help="Focus on this batch: distances and clusters of its documents; marked in the charts.")
@click.option("--by", "by", metavar="FIELD", default=None,
              help="Also give the duplicate rate for each value of this metadata field (the 20 most frequent; "
                   "the rest together; (none) for documents without it).")
@click.option("--clusters-csv", type=click.Path(dir_okay=False), default=None,
              help="Also write every cluster's members to this CSV file, linked from the page (which opens "
                   "without it).")
@click.option("--output", required=True, type=click.Path(dir_okay=False),
              help="The HTML file to write (self-contained: opens without a network).")
@user_errors
def report(database_url, schema, data_dir, batch_name, by, clusters_csv, output):
    """Write an HTML report: duplicate rates, where duplicates come from, clusters, pairs.

    The page shows the share of each batch that duplicates earlier documents
    and which batches they duplicate (with --by, for each value of a metadata
    field too), the archive's growth, the duplicates each batch brought, the
    similarity of the stored pairs, a sample's lookup candidates (with the
    threshold), the cluster sizes and the largest clusters with sample
    members, and (where the index keeps texts) pairs whose texts differ,
    change by change. Charts are embedded, so the file opens anywhere
    without a network.

    \b
    Example:
        simdb report --output report.html
        simdb report --batch 2024-05 --by source --output report-2024-05.html
        simdb report --output report.html --clusters-csv clusters.csv
    """
    from urllib.request import pathname2url

    from .report import build_report

    if by is not None and not by.strip():
        raise click.BadParameter("give the name of a metadata field, e.g. --by source", param_hint="--by")
    outputs.refuse_aliases({"output": output, "clusters_csv": clusters_csv}, [])
    target = outputs.check(output, "report")  # refused before the report is built
    csv_target = outputs.check(clusters_csv, "clusters CSV", "clusters_csv") if clusters_csv is not None else None
    link = None if clusters_csv is None else pathname2url(
        os.path.relpath(os.path.realpath(clusters_csv), os.path.dirname(os.path.realpath(output))))

    def warn(line: str) -> None:
        click.echo(f"warning: {line}", err=True)

    with open_index(database_url, schema, data_dir) as index:
        if clusters_csv is None:
            data = build_report(index, batch_name, by=by, warn=warn).encode("utf-8")
            with outputs.written(output, "report", binary=True, target=target) as file:
                file.write(data)
        else:  # the CSV from the page's snapshot; neither file appears unless both are written
            with outputs.written(clusters_csv, "clusters CSV", option="clusters_csv", binary=True,
                                 target=csv_target) as table:
                data = build_report(index, batch_name, by=by, clusters_csv=table, clusters_link=link,
                                    warn=warn).encode("utf-8")
                with outputs.written(output, "report", binary=True, target=target) as file:
                    file.write(data)
    click.echo(f"wrote {output} ({max(1, round(len(data) / 1024)):,} KB)")
    if clusters_csv is not None:
        click.echo(f"wrote {clusters_csv} ({max(1, round(os.path.getsize(clusters_csv) / 1024)):,} KB)")


@cli.command(name="remove")
@database_options
@click.option("--id", "ids", multiple=True, help="Remove the document with this id (repeatable).")
@click.option("--batch", "batch_name", default=None, help="Remove every document of this batch, and the batch.")
@click.option("--before", type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
              default=None, help="Remove the documents ingested before this date (UTC).")
@click.option("--dry-run", is_flag=True, help="Report what would be removed, and remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@user_errors
def remove_command(database_url, schema, data_dir, ids, batch_name, before, dry_run, as_json):
    """Remove documents in one transaction; what pointed at them is re-pointed.

    A document whose duplicate_of was removed points at its earliest remaining
    near-duplicate instead, or becomes an original.

    \b
    Example:
        simdb remove --id doc-17 --id doc-18
        simdb remove --batch 2024-05
        simdb remove --before 2020-01-01 --dry-run
    """
    if before is not None:
        before = before.replace(tzinfo=timezone.utc)
    with open_index(database_url, schema, data_dir) as index:
        summary = index.remove(ids=list(ids) if ids else None, batch=batch_name, before=before, dry_run=dry_run)
    click.echo(json.dumps(dataclasses.asdict(summary), default=str) if as_json else str(summary))


@cli.command()
@database_options
@click.option("--blocks", type=click.IntRange(2, 16), default=None,
              help="The new number of blocks [default: what `simdb stats` advises for the archive's size].")
@click.option("--distributed-layout", "distributed_layout", type=click.Choice(["keyed"]), default=None,
              help="Instead: move a distributed index from the layout by document id to the keyed layout (a keys "
                   "table sharded by key, each probe routed to its shard), in one transaction; ingests wait.")
@user_errors
def relayout(database_url, schema, data_dir, blocks, distributed_layout):
    """Rebuild the block-key columns for another layout, while lookups and ingests go on; or move a
    distributed index to the keyed distributed layout.

    \b
    Example:
        simdb relayout --blocks 5
        simdb relayout --distributed-layout keyed
    """
    if distributed_layout is not None:
        if blocks is not None:
            raise click.UsageError("--distributed-layout moves the index's rows, --blocks changes its keys: "
                                   "give one of them per run")
        with open_index(database_url, schema, data_dir) as index:
            written = index.move_to_keyed_layout()
            click.echo(f"moved to the keyed distributed layout: {written:,} key rows")
            click.echo(distribution(index.settings.distributed))
        return
    with open_index(database_url, schema, data_dir) as index:
        before = index.layout.describe()
        index.relayout(blocks, progress=lambda message: click.echo(message, err=True))
        click.echo(f"relaid out from {before} to {index.layout.describe()}")


@cli.command()
@database_options
@click.option("--full", is_flag=True, help="Merge every sealed segment into one, whatever the policy says.")
@click.option("--json", "as_json", is_flag=True, help="Print what was merged as one JSON object.")
@user_errors
def compact(database_url, schema, data_dir, full, as_json):
    """Merge sealed segments of documents, as the index's policy asks (ingest does this after each chunk).

    A merge copies its segments into one new segment, indexes it, and swaps it in with one short
    exclusive lock; ingests wait while it runs, queries go on. An interrupted merge changes nothing.

    \b
    Example:
        simdb compact
        simdb compact --full --json
    """
    with open_index(database_url, schema, data_dir) as index:
        summary = index.compact(full=full, progress=None if as_json else lambda m: click.echo(m, err=True))
    click.echo(json.dumps(summary.to_json()) if as_json else str(summary))


@cli.command(name="grant-reader")
@database_options
@click.argument("role")
@click.option("--login/--no-login", default=None,
              help="Let the role log in, or not [default: a new role is a group role to grant to users; an "
                   "existing role keeps its LOGIN as it is].")
@click.option("--password-env", metavar="VAR", default=None,
              help="Set the role's password from this environment variable (it is never printed).")
@user_errors
def grant_reader_command(database_url, schema, data_dir, role, login, password_env):
    """Create or update ROLE so it can read the index (tables, views, functions) and write nothing.

    \b
    Example:
        simdb grant-reader analysts
        ANALYST_PASSWORD=... simdb grant-reader analyst --login --password-env ANALYST_PASSWORD
    """
    password = None
    if password_env is not None:
        password = os.environ.get(password_env)
        if not password:
            raise click.ClickException(f"the environment variable {password_env} is not set or empty")
    with open_index(database_url, schema, data_dir) as index:
        grant = index.grant_reader(role, login=login, password=password)
    click.echo(f"{'created' if grant.created else 'updated'} role {role!r}: it can read schema {schema!r} "
               f"and write nothing; it {'can' if grant.login else 'cannot'} log in")


@cli.command(name="sql-functions")
@database_options
@user_errors
def sql_functions_command(database_url, schema, data_dir):
    """Let SQL sketch a typed-in text: install simdb_sketch(text) in PL/Python, with this environment's simdb.

    Then SELECT * FROM simdb_similar_text('some text') answers in psql. Run it as a superuser, on the
    server's machine (the server's Python imports simdb from this environment), after PL/Python is
    installed (Debian: apt-get install postgresql-plpython3-15); again after upgrading simdb.

    \b
    Example:
        simdb sql-functions --schema news
    """
    with open_index(database_url, schema, data_dir) as index:
        paths = index.install_sql_functions()
    click.echo(f"simdb_sketch, simdb_near_text and simdb_similar_text answer in schema {schema!r}; the server's "
               f"Python imports simdb from {', '.join(paths)}")


@cli.command()
@click.argument("pairs_path", metavar="LABELLED.jsonl", type=click.Path(dir_okay=False))
@click.option("--documents", type=click.Path(), default=None,
              help="Documents with ids (any input ingest reads): the pairs' a and b are then their ids, not texts.")
@click.option("--id-field", default="id", show_default=True, help="Field (column) of --documents holding the id.")
@click.option("--text-field", default="text", show_default=True,
              help="Field (column) of --documents holding the text.")
@click.option("--label-field", default="duplicate", show_default=True,
              help="Field holding each pair's label (true / false).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default="calibration.svg", show_default=True,
              help="Where to write the precision / recall plot (.svg or .png).")
@click.option("--json", "as_json", is_flag=True, help="Print every point of both curves as JSON.")
@user_errors
def calibrate(pairs_path, documents, id_field, text_field, label_field, plot_path, as_json):
    """Measure precision and recall of every setting on your own labelled pairs; recommend one.

    Each line of LABELLED.jsonl is {"a": text, "b": text, "duplicate": true|false}
    (or each row of a Parquet file, with those columns). No database is needed.

    \b
    Example:
        simdb calibrate labelled.jsonl
        simdb calibrate pairs.jsonl --documents docs.jsonl --label-field dup_80 --plot cal.png
        simdb calibrate pairs.parquet --documents corpus/ --text-field body
    """
    from .calibrate import calibrate as run_calibration
    from .calibrate import plot, plot_format, read_pairs

    inputs = [pairs_path, *(input_files([documents]) if documents is not None else [])]
    check_paths(inputs)
    outputs.refuse_aliases({"plot": plot_path}, inputs, stdout=True)
    plot_format(plot_path)  # a plot that cannot be written is refused before the work, not after it
    outputs.check(plot_path, "plot", "plot")
    result = run_calibration(list(read_pairs(pairs_path, documents=documents, label_field=label_field,
                                             id_field=id_field, text_field=text_field)))
    plot(result, plot_path)
    if as_json:
        click.echo(json.dumps({"pairs": result.pairs, "positives": result.positives,
                               **{name: [dataclasses.asdict(p) for p in curve.points]
                                  for name, curve in result.curves.items()}}, indent=2))
        return
    click.echo(f"{result.pairs:,} labelled pairs, {result.positives:,} near-duplicates")
    for curve in result.curves.values():
        click.echo(f"{curve.method.title:<14}{curve.method.calibration_symbol}  precision  recall     F1   flagged")
        for point in curve.points:
            setting = f"{point.setting:>6.3f}" if isinstance(point.setting, float) else f"{point.setting:>6}"
            click.echo(f"          {setting}  {point.precision:>9.3f}  {point.recall:>6.3f}  "
                       f"{point.f1:>5.3f}  {point.flagged:>8,}")
    for curve in result.curves.values():
        best = curve.best
        settings = " ".join(f"{flag(name)} {value:g}" for name, value in curve.method.init_options(best.setting).items()
                            if name != "method")
        click.echo(f"{curve.method.title}: best F1 {best.f1:.3f} at {settings} "
                   f"(precision {best.precision:.3f}, recall {best.recall:.3f})")
    method, best = result.recommended()
    click.echo("recommended: simdb init " + " ".join(
        f"{flag(name)} {value if isinstance(value, str) else format(value, 'g')}"
        for name, value in method.init_options(best.setting).items()))
    click.echo(f"plot: {plot_path}")


@cli.group(name="count-by")
def count_by():
    """Count documents and duplicates by the values of metadata fields.

    For each field the index counts by, the table field_counts holds, per
    value, the documents stored and how many of them have an earlier
    near-duplicate, kept by every ingest and removal: the SQL recipe
    "Duplicate rate by a metadata field" reads it instead of every document.

    \b
    Example:
        simdb count-by add source
        simdb count-by list
    """


@count_by.command(name="add")
@database_options
@click.argument("field")
@user_errors
def count_by_add(database_url, schema, data_dir, field):
    """Count by metadata field FIELD from now on, its counts filled from the stored documents.

    One statement reads every stored document once, in one transaction with
    the settings that name the field; ingests and removals wait for it.

    \b
    Example:
        simdb count-by add source
    """
    with open_index(database_url, schema, data_dir) as index:
        values = index.count_by(field)
    click.echo(f"counting by {field!r}: {values:,} values")


@count_by.command(name="list")
@database_options
@user_errors
def count_by_list(database_url, schema, data_dir):
    """List the metadata fields the index counts by, each with its values, documents and duplicates.

    \b
    Example:
        simdb count-by list
    """
    with open_index(database_url, schema, data_dir) as index:
        counts = index.counts_by_field()
    for field, (values, documents, duplicates) in counts.items():
        click.echo(f"{field}: {values:,} values, {documents:,} documents, {duplicates:,} duplicates")
    if not counts:
        click.echo("the index counts by no metadata field; add one with `simdb count-by add FIELD`", err=True)


@cli.group()
def sync():
    """Keep PostgreSQL tables (or queries) in sync with the index.

    A source names a table or a query, its id and text columns, and a watermark
    column such as updated_at; each `simdb sync run` ingests the rows past the
    source's watermark as one batch, exactly as `simdb ingest` would.

    \b
    Example:
        simdb sync add articles --table public.articles --id id --text body --watermark updated_at
        simdb sync run articles --json
        simdb sync list
    """


@sync.command(name="add")
@database_options
@click.argument("name")
@click.option("--table", metavar="SCHEMA.TABLE", default=None,
              help="The table (or view) to read, as PostgreSQL spells it (case matters).")
@click.option("--query", default=None, help="A SELECT to read instead of --table.")
@click.option("--id", "id_column", required=True, metavar="COLUMN", help="Column holding each row's id.")
@click.option("--text", "text_column", required=True, metavar="COLUMN", help="Column holding each row's text.")
@click.option("--metadata", "metadata_columns", multiple=True, metavar="COLUMN",
              help="A column kept as the document's metadata (repeat for several).")
@click.option("--watermark", "watermark_column", default=None, metavar="COLUMN",
              help="A column that grows when a row is added or changed (updated_at, a sequence); without it a run "
                   "reads the ids above the last one stored: new rows only.")
@click.option("--lag", default=None, metavar="INTERVAL",
              help="Read only rows whose (timestamp) watermark is at least this old on the source's clock, e.g. "
                   "'5 minutes': time for transactions that set it earlier to commit.")
@click.option("--source-url", default=None, metavar="URL",
              help="The source's server, when it is not the index's database; its password is not stored.")
@click.option("--on-change", type=click.Choice(ON_CHANGE), default="keep", show_default=True,
              help="A row whose text changed since it was stored: keep the first version (the row is a reject "
                   "saying so), or replace the document and its pairs with the new text.")
@user_errors
def sync_add(database_url, schema, data_dir, name, table, query, id_column, text_column, metadata_columns,
             watermark_column, lag, source_url, on_change):
    """Record a PostgreSQL table or query as source NAME (nothing is read yet).

    \b
    Example:
        simdb sync add articles --table public.articles --id id --text body --metadata title \\
            --watermark updated_at --on-change replace
        simdb sync add forum --query "SELECT id, body, edited FROM posts WHERE NOT spam" --id id --text body \\
            --watermark edited --source-url postgresql://reader@forum-db/forum
    """
    with open_index(database_url, schema, data_dir) as index:
        source, had_password = index.sync_add(
            name, table=table, query=query, id_column=id_column, text_column=text_column,
            metadata_columns=metadata_columns, watermark_column=watermark_column, source_url=source_url,
            on_change=on_change, lag=_interval(lag))
    click.echo(f"sync source {source.name!r} added: {_origin(source)}; `simdb sync run {shlex.quote(name)}` "
               "ingests its rows")
    if had_password:
        click.echo("warning: the source URL's password is not stored; give it to each run with --source-url, or "
                   "through ~/.pgpass (PGPASSFILE)", err=True)


def _interval(text: str | None):
    """A --lag such as '5 minutes', '2 hours', '30 s' as a timedelta."""
    if text is None:
        return None
    units = {"s": "seconds", "sec": "seconds", "second": "seconds", "min": "minutes", "minute": "minutes",
             "h": "hours", "hour": "hours", "d": "days", "day": "days"}
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*", text.lower())
    if not match or match.group(2) not in {*units, *units.values(), "second", "minute", "hour", "day"}:
        raise click.BadParameter(f"{text!r} is not an interval; write e.g. '30 seconds', '5 minutes', '2 hours'",
                                 param_hint="--lag")
    unit = units.get(match.group(2), match.group(2) + "s")
    return timedelta(**{unit: float(match.group(1))})


def _origin(source) -> str:
    where = f"table {source.relation}" if source.relation else "a query"
    order = f"by ({source.watermark_column}, {source.id_column})" if source.watermark_column else \
        f"by {source.id_column}, new ids only"
    from .pg.database import redact

    server = f" on {redact(source.source_url)}" if source.source_url else ""  # stored without one: and if not
    return f"{where}{server}, read {order}"


@sync.command(name="run")
@database_options
@click.argument("name", required=False)
@click.option("--source-url", default=None, metavar="URL",
              help="The source's server for this run (with its password), instead of the stored URL.")
@click.option("--wait", is_flag=True, help="Wait for another run of the source to end, instead of refusing.")
@click.option("--workers", type=click.IntRange(1), default=None,
              help="Processes fingerprinting in parallel [default: all cores].")
@click.option("--on-error", type=click.Choice(ON_ERROR), default="skip", show_default=True,
              help="At a bad or changed row: skip it into --rejects, or stop (nothing of the chunk is stored).")
@click.option("--rejects", type=click.Path(dir_okay=False), default=None,
              help="File for skipped rows, one JSON object each [default: rejects-<batch>.jsonl].")
@click.option("--verdicts", "verdicts_path", type=click.Path(dir_okay=False), default=None,
              help="Write every row's verdict to this file, one JSON object per line, in the order read.")
@click.option("--max-chars", type=click.IntRange(1), default=DEFAULT_MAX_CHARS, show_default=True,
              help="Longest text accepted; longer documents are rejected, never truncated.")
@click.option("--chunk-size", type=click.IntRange(1), default=DEFAULT_CHUNK_SIZE, show_default=True,
              help="Rows per transaction; the watermark advances with each committed chunk.")
@click.option("--itersize", type=click.IntRange(1), default=DEFAULT_ITERSIZE, show_default=True,
              help="Rows fetched from the source's server-side cursor at a time.")
@click.option("--compact/--no-compact", default=True, show_default=True,
              help="After each chunk, merge segments when the index's policy asks for it (see simdb compact).")
@click.option("--json", "as_json", is_flag=True, help="Print each run's summary as one JSON object.")
@user_errors
def sync_run(database_url, schema, data_dir, name, source_url, wait, workers, on_error, rejects, verdicts_path,
             max_chars, chunk_size, itersize, compact, as_json):
    """Ingest the rows of source NAME (of every source, in name order) past its watermark, as one batch each.

    Verdicts, rejects, the summary and exit status are those of `simdb ingest`;
    a run that is killed or fails keeps its committed chunks, and the next run
    continues from there. Two runs of one source at once: the second refuses
    (or waits, with --wait).

    \b
    Example:
        simdb sync run articles
        simdb sync run articles --verdicts verdicts.jsonl --json
        simdb sync run

    Exit status: 0 done; 1 error (what the run kept is said; run it again to
    continue); 2 usage; 3 done, but some rows were rejected or changed (--on-change keep).
    """
    started = command_started()
    with open_index(database_url, schema, data_dir) as index:
        names = [name] if name is not None else [source.name for source, _ in index.sync_sources()]
        if not names:
            click.echo("warning: there are no sync sources; add one with `simdb sync add`", err=True)
        if len(names) > 1 and (rejects or verdicts_path or source_url):
            raise click.UsageError("--rejects, --verdicts and --source-url name one source's files and server: "
                                   "give NAME")
        rejected = False
        for each in names:
            options = IngestOptions(on_error=on_error, rejects=rejects, max_chars=max_chars, chunk_size=chunk_size,
                                    workers=workers, verdicts=verdicts_path, compact=compact, spell=flag)
            progress = Progress(f"sync {each}", 0)
            try:
                summary = index.sync_run(each, options, source_url=source_url, wait=wait, itersize=itersize,
                                         progress=progress.add_documents)
            except SimdbError as exc:
                if exc.kept is None or exc.kept.complete:
                    raise
                raise click.ClickException(f"{exc.message(flag)}: `simdb sync run {shlex.quote(each)}` continues "
                                           "it") from None
            finally:
                progress.close()
            summary = dataclasses.replace(summary, seconds=time.perf_counter() - started)
            rejected |= print_summary(summary, as_json, verdicts_path, f"source {each!r} has no rows past its "
                                      "watermark")
            started = time.perf_counter()
    if rejected:
        sys.exit(EXIT_REJECTED)


@sync.command(name="list")
@database_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per source.")
@user_errors
def sync_list(database_url, schema, data_dir, as_json):
    """List the sync sources, each with its watermark and last run.

    \b
    Example:
        simdb sync list
        simdb sync list --json
    """
    with open_index(database_url, schema, data_dir) as index:
        sources = index.sync_sources()
    for source, last in sources:
        if as_json:
            click.echo(json.dumps(source.to_json(last)))
            continue
        position = (f"watermark {source.watermark}, id {source.last_id}" if source.watermark_column
                    else f"last id {source.last_id}") if source.started else "nothing stored yet"
        run = "never run" if source.last_run_at is None and last is None else \
            f"last run {source.last_run_at:%Y-%m-%d %H:%M:%S %Z}" if source.last_run_at else "last run interrupted"
        batch = (f"; batch {last['batch']!r} ({last['status']}): {last['documents']:,} documents, {last['new']:,} new, "
                 f"{last['exact_duplicates']:,} exact, {last['near_duplicates']:,} near, {last['rejected']:,} "
                 "rejected") if last else ""
        click.echo(f"{source.name}: {_origin(source)}, on change {source.on_change}; {position}; {run}{batch}")
    if not sources and not as_json:
        click.echo("no sync sources; add one with `simdb sync add`", err=True)


def main(started: float | None = None) -> None:
    """Run the command in ``sys.argv``; ``started``: when its process started on the ``time.perf_counter()`` clock
    (the ``simdb`` process's, where :mod:`simdb.launch` runs it in a warm process), by default this one's."""
    cli(prog_name="simdb", obj={"started": time.perf_counter() - process_age() if started is None else started})

