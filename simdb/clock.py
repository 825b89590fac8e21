"""How long this process has run: its start-up is part of what a command costs."""

from __future__ import annotations

import os


def process_age() -> float:
    """Seconds since this process started, as Linux's /proc says (0 where there is none): Python's start-up and
    imports, which take seconds on a busy machine, are part of what a command costs."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, since boot
        with open("/proc/uptime") as uptime:
            return max(0.0, float(uptime.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
