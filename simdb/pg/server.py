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
from dataclasses import dataclass
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


#: Settings read for :func:`huge_pages_warning` (absent where the server is older: ``huge_page_size`` from
#: PostgreSQL 14, ``shared_memory_size_in_huge_pages`` from 15, ``huge_pages_status`` from 17).
_HUGE_PAGES = ("huge_pages", "huge_pages_status", "huge_page_size", "shared_memory_size_in_huge_pages")


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
        machine_huge_pages() if on_this_machine(connection) else None)
    return lines + ([huge] if huge else [])


@dataclass(frozen=True)
class HugePages:
    """This machine's huge pages (``/proc/meminfo``): reserved for huge pages at all, free for a new program, and
    the size of each in kB."""

    total: int
    free: int
    size_kb: int


def huge_pages_warning(settings: dict[str, str], shared_buffers_kb: int, machine: HugePages | None) -> str | None:
    """A line when the server maps its shared buffers 4 kB at a time and could have huge pages, else None.

    Each backend maps every shared buffer it touches for the first time with a page fault of its own: a
    batch of new lookups into a 10M archive took 9,000-21,000 of them on a fresh connection and ran at
    5,000-6,100 queries/s, against 6,800-9,600 with huge pages (docs/performance.md). ``settings``:
    ``huge_pages``, ``huge_page_size``, ``shared_memory_size_in_huge_pages`` (PostgreSQL 15 on) and
    ``huge_pages_status`` (17 on); ``machine``: this machine's huge pages when the server runs on it, else None.

    Nothing is said below :data:`MINIMUMS`' shared buffers (the mapping costs little), before PostgreSQL 15 (no
    page count to give), with ``huge_pages = on`` (it has them), or where the size of the pages PostgreSQL
    counts is not this machine's. A server on another machine may be set ``off`` on purpose (a container
    without a hugetlb limit can die of SIGBUS with ``try``; a managed service gives no root): only PostgreSQL
    17's word that a server that asks for them (``try``) runs without them is passed on. On this machine,
    with ``try`` before 17, huge pages that another server holds cannot be told apart from free ones' lack."""
    needed = int(settings.get("shared_memory_size_in_huge_pages") or -1)
    mode, status = settings.get("huge_pages"), settings.get("huge_pages_status")
    if shared_buffers_kb < MINIMUMS["shared_buffers"] or needed <= 0 or mode == "on" or status == "on":
        return None  # (-1: no huge pages on the server's platform)
    cost = "each connection maps the shared buffers 4 kB at a time, which made new lookups about 1.5x slower"
    if machine is None:
        if mode == "try" and status == "off":
            return (f"the server runs without the huge pages it asks for (huge_pages = try): {cost}; on its "
                    f"machine, as root, reserve {needed:,} more (vm.nr_hugepages), then restart the server")
        return None
    size = int(settings.get("huge_page_size") or 0)  # kB; 0: the machine's default size
    if size and size != machine.size_kb:
        return None  # counted in pages of another size than /proc/meminfo's
    if machine.free >= needed:
        reserve = f"this machine has {machine.free:,} huge pages free, enough for its {needed:,}"
    else:
        wanted = machine.total - machine.free + needed  # the pages others hold, and the server's
        reserve = (f"as root, reserve {needed:,} huge pages for it: sysctl -w vm.nr_hugepages={wanted} (a line "
                   f"'vm.nr_hugepages = {wanted}' in /etc/sysctl.d/ keeps it)")
    if mode == "off":
        return (f"the server's huge_pages is off: {cost}; as a superuser: ALTER SYSTEM SET huge_pages = 'try'; "
                f"{reserve}; then restart the server")
    if status == "off" or (status is None and machine.total < needed):
        return f"the server runs without huge pages: {cost}; {reserve}; then restart the server"
    return None


def machine_huge_pages(meminfo: Path = Path("/proc/meminfo")) -> HugePages | None:
    """This machine's huge pages, None where it does not say (not Linux). Free: neither in use nor reserved by a
    running program (a server reserves its pages at start and uses them as it touches them)."""
    try:
        found = {name.strip(): int(value.split()[0]) for name, _, value in
                 (line.partition(":") for line in meminfo.read_text().splitlines())
                 if name.strip() in ("HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "Hugepagesize")}
        return HugePages(found["HugePages_Total"], found["HugePages_Free"] - found.get("HugePages_Rsvd", 0),
                         found["Hugepagesize"])
    except (OSError, ValueError, IndexError, KeyError):
        return None


def on_this_machine(connection: sa.Connection) -> bool:
    """Whether the server runs on this machine: the backend of this connection is a process here, reached by a
    Unix socket or a loopback address (an address alone is not enough: a tunnel or a proxy listens on loopback
    for a server elsewhere, and a PID alone could be another server's process here)."""
    pid, loopback = connection.execute(sa.text(
        "SELECT pg_backend_pid(), inet_server_addr() IS NULL OR host(inet_server_addr()) IN ('127.0.0.1', '::1')"
    )).one()
    try:
        return bool(loopback) and Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return False


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
