"""Server settings that decide ingest speed at archive scale, recommended for a machine and checked.

PostgreSQL's defaults (128 MB of shared buffers, 1 GB of WAL between checkpoints, a checkpoint
every 5 minutes) suit a small database. An archive's ingest probes key indexes of many GB and
writes a fresh full-page image of every index page it touches after each checkpoint; both costs
fall sharply with a buffer cache that holds the hot indexes and with checkpoints that come
rarely. The embedded server (:func:`tune_embedded`) applies :func:`recommended` for its machine;
``simdb stats`` warns about a server below :data:`MINIMUMS`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import sqlalchemy as sa

#: Below these, ``simdb stats`` warns (in PostgreSQL's units: kB for memory, MB for WAL, s for time).
MINIMUMS = {"shared_buffers": 1024 * 1024, "max_wal_size": 4096, "checkpoint_timeout": 600}
_UNITS = {"shared_buffers": 8, "max_wal_size": 1, "checkpoint_timeout": 1}  # pg_settings units: 8kB, MB, s


def memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 4 * 2**30


def recommended(memory: int | None = None, compressions: Sequence[str] = ()) -> dict[str, str]:
    """Settings for a machine with ``memory`` bytes of RAM that mainly runs simdb: a quarter of it as
    shared buffers (at most 16 GB), rare checkpoints, compressed full-page images: lz4 where the server
    offers it (``compressions``, from :func:`wal_compressions`), since pglz (``on``) made index builds
    2.6x slower on 2 cores (3M rows: 4.1 s against 1.6 s with lz4 or none; merges 107 s -> 310 s at 10M)."""
    memory = memory or memory_bytes()
    buffers_mb = max(128, min(16 * 1024, memory // 4 // 2**20))
    return {"shared_buffers": f"{buffers_mb}MB", "effective_cache_size": f"{max(512, memory // 2 // 2**20)}MB",
            "max_wal_size": "16GB", "min_wal_size": "1GB", "checkpoint_timeout": "30min",
            "checkpoint_completion_target": "0.9", "wal_compression": "lz4" if "lz4" in compressions else "on",
            "maintenance_work_mem": f"{max(64, min(2048, memory // 16 // 2**20))}MB"}


def wal_compressions(connection: sa.Connection) -> list[str]:
    """The values this server accepts for ``wal_compression`` (lz4 and zstd only where it was built with them)."""
    return list(connection.execute(sa.text(
        "SELECT enumvals FROM pg_settings WHERE name = 'wal_compression'")).scalar() or [])


def current(connection: sa.Connection) -> dict[str, tuple[str, str | None]]:
    """(setting, unit) of the settings simdb cares about."""
    return {name: (row.setting, row.unit) for name, row in _settings(connection).items()}


def _settings(connection: sa.Connection) -> dict[str, sa.Row]:
    """name, setting, unit and accepted values (``enumvals``) of the settings simdb cares about, in one query."""
    names = sorted(set(recommended()) | set(MINIMUMS) | {"wal_compression"})
    return {row.name: row for row in connection.execute(sa.text(
        "SELECT name, setting, unit, enumvals FROM pg_settings WHERE name = ANY(:names)"), {"names": names})}


def warnings(connection: sa.Connection) -> list[str]:
    """One line per setting below :data:`MINIMUMS`, with the command that raises it."""
    rows = _settings(connection)
    found = {name: (row.setting, row.unit) for name, row in rows.items()}
    compressions = list(rows["wal_compression"].enumvals or []) if "wal_compression" in rows else []
    advice = recommended(compressions=compressions)
    lines = []
    for name, minimum in MINIMUMS.items():
        setting = found.get(name)
        if setting is None:
            continue
        value = int(setting[0]) * _UNITS[name]
        if value < minimum:
            lines.append(f"the server's {name} is {_human(name, value)}, below the {_human(name, minimum)} an archive "
                         f"needs to ingest at full speed; as a superuser: ALTER SYSTEM SET {name} = "
                         f"'{advice[name]}' (then {'restart' if name == 'shared_buffers' else 'reload'} the server)")
    compression = found.get("wal_compression", (advice["wal_compression"],))[0]
    if compression == "off":
        lines.append("the server's wal_compression is off: full-page images of the key indexes fill the WAL; as a "
                     f"superuser: ALTER SYSTEM SET wal_compression = '{advice['wal_compression']}' (then reload)")
    elif compression in ("on", "pglz") and advice["wal_compression"] == "lz4":
        lines.append("the server's wal_compression is pglz, which makes index builds (merges) about 2.6x slower "
                     "than lz4; as a superuser: ALTER SYSTEM SET wal_compression = 'lz4' (then reload)")
    return lines


def _human(name: str, value: int) -> str:
    if name == "shared_buffers":
        return f"{value / 1024:,.0f} MB"
    if name == "max_wal_size":
        return f"{value / 1024:,.0f} GB" if value >= 1024 else f"{value} MB"
    return f"{value // 60} min"


def tune_embedded(connection: sa.Connection) -> bool:
    """Apply :func:`recommended` to the embedded server (``ALTER SYSTEM``); True if anything changed.

    All but ``shared_buffers`` take effect at once (reload); ``shared_buffers`` from the server's next
    start (the embedded server stops when its last process exits)."""
    compressions, stored = connection.execute(sa.text(  # one round trip on every open of an embedded index
        "SELECT (SELECT enumvals FROM pg_settings WHERE name = 'wal_compression'), "
        "(SELECT json_agg(json_build_array(name, setting) ORDER BY seqno) FROM pg_file_settings "
        "WHERE sourcefile LIKE '%postgresql.auto.conf')")).one()
    wanted, stored = recommended(compressions=list(compressions or [])), dict(stored or [])
    changed = False
    for name, value in wanted.items():
        if stored.get(name) != value:
            connection.exec_driver_sql(f"ALTER SYSTEM SET {name} = '{value}'")
            changed = True
    if changed:
        connection.exec_driver_sql("SELECT pg_reload_conf()")
    return changed
