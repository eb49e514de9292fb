"""Benchmark, not a test: what the wall costs one command, in an empty workspace and a full one.

    python tests/bench_wall.py

Each figure is the time run_bash("true") takes inside the wall: the walk of the workspace, the
mounts, bubblewrap's start and end. The full workspace holds 10,000 files in 100 folders, 2,000
of them hard links to files outside it, as a virtual environment made by uv has (it links its
packages from ~/.cache/uv). Times are the median of 15 runs of each, taken in turn (a busy
moment slows both), on this machine, now: a shared or slow machine shows bigger numbers, and that
is fine. The target: the full workspace costs at most four times the empty one.
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import s03_safety  # the stage is a script beside this folder, not a package

FILES, LINKS, FOLDERS, RUNS = 10_000, 2_000, 100, 15


def fill(workspace: Path, cache: Path) -> None:
    """FILES files in FOLDERS folders; the first LINKS are hard links to files in `cache`."""
    for number in range(FILES):
        folder = workspace / "site-packages" / f"package{number % FOLDERS}"
        folder.mkdir(parents=True, exist_ok=True)
        if number < LINKS:
            original = cache / f"module{number}.py"
            original.write_text("x = 1\n")
            os.link(original, folder / f"module{number}.py")
        else:
            (folder / f"module{number}.py").write_text("x = 1\n")


def seconds(workspace: Path) -> float:
    s03_safety.WORKDIR = workspace
    started = time.perf_counter()
    output = s03_safety.run_bash("true")
    assert output == "(no output)", output
    return time.perf_counter() - started


def main() -> None:
    problem = s03_safety.bwrap_problem()
    if problem:
        sys.exit(f"the wall cannot go up here: {problem}")
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as full, \
            tempfile.TemporaryDirectory() as cache:
        fill(Path(full), Path(cache))
        seconds(Path(full))  # the first command loads what later ones find in memory
        runs = [(seconds(Path(empty)), seconds(Path(full))) for _ in range(RUNS)]
        empty_ms = statistics.median(run[0] for run in runs) * 1000
        full_ms = statistics.median(run[1] for run in runs) * 1000
    print(f"an empty workspace:                      {empty_ms:6.1f} ms a command")
    print(f"{FILES:,} files, {LINKS:,} of them hard links:   {full_ms:6.1f} ms a command "
          f"({full_ms / empty_ms:.1f} times the empty one)")


if __name__ == "__main__":
    main()
