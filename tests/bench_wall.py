"""Benchmark, not a test (pytest collects only test_*.py): what the wall costs a command.

    python tests/bench_wall.py

It takes about three minutes on this machine's 2 cores, shared with other agents' tests (building
the workspaces is a minute of it; runs are few to keep it so), and prints four things.

1. What the wall costs `true`, run_bash("true"): making the layer, bubblewrap's start and end,
   and applying what changed (here nothing), in an empty workspace and in ones of 10,000 and
   200,000 files (one JavaScript project's node_modules), in folders of 100, a fifth of them
   hard links to files outside, as a virtual environment made by uv has. The first command of a
   session also searches the workspace for .env files, once: its figure is printed apart. The
   target (issue 30): the 200,000-file workspace costs at most 1.5 times the empty one.
2. Real work in the 200,000-file workspace (issue 41): `true`, a Python that writes 10,000 new
   files, and `grep -rc` over the 200,000 files, each run by this project (run_bash), by
   sandbox-runtime as a library (wrap, spawn, wait, clean up; its default-deny writes with the
   workspace allowed, no network) and by plain `bash -c` in the workspace. sandbox-runtime's
   column shows only where `srt` is installed: on PATH (`npm install -g`), or in node_modules
   of the folder this is run from (`npm install @anthropic-ai/sandbox-runtime`); it needs
   socat and ripgrep too.
3. What applying a change costs: 2,000 files in one folder, then 2,000 files spread over 500
   nested folders (issue 41's target: the deep costs about what the flat does, linear in the
   entries). The command's own run is printed apart from the applying.
4. What a bubblewrap mount alone costs `grep -rc` over the 200,000 files: a bind mount, the
   overlay the wall uses, and the ways that might bring the read-heavy figure within 1.25 times
   a bind mount (issue 41).

Times are medians (15 runs of `true`, 5 of the rest), the columns taken in turn, so a busy
moment slows all. The figures are this machine's, now: on a shared machine (other agents run
their tests on ours) they move from run to run, and the ratios within a row mean more than the
figures themselves.

What it would take to read within 1.25 times a bind mount. In two runs here (2 shared cores, the
load between 4 and 20), the wall's overlay alone read the 200,000 files in 1.5 and 1.9 times what
a bind mount took (1.57 s against 1.04 s; 1.35 s against 0.70 s): every command meets a new
overlay, and overlayfs makes its own inode and dentry for each path the first time it is asked
for it, in each new mount. What was measured, against the bind mount, in the same two runs:
- A read-only bind, for commands the filter knows only read (grep, cat, ls...): 0.92 and 0.97
  times, the one way that met the target in both. It stays safe where the filter is wrong (a
  write fails on the read-only mount; nothing passes the door unseen), but the filter must keep
  a list of programs that only read, and a command it misjudges fails where it would have worked.
- A lowerdir-only overlay (`--ro-overlay`, no upper folder; bubblewrap needs a second, empty,
  source): 2.1 and 2.6 times, worse: the cost is overlayfs's own inodes, not the upper folder.
- The same overlay read a second time (timed inside, so without bubblewrap's start and end):
  1.04 and 1.4 times. A mount reused across commands would help every command after the first,
  perhaps to the target, but a command would then see what earlier ones left in the layer: the
  layer must be applied and emptied under a live mount, a bigger change than the gain.
So, within 1.25 times for every command takes no overlay on the read path: a read-only bind for
what only reads. Not measured: overlayfs's mount options (bubblewrap passes none).
"""

import contextlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import s03_safety  # the stage is a script beside this folder, not a package

SIZES, RUNS, HEAVY_RUNS = [0, 10_000, 200_000], 15, 5
FILES = 200_000  # the workspace of the real work, of applying and of the mounts alone

# Makes `files` files in `levels` nested folders under made/ (the same number in each folder).
MAKE_FILES = """\
import os, sys
levels, files = int(sys.argv[1]), int(sys.argv[2])
folder = "made"
for level in range(levels):
    folder = os.path.join(folder, "d")
    os.makedirs(folder)
    for number in range(files // levels):
        with open(os.path.join(folder, f"f{number}.txt"), "w") as file:
            file.write("x\\n")
"""
READ = "grep -rc x . | wc -l"  # every file, and an output that stays short

# Runs each command it reads (a JSON string a line) in sandbox-runtime, as a program that uses it
# as a library would: wrap, spawn, wait, clean up. Answers each with its exit code and output.
SANDBOX_RUNTIME = """\
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
const [library, workspace] = process.argv.slice(2);
const { SandboxManager } = await import(library);
await SandboxManager.initialize({
  network: { allowedDomains: [], deniedDomains: [] },
  filesystem: { denyRead: [], allowWrite: [workspace], denyWrite: [] },
});
for await (const line of createInterface({ input: process.stdin })) {
  const wrapped = await SandboxManager.wrapWithSandbox(JSON.parse(line));
  const child = spawn(wrapped, { shell: true, cwd: workspace, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout.on("data", (chunk) => { output = (output + chunk).slice(-2000); });
  child.stderr.on("data", (chunk) => { output = (output + chunk).slice(-2000); });
  const code = await new Promise((resolve) => child.on("close", resolve));
  SandboxManager.cleanupAfterCommand();
  console.log(JSON.stringify({ code, output }));
}
await SandboxManager.reset();
"""


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


