"""Run the ``simdb`` CLI in a subprocess and sample its process tree with psutil: wall time, memory, CPU.

Shared by the benchmarks that measure the CLI end to end (bench_ingest_cli, bench_text, bench_memory,
bench_sources). Nothing here asserts anything about timings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

#: seconds between two samples of the process tree
INTERVAL = 0.2
#: how the sampling is described in the benchmarks' table headers
SAMPLING = (f"largest RSS of each process sampled every {INTERVAL:g} s with psutil (CLI process, or the kernel's exact "
            "peak where it ran alone; largest of its "
            "children: spawn fingerprint workers and the resource tracker) and the largest sampled sum of RSS over "
            "the tree (shared pages counted per process)")


@dataclass(frozen=True)
class ProcessRun:
    """What sampling a command's process tree found; memory in bytes, times in seconds."""

    seconds: float
    main: int  # peak RSS of the command's own process
    worker: int  # largest peak RSS among its descendants
    processes: int  # processes seen in the tree
    tree: int  # largest sampled sum of RSS over the tree
    quarters: tuple[int, int, int, int]  # the command's largest RSS in each quarter of the run: flat or growing?
    cpu_main: float  # CPU seconds (user + system) of the command's own process
    cpu_children: float  # CPU seconds of its descendants (each as last sampled: misses their last interval)


@dataclass
class _Samples:
    peaks: dict[int, int] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)
    tree_peak: int = 0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (seconds, RSS of the command's process)

    def take(self, root: psutil.Process, since: float) -> None:
        try:
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        total = 0
        for member in members:
            try:
                with member.oneshot():
                    rss = member.memory_info().rss
                    times = member.cpu_times()
            except psutil.Error:  # gone between the listing and the reading
                continue
            total += rss
            self.peaks[member.pid] = max(self.peaks.get(member.pid, 0), rss)
            self.cpu[member.pid] = max(self.cpu.get(member.pid, 0.0), times.user + times.system)
            if member.pid == root.pid:
                self.timeline.append((time.perf_counter() - since, rss))
        self.tree_peak = max(self.tree_peak, total)


def run_cli(command: list[str], log_path: str) -> ProcessRun:
    """Run ``command`` (output to ``log_path``), sampling its process tree every INTERVAL s until it exits; raise
    with the tail of its output if it fails."""
    with open(log_path, "w") as output:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        root, samples = psutil.Process(process.pid), _Samples()
        while True:  # reaped only here (the pid cannot be reused while it is sampled), by wait4 for its peak
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            samples.take(root, start)
            time.sleep(INTERVAL)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}:\n{tail}")
    workers = [peak for pid, peak in samples.peaks.items() if pid != process.pid]
    quarters = tuple(max((rss for at, rss in samples.timeline if q * seconds / 4 <= at < (q + 1) * seconds / 4),
                         default=0) for q in range(4))
    cpu_main = samples.cpu.get(process.pid, 0.0)
    main = samples.peaks.get(process.pid, 0)
    if not workers:  # the kernel's own peak (ru_maxrss, KiB): exact where no child's peak is folded into it
        main = max(main, usage.ru_maxrss * 1024)
    return ProcessRun(seconds=seconds, main=main, worker=max(workers, default=0),
                      processes=len(samples.peaks), tree=samples.tree_peak, quarters=quarters, cpu_main=cpu_main,
                      cpu_children=sum(samples.cpu.values()) - cpu_main)


def quarters(run: ProcessRun) -> str:
    return " / ".join(f"{q / 2**20:,.0f}" for q in run.quarters) + " MB"


def simdb_setup(arguments: list[str]) -> None:
    """``simdb ARGUMENTS`` run in this process, its output discarded: the set-up commands before a measured one
    (``init``, ``sync add``), which are not measured. In a subprocess each paid a Python start and simdb's imports
    (about a second of CPU, more than the command's own work on the tests' small inputs); raises with the
    command's output where it fails."""
    import time

    from click.testing import CliRunner

    from simdb.cli import cli

    done = CliRunner().invoke(cli, arguments, obj={"started": time.perf_counter()}, prog_name="simdb")
    if done.exit_code != 0:
        raise RuntimeError(f"simdb {' '.join(arguments)} exited with {done.exit_code}:\n{done.output[-3000:]}") \
            from done.exception


def simdb_command() -> list[str]:
    """The ``simdb`` CLI of this interpreter's environment."""
    script = Path(sys.executable).with_name("simdb")
    return [str(script)] if script.exists() else [sys.executable, "-c", "from simdb.cli import main; main()"]


__all__ = ["INTERVAL", "SAMPLING", "ProcessRun", "quarters", "run_cli", "simdb_command", "simdb_setup"]
