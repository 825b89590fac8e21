"""Server settings that decide ingest speed at archive scale, recommended for a machine and checked.

PostgreSQL's defaults (128 MB of shared buffers, 1 GB of WAL between checkpoints, a checkpoint
every 5 minutes) suit a small database. An archive's ingest probes key indexes of many GB and
writes a fresh full-page image of every index page it touches after each checkpoint; both costs
fall sharply with a buffer cache that holds the hot indexes and with checkpoints that come
rarely. The embedded server (:func:`tune_embedded`) applies :func:`recommended` for its machine;
``simdb stats`` warns about a server below :data:`MINIMUMS`, and about one whose shared buffers are mapped
without huge pages (:func:`huge_pages_warning`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

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


#: Settings read for :func:`huge_pages_warning` (``huge_pages_status`` from PostgreSQL 17 on; absent before).
_HUGE_PAGES = ("huge_pages", "huge_pages_status", "shared_memory_size_in_huge_pages")


def _settings(connection: sa.Connection) -> dict[str, sa.Row]:
    """name, setting, unit and accepted values (``enumvals``) of the settings simdb cares about, in one query."""
    names = sorted(set(recommended()) | set(MINIMUMS) | {"wal_compression", *_HUGE_PAGES})
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
    buffers = found.get("shared_buffers")
    huge = huge_pages_warning(
        {name: found[name][0] for name in _HUGE_PAGES if name in found},
        int(buffers[0]) * _UNITS["shared_buffers"] if buffers else 0,
        reserved_huge_pages() if _on_this_machine(connection) else None)
    return lines + ([huge] if huge else [])


def huge_pages_warning(settings: dict[str, str], shared_buffers_kb: int, reserved: int | None) -> str | None:
    """A line when the server maps its shared buffers in 4 kB pages, else None.

    Each backend maps every shared buffer it touches for the first time with a page fault of its own: a
    batch of new lookups into a 10M archive took 9,000-21,000 of them on a fresh connection, and ran at
    5,000-6,100 queries/s against 6,800-9,600 with huge pages, the same batch repeated at 9,000-11,500
    either way (docs/performance.md). ``settings``: ``huge_pages``, ``shared_memory_size_in_huge_pages``
    and, from PostgreSQL 17 on, ``huge_pages_status``; ``reserved``: the huge pages this machine reserves
    (``/proc/meminfo``) when the server runs on it, else None. Below :data:`MINIMUMS`' shared buffers the
    mapping costs little and nothing is said; with ``huge_pages = try`` on a PostgreSQL before 17 whose
    machine is not this one, whether it has them cannot be known, and nothing is said either."""
    needed = int(settings.get("shared_memory_size_in_huge_pages") or -1)
    if shared_buffers_kb < MINIMUMS["shared_buffers"] or needed <= 0:  # (-1: no huge pages on this platform)
        return None
    reserve = (f"reserve {needed:,} huge pages (as root: sysctl -w vm.nr_hugepages={needed}, and the same line "
               "in /etc/sysctl.d/ to keep it), then restart the server")
    cost = "each connection maps the shared buffers 4 kB at a time, which made new lookups about 1.5x slower"
    mode, status = settings.get("huge_pages"), settings.get("huge_pages_status")
    if mode == "off":
        return f"the server's huge_pages is off: {cost}; {reserve} after ALTER SYSTEM SET huge_pages = 'try'"
    if status == "off" or (status is None and reserved is not None and reserved < needed):
        why = "the server runs without huge pages" if status == "off" else \
            f"this machine reserves {reserved:,} huge pages, fewer than the {needed:,} the server's shared memory needs"
        return f"{why}: {cost}; {reserve}"
    return None


def reserved_huge_pages(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The huge pages this machine reserves (``HugePages_Total``), None where it does not say (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("HugePages_Total:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _on_this_machine(connection: sa.Connection) -> bool:
    """Whether the server listens on this machine (a Unix socket, or a loopback address)."""
    url = connection.engine.url
    host = url.host or url.query.get("host") or ""
    host = host[0] if isinstance(host, tuple) else host
    return host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")


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
