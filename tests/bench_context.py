"""Benchmark: how big does the parent's context get when it explores inline, or delegates?

Run by hand: `python tests/bench_context.py`. A scripted model (no key, no network) reads N
files of a few KB, once inline in s03 and once through s04's task tool, and the script prints
the parent's context (input tokens of its last model call) for each N.

Target: at N = 20 the delegating parent's context is under 10% of the inline one, and it
stays flat as N grows.
"""

import contextlib
import io
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from fake_api import ScriptedClient, estimate_tokens, reply, tool

import s03_safety
import s04_subagent

FILE_SIZE = 3000  # characters: "a few KB"


def make_files(folder: Path, count: int) -> list:
    names = []
    for n in range(count):
        name = f"module_{n:02d}.py"
        (folder / name).write_text(f"# module {n}\n" + f"def function_{n}(x):\n    return x * {n}\n" * (FILE_SIZE // 40))
        names.append(name)
    return names


def parent_context(stage, script: list, folder: Path) -> int:
    """Play one user turn against the script; return the size of the parent's last request."""
    stage.WORKDIR, stage.client = folder, ScriptedClient(script)
    with contextlib.redirect_stdout(io.StringIO()):
        stage.run_turn([], "Read every module and tell me what they do.")
    parent_requests = [r for r in stage.client.requests if r["system"] == stage.system_prompt()]
    return estimate_tokens(parent_requests[-1])


def inline(names: list) -> list:
    return [*[reply(tool("read_file", path=name)) for name in names], reply("Each module multiplies by its number.")]


def delegated(names: list) -> list:
    summary = f"{len(names)} modules; module_N.py defines function_N(x) returning x * N, repeated."
    return [reply(tool("task", prompt="Read every module_*.py and summarise what they do.", description="read modules")),
            *inline(names)[:-1], reply(summary), reply("Each module multiplies by its number.")]


def main() -> None:
    print(f"parent context (tokens) after reading N files of {FILE_SIZE:,} characters")
    print(f"{'N':>4} {'inline (s03)':>14} {'delegated (s04)':>16} {'ratio':>7}")
    for count in (5, 10, 20):
        with tempfile.TemporaryDirectory() as folder:
            names = make_files(Path(folder), count)
            inline_tokens = parent_context(s03_safety, inline(names), Path(folder))
            delegated_tokens = parent_context(s04_subagent, delegated(names), Path(folder))
        print(f"{count:>4} {inline_tokens:>14,} {delegated_tokens:>16,} {delegated_tokens / inline_tokens:>7.1%}")


if __name__ == "__main__":
    main()
