"""Benchmark, not a test: how long check_command takes on hostile input, and per KB.

    python tests/bench_filter.py

Each pattern is repeated to about 1, 2, 5 and 9.9 KB (just under MAX_LENGTH, the longest command
the filter reads) and to 100 KB (refused at once for its length: MAX_LENGTH is what bounds the
work of any input). The parser reads a line about twice and is stopped past four readings (its
error recovery can take more), and the filter walks the tree once (the code of bash -c and eval
again, at most MAX_DEPTH times), so the time per KB should stay flat as the input grows. Times
are the best of three, on this machine, now: a shared or slow machine shows bigger numbers.
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import s03_safety  # the stage is a script beside this folder, not a package

PATTERNS = {  # name -> (what comes first, what is repeated)
    "one long word": ("echo ", "a"),
    "a long path to delete": ("rm -rf ", "a/"),
    "nested evals": ("", "eval "),
    "nested $( in quotes": ('echo "', '$(echo "'),
    "function definitions": ("", "f(){ "),
    "assignments": ("", "A=1 "),
    "wrappers": ("", "nohup "),
    "find -exec": ("find . ", "-exec "),
    "heredocs without an end": ("", "cat <<E\n"),
    "heredocs with an end": ("", "cat <<E\nx\nE\n"),
    "operators": ("", ";|"),
    "brackets": ("", "["),
    "hashes in a word": ('""', "#"),
    "braces with commas": ("rm {", ","),
    "file names to delete": ("rm -rf ", "ab "),
    "paths outside to delete": ("rm ", "/a "),
    "option clusters": ("python3 -", "c"),
    "arithmetic": ("echo ", "$((1+2)) "),
    "quoted strings": ("echo ", "'a' "),
}
SIZES = [1_000, 2_000, 5_000, s03_safety.MAX_LENGTH - 100, 100_000]


def best_of_three(command: str) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        s03_safety.check_command(command)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    s03_safety.WORKDIR = Path(tempfile.mkdtemp())  # judged by spelling: nothing is written there
    worst = []
    print(f"{'pattern':26} " + " ".join(f"{size // 1000:>6} KB" for size in SIZES) + "   ms per KB at ~10 KB")
    for name, (head, repeated) in PATTERNS.items():
        seconds = []
        for size in SIZES:
            command = head + repeated * ((size - len(head)) // len(repeated))
            seconds.append(best_of_three(command))
        per_kb = seconds[-2] * 1000 / (SIZES[-2] / 1000)
        worst.append((max(seconds), name))
        print(f"{name:26} " + " ".join(f"{s * 1000:6.2f}ms" for s in seconds) + f"   {per_kb:.3f}")
    slowest, name = max(worst)
    print(f"\nworst case: {slowest * 1000:.1f} ms ({name}); every input over "
          f"{s03_safety.MAX_LENGTH:,} characters is refused before it is read")


if __name__ == "__main__":
    main()
