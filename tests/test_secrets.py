"""No secret is printed: not by any command, in any format, in any file, in any error.

A password reaches simdb in three forms: in a URL's userinfo (``postgresql://user:pw@host/db``), as
a URL query parameter (``?password=pw``, and ``sslpassword``), or in a libpq ``key=value``
connection string (``password='pw'``, quoted by libpq's rules). Every command runs here with each
form given on the command line, where the resume command of a failed ingest repeats it, and the
secret may appear in neither standard output, standard error nor any file the command wrote.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from psycopg.conninfo import make_conninfo

from simdb.cli import cli
from simdb.pg.database import postgres_url, redact

#: Trust authentication takes any password; a server that checks them has its own in the test URL.
SECRET = "s3cr3t/@ 'q' pw34b"
ROLE_SECRET = "r0le-pa55word-34b"


def with_password(database_url: str) -> tuple[str, dict[str, str]]:
    """The test database's password (or a made-up one) and the test database's URL in each form carrying it."""
    base = postgres_url(database_url).set(drivername="postgresql")
    secret = base.password or SECRET
    plain = base._replace(password=None).render_as_string(hide_password=False)
    return secret, {
        "userinfo": base._replace(password=secret).render_as_string(hide_password=False),
        "query": base._replace(password=None).update_query_dict(
            {"password": secret, "sslpassword": secret}).render_as_string(hide_password=False),
        "conninfo": make_conninfo(plain, password=secret),
    }


def pieces(secret: str) -> list[str]:
    """What of a secret must never show: the whole, its URL encoding, and every word of four or more characters."""
    return [secret, quote(secret, safe=""), *(word for word in secret.split() if len(word) >= 4)]


def leaks(text: str, secret: str) -> list[str]:
    return [text[max(0, text.index(piece) - 150):text.index(piece) + 30] for piece in pieces(secret) if piece in text]


@pytest.mark.parametrize("form", ["userinfo", "query", "conninfo"])
def test_no_command_prints_a_password(form, database_url, schema, admin_engine, tmp_path, monkeypatch):
    secret, urls = with_password(database_url)
    url = urls[form]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SIMDB_READER_PASSWORD", ROLE_SECRET)
    monkeypatch.delenv("SIMDB_DATABASE_URL", raising=False)
    first = tmp_path / "first.jsonl"
    first.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document {i} about topic {i % 3} and more words"})
                             + "\n" for i in range(12)))
    second = tmp_path / "second.jsonl"  # the same records, and one that is rejected
    second.write_text(first.read_text() + '{"id": "bad", "text": \n')
    clash = tmp_path / "clash.jsonl"  # its third record reuses a stored id with another text: a kept batch
    clash.write_text("".join(json.dumps(record) + "\n" for record in [
        {"id": "n1", "text": "a new document of its own"}, {"id": "n2", "text": "another new document"},
        {"id": "d0", "text": "another text under a stored id"}]))
    role = f"simdb_secret_{uuid.uuid4().hex[:8]}"
    where = ["--database-url", url, "--schema", schema]
    runs = [
        (0, ["init", *where]),
        (0, ["ingest", str(first), "--batch", "one", *where]),
        (3, ["ingest", str(second), "--batch", "two", "--on-error", "skip", "--verdicts", "v.jsonl",
             "--rejects", "r.jsonl", "--json", *where]),
        (1, ["ingest", str(clash), "--batch", "three", "--chunk-size", "1", *where]),
        (0, ["check", str(clash), *where]),
        (0, ["check", str(clash), "--json", *where]),
        (0, ["verdicts", "--batch", "one", *where]),
        (0, ["stats", *where]),
        (0, ["stats", "--json", *where]),
        (0, ["report", "--output", "report.html", *where]),
        (0, ["export", *where]),
        (0, ["export", "--format", "csv", "--output", "export.csv", *where]),
        (0, ["pairs", *where]),
        (0, ["query", "document 1 about topic 1 and more words", "--json", *where]),
        (0, ["show", "d1", "d4", *where]),
        (0, ["remove", "--batch", "three", "--dry-run", "--json", *where]),
        (0, ["compact", "--json", *where]),
        (0, ["grant-reader", role, "--login", "--password-env", "SIMDB_READER_PASSWORD", *where]),
        (1, ["init", "--max-distance", "3", *where]),  # another setting: an error that names the database
        (1, ["stats", "--database-url", url, "--schema", f"simdb_test_{uuid.uuid4().hex[:12]}"]),  # no index there
    ]
    try:
        outputs = []
        for status, arguments in runs:
            result = CliRunner().invoke(cli, arguments)
            assert result.exit_code == status, (arguments, result.output)
            outputs.append((arguments, result.stdout, result.stderr))
    finally:
        with admin_engine.begin() as connection:
            if connection.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
                connection.exec_driver_sql(f"DROP OWNED BY {role}")
                connection.exec_driver_sql(f"DROP ROLE {role}")
    for arguments, stdout, stderr in outputs:
        for text in (stdout, stderr):
            assert not leaks(text, secret) and not leaks(text, ROLE_SECRET), (arguments[0], text)
    files = {path.name: path.read_text(errors="replace") for path in tmp_path.iterdir() if path.is_file()}
    assert {"v.jsonl", "r.jsonl", "report.html", "export.csv"} <= set(files)
    for name, content in files.items():
        assert not leaks(content, secret), name
    # where the URL is shown, it is shown with the password masked
    stats = json.loads(next(stdout for arguments, stdout, _ in outputs if arguments[:2] == ["stats", "--json"]))
    assert stats["database"] == redact(postgres_url(url)) and "***" in stats["database"]
    failed = next(stderr for arguments, _, stderr in outputs if "three" in arguments)
    resume = failed.split("`")[1]
    assert resume.startswith(f"simdb ingest {clash} --database-url ") and resume.endswith("--batch three --resume")
    assert "***" in resume


@pytest.mark.parametrize("form", ["userinfo", "query", "conninfo"])
def test_connection_errors_print_no_password(form, database_url):
    secret, urls = with_password(database_url)
    unreachable = urls[form].replace("5432", "1") if "5432" in urls[form] else None
    if unreachable is None:
        pytest.skip("the test database is not on port 5432")
    for arguments in (["stats"], ["ingest", "missing-or-not.jsonl"], ["report", "--output", "r.html"]):
        result = CliRunner().invoke(cli, [*arguments, "--database-url", unreachable])
        assert result.exit_code == 1
        assert not leaks(result.output, secret), result.output


def test_a_connection_string_libpq_cannot_parse_prints_no_password():
    """libpq quotes the part of a connection string it could not parse: here a password that needed quotes."""
    for url in ("host=127.0.0.1 password=Sup3r-s3cret Tail-34b dbname=test",
                "host=127.0.0.1 password='Sup3r-s3cret Tail-34b dbname=test",
                "postgresql://u@127.0.0.1/test?password=Sup3r-s3cret&bogus=Tail-34b"):
        result = CliRunner().invoke(cli, ["stats", "--database-url", url])
        assert result.exit_code == 1 and result.output.startswith(
            "Error: cannot connect to" if "bogus" in url else "Error: cannot parse the database URL"), result.output
        assert "Sup3r" not in result.output and ("bogus" in url or "Tail-34b" not in result.output), result.output


@pytest.mark.parametrize("text, expected", [
    ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
    ("postgresql+psycopg://u:p%40ss@h:5432/db?sslmode=require", "postgresql://u:***@h:5432/db?sslmode=require"),
    ("postgresql://u@h/db?password=pw&sslpassword=key&application_name=x",
     "postgresql://u@h/db?application_name=x&password=***&sslpassword=***"),
    ("host=h user=u password=pw dbname=db", "host=h user=u password=*** dbname=db"),
    ("host=h password = 'p w \\' x' dbname=db", "host=h password = *** dbname=db"),
    ("host=h sslpassword='k' port=5", "host=h sslpassword=*** port=5"),
    ("connect with PGPASSWORD=pw psql", "connect with PGPASSWORD=*** psql"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
])
def test_redact_masks_every_form(text, expected):
    assert redact(text) == expected


def test_redact_masks_known_secrets_in_any_message():
    message = 'missing "=" after "Tail-34b" in connection info string'
    assert redact(message, secrets=["Tail-34b"]) == 'missing "=" after "***" in connection info string'
    assert redact("a pw b", secrets=["pw"]) == "a *** b" and redact("pwned", secrets=["pw"]) == "pwned"
    # a password that is also a word elsewhere in the message leaves the other words alone
    assert redact("cannot connect to postgresql://postgres@h/db as postgres", secrets=["postgres"]) == \
        "cannot connect to postgresql://***@h/db as ***"


@pytest.mark.parametrize("conninfo", [
    "host=db.example port=5433 user=app dbname=archive password='a b \\' c' sslmode=require",
    "host=/var/run/postgresql dbname=archive",
    "host=a,b port=5432,5433 dbname=archive target_session_attrs=read-write",
    "dbname=archive",
])
def test_a_libpq_connection_string_is_the_url_that_connects_the_same_way(conninfo):
    """What SQLAlchemy hands psycopg for the URL made of a connection string is that connection string."""
    from psycopg.conninfo import conninfo_to_dict

    engine = sa.create_engine(postgres_url(conninfo))
    _, options = engine.dialect.create_connect_args(engine.url)
    options.pop("context", None)
    assert conninfo_to_dict(make_conninfo("", **options)) == conninfo_to_dict(conninfo)
