"""Benchmark, not a test: what the wall costs one command, in an empty workspace and full ones.

    python tests/bench_wall.py

Each figure is the time run_bash("true") takes inside the wall: making the layer, bubblewrap's
start and end, and applying what changed (here nothing). The full workspaces hold 10,000 and
200,000 files (one JavaScript project's node_modules), in folders of 100, a fifth of them hard
links to files outside, as a virtual environment made by uv has. The first command of a session
also searches the workspace for .env files, once: its figure is printed apart. Times are the
median of 15 runs of each, taken in turn (a busy moment slows all), on this machine, now: a
shared or slow machine shows bigger numbers, and that is fine. The target (issue 30): the
200,000-file workspace costs at most 1.5 times the empty one.
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import s03_safety  # the stage is a script beside this folder, not a package

SIZES, RUNS = [0, 10_000, 200_000], 15


def fill(workspace: Path, cache: Path, files: int) -> None:
    """`files` files in folders of 100; every fifth a hard link to a file in `cache`."""
    for number in range(files):
        folder = workspace / "node_modules" / f"package{number // 100}"
        if number % 100 == 0:
            folder.mkdir(parents=True)
        if number % 5 == 0:
            original = cache / f"module{number}.js"
            original.write_text("module.exports = 1\n")
            os.link(original, folder / f"module{number}.js")
        else:
            (folder / f"module{number}.js").write_text("module.exports = 1\n")


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
    with tempfile.TemporaryDirectory() as folder:
        workspaces = []
        for files in SIZES:
            workspace, cache = Path(folder) / f"w{files}", Path(folder) / f"c{files}"
            workspace.mkdir()
            cache.mkdir()
            fill(workspace, cache, files)
            workspaces.append(workspace)
        firsts = [seconds(workspace) for workspace in workspaces]  # the session's one search
        runs = [[seconds(workspace) for workspace in workspaces] for _ in range(RUNS)]
    medians = [statistics.median(run[index] for run in runs) * 1000 for index in range(len(SIZES))]
    for files, first, median in zip(SIZES, firsts, medians, strict=True):
        name = f"{files:,} files" if files else "an empty workspace"
        print(f"{name:>20}: {median:6.1f} ms a command ({median / medians[0]:.2f} times the empty "
              f"one); the session's first: {first * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