def make_files(levels: int, files: int) -> str:
    """A command that writes `files` new files in `levels` nested folders under made/."""
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(MAKE_FILES)} {levels} {files}"


def seconds(workspace: Path) -> float:
    s03_safety.WORKDIR = workspace
    started = time.perf_counter()
    output = s03_safety.run_bash("true")
    assert output == "(no output)", output
    return time.perf_counter() - started


def wall_for_true(folder: Path) -> Path:
    """Part 1: print what `true` costs in each workspace; return the biggest one."""
    workspaces = []
    for files in SIZES:
        workspace, cache = folder / f"w{files}", folder / f"c{files}"
        workspace.mkdir()
        cache.mkdir()
        fill(workspace, cache, files)
        workspaces.append(workspace)
    firsts = [seconds(workspace) for workspace in workspaces]  # the session's one search
    runs = [[seconds(workspace) for workspace in workspaces] for _ in range(RUNS)]
    medians = [statistics.median(run[index] for run in runs) * 1000 for index in range(len(SIZES))]
    print(f"What the wall costs `true` (median of {RUNS}):")
    for files, first, median in zip(SIZES, firsts, medians, strict=True):
        name = f"{files:,} files" if files else "an empty workspace"
        print(f"{name:>20}: {median:6.1f} ms a command ({median / medians[0]:.2f} times the empty "
              f"one); the session's first: {first * 1000:7.1f} ms")
    return workspaces[-1]


# -- part 2: real work, by this project, sandbox-runtime and plain bash --------------------------

def this_project(workspace: Path):
    """A runner: run_bash(command) in `workspace`; it fails if the command did or was refused."""
    def run(command: str) -> None:
        s03_safety.WORKDIR = workspace
        output = s03_safety.run_bash(command)
        assert "\n(" not in output, output  # an exit code, a stop, a path not kept
    return run


def plain_bash(workspace: Path):
    """A runner: `bash -c command` in `workspace`."""
    def run(command: str) -> None:
        subprocess.run(["bash", "-c", command], cwd=workspace, capture_output=True, check=True)
    return run


def srt_library() -> Path | None:
    """sandbox-runtime's library, where `srt` is installed: on PATH, or in ./node_modules."""
    srt = shutil.which("srt") or shutil.which("srt", path="node_modules/.bin")
    if srt is None or shutil.which("node") is None:
        return None
    library = Path(os.path.realpath(srt)).parent / "index.js"  # beside its cli.js, in dist/
    return library if library.is_file() else None


