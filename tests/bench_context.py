"""Benchmark: what delegating to a subagent saves, and what it costs, in tokens.

Run by hand: `python tests/bench_context.py`. A scripted model (no key, no network) reads N
files of a few KB in one user turn, once inline in s03 and once through s04's task tool. For each
N it prints the parent's context (the input of its last model call), and the tokens spent by all
the calls of the turn (every call's whole input, cached or not, plus its output), the child's
included. All figures are ESTIMATES: the scripted model counts one token per four characters of
the request's JSON, as tests/fake_api.py does; a real tokenizer gives other numbers.

Target: at N = 20 the delegating parent's context is under 10% of the inline one, and it
stays flat as N grows. The price: the child reads what the parent would have read, so the
turn as a whole spends a little more when it delegates.
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


def play_turn(stage, script: list, folder: Path) -> tuple:
    """Play one user turn against the script. Returns the parent's last context and the tokens spent
    by the parent's and the child's calls (each call's whole input plus its output)."""
    stage.WORKDIR, stage.client = folder, ScriptedClient(script)
    with contextlib.redirect_stdout(io.StringIO()):
        stage.run_turn([], "Read every module and tell me what they do.")
    calls = list(zip(stage.client.requests, script))  # the script's replies are handed out in order
    parent = [(request, answer) for request, answer in calls if request["system"] == stage.system_prompt()]
    child = [call for call in calls if call not in parent]
    return estimate_tokens(parent[-1][0]), spent(parent), spent(child)


def spent(calls: list) -> int:
    return sum(estimate_tokens(request) + estimate_tokens(answer["content"]) for request, answer in calls)


def inline(names: list) -> list:
    return [*[reply(tool("read_file", path=name)) for name in names], reply("Each module multiplies by its number.")]


def delegated(names: list) -> list:
    summary = f"{len(names)} modules; module_N.py defines function_N(x) returning x * N, repeated."
    return [reply(tool("task", prompt="Read every module_*.py and summarise what they do.", description="read modules")),
            *inline(names)[:-1], reply(summary), reply("Each module multiplies by its number.")]


def main() -> None:
    print(f"ESTIMATED tokens (characters / 4) of one turn that reads N files of {FILE_SIZE:,} characters")
    print(f"{'':>4} {'parent context (last call)':^32} {'spent by all calls of the turn':^39}".rstrip())
    print(f"{'N':>4} {'inline':>10} {'delegated':>11} {'ratio':>9} {'inline':>10} {'delegated':>11} {'of which child':>16}")
    for count in (5, 10, 20):
        with tempfile.TemporaryDirectory() as folder:
            names = make_files(Path(folder), count)
            inline_context, inline_spent, _ = play_turn(s03_safety, inline(names), Path(folder))
            context, parent_spent, child_spent = play_turn(s04_subagent, delegated(names), Path(folder))
        print(f"{count:>4} {inline_context:>10,} {context:>11,} {context / inline_context:>9.1%} "
              f"{inline_spent:>10,} {parent_spent + child_spent:>11,} {child_spent:>16,}")


if __name__ == "__main__":
    main()