@contextlib.contextmanager
def sandbox_runtime(workspace: Path, folder: Path):
    """A runner: the command in sandbox-runtime, used as a library by one Node process for all
    the commands (as an agent would). None where it is not installed."""
    library = srt_library()
    if library is None:
        yield None
        return
    driver = folder / "sandbox_runtime.mjs"
    driver.write_text(SANDBOX_RUNTIME)
    node = subprocess.Popen(["node", str(driver), library.as_uri(), str(workspace)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(command: str) -> None:
        node.stdin.write(json.dumps(command) + "\n")
        node.stdin.flush()
        answer = node.stdout.readline()
        assert answer, "sandbox-runtime stopped (its error is above)"
        result = json.loads(answer)
        assert result["code"] == 0, result["output"]

    try:
        yield run
    finally:
        node.stdin.close()
        node.wait()


def timed(run, command: str, workspace: Path) -> float:
    """Seconds `run` takes for `command`; then what it made is removed, untimed."""
    started = time.perf_counter()
    run(command)
    elapsed = time.perf_counter() - started
    shutil.rmtree(workspace / "made", ignore_errors=True)
    return elapsed


def shown(seconds: float | None) -> str:
    if seconds is None:
        return "not installed"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def real_work(workspace: Path, folder: Path) -> None:
    """Part 2: print the table of issue 41, for this workspace."""
    rows = {"`true`": "true",
            "write 10,000 new files (python)": make_files(1, 10_000),
            f"`grep -rc` over the {FILES:,} files": READ}
    with sandbox_runtime(workspace, folder) as srt:
        columns = [this_project(workspace), srt, plain_bash(workspace)]
        for run in columns:  # once untimed: the session's search, Node's start
            if run:
                run("true")
        times = {row: [[] for _ in columns] for row in rows}
        for _ in range(HEAVY_RUNS):
            for row, command in rows.items():
                for index, run in enumerate(columns):
                    if run:
                        times[row][index].append(timed(run, command, workspace))
    print(f"\nReal work in the {FILES:,}-file workspace (median of {HEAVY_RUNS}; a machine shared "
          "with other agents' tests):\n")
    print("| command | this project | sandbox-runtime (as a library) | plain bash |")
    print("| --- | --- | --- | --- |")
    for row, columns_times in times.items():
        medians = [statistics.median(each) if each else None for each in columns_times]
        print(f"| {row} | {' | '.join(shown(median) for median in medians)} |")
    if srt is None:
        print("(sandbox-runtime: not installed; `npm install @anthropic-ai/sandbox-runtime` here, "
              "with socat and ripgrep)")


# -- part 3: applying a flat change and a deep one ------------------------------------------------

def applying(workspace: Path, command: str) -> tuple:
    """Seconds the command takes in the wall, and seconds apply_changes takes to bring it in."""
    s03_safety.WORKDIR = workspace
    with s03_safety.new_layer() as layer:
        started = time.perf_counter()
        output, stopped, code, _ = s03_safety.run_walled(command, layer)
        ran = time.perf_counter()
        not_kept = s03_safety.apply_changes(layer)
        applied = time.perf_counter()
    assert not stopped and not code and not not_kept, (output, stopped, code, not_kept)
    shutil.rmtree(workspace / "made")
    return ran - started, applied - ran


def deep_and_flat(workspace: Path) -> None:
    """Part 3: print what applying 2,000 files costs, in one folder and 500 folders deep."""
    changes = {"2,000 files in one folder": make_files(1, 2000),
               "2,000 files, 500 folders deep": make_files(500, 2000)}
    times = {name: [] for name in changes}
    for _ in range(HEAVY_RUNS):
        for name, command in changes.items():
            times[name].append(applying(workspace, command))
    print(f"\nApplying a change in the {FILES:,}-file workspace (median of {HEAVY_RUNS}):")
    for name, runs in times.items():
        ran = statistics.median(run for run, _ in runs)
        applied = statistics.median(applied for _, applied in runs)
        print(f"{name:>30}: applied in {shown(applied)} (the command ran in {shown(ran)})")


# -- part 4: a bubblewrap mount alone, reading the workspace --------------------------------------

AGAIN = "the overlay, read again (timed inside)"  # a second grep in the same mount


def mount_alone(workspace: Path, kind: str) -> float:
    """Seconds `grep -rc x .` takes in bubblewrap with the workspace mounted so, and nothing else
    of the wall. AGAIN times a second grep in the same mount, inside: no start or end."""
    layer = Path(tempfile.mkdtemp(prefix="bench-layer-", dir=s03_safety.layers_folder()))
    upper, work, empty = layer / "upper", layer / "work", layer / "empty"
    for made in (upper, work, empty):
        made.mkdir()
    place = str(workspace)
    overlay = ["--overlay-src", place, "--overlay", str(upper), str(work), place]
    mounts = {"a bind mount (--bind)": ["--bind", place, place],
              "a read-only bind (--ro-bind)": ["--ro-bind", place, place],
              "the wall's overlay (--overlay)": overlay,
              "a lowerdir-only overlay (--ro-overlay)":
                  ["--overlay-src", str(empty), "--overlay-src", place, "--ro-overlay", place],
              AGAIN: overlay}
    command = ["grep", "-rc", "x", "."]
    if kind == AGAIN:  # bash's time: in seconds, to stderr
        twice = "grep -rc x . >/dev/null; TIMEFORMAT=%R; time grep -rc x . >/dev/null"
        command = ["bash", "-c", twice]
    argv = [s03_safety.bwrap(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--unshare-all", *mounts[kind], "--chdir", place, "--", *command]
    try:
        started = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        elapsed = time.perf_counter() - started
    finally:
        s03_safety.remove_layer(layer)
    assert done.returncode == 0, done.stderr
    return float(done.stderr.split()[-1]) if kind == AGAIN else elapsed


def mounts_alone(workspace: Path) -> None:
    """Part 4: print what each mount costs `grep -rc` over the workspace, against a bind mount."""
    kinds = ["a bind mount (--bind)", "a read-only bind (--ro-bind)",
             "the wall's overlay (--overlay)", "a lowerdir-only overlay (--ro-overlay)", AGAIN]
    times = {kind: [] for kind in kinds}
    for _ in range(HEAVY_RUNS):
        for kind in kinds:
            times[kind].append(mount_alone(workspace, kind))
    medians = {kind: statistics.median(each) for kind, each in times.items()}
    bind = medians["a bind mount (--bind)"]
    print(f"\n`grep -rc x .` over {FILES:,} files in bubblewrap, the mount alone (median of "
          f"{HEAVY_RUNS}; the target: within 1.25 times a bind mount):")
    for kind, median in medians.items():
        print(f"{kind:>40}: {shown(median)} ({median / bind:.2f} times a bind mount)")


def main() -> None:
    problem = s03_safety.bwrap_problem()
    if problem:
        sys.exit(f"the wall cannot go up here: {problem}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        workspace = wall_for_true(Path(folder))
        real_work(workspace, Path(folder))
        deep_and_flat(workspace)
        mounts_alone(workspace)
    print(f"\n(all this took {(time.perf_counter() - started) / 60:.1f} minutes)")


if __name__ == "__main__":
    main()
