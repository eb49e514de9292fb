"""Benchmark: how soon does the user see the model's answer?

Run by hand: `python tests/bench_live.py`. For each stage, the local fake API (no key, no network)
writes a 3,000-character answer at 300 characters a second, as a model would, and the script
measures, from the moment the user pressed Enter, when the first words of the answer appear on
screen and when the last do.

Target: the first text within 10% of the answer's time. A stage that waits for the whole reply
before printing shows nothing for the full ten seconds.
"""

import contextlib
import importlib
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from fake_api import FakeAPI, reply

STAGES = ["s01_loop", "s02_tools", "s03_safety", "s04_subagent"]
ANSWER = " ".join(f"Sentence {n} of an answer the model writes a little at a time." for n in range(1, 60))[:3000]
SPEED = 300  # characters a second


class Clock(io.StringIO):
    """A terminal that notes when the answer's first and last characters are written."""

    def __init__(self, started: float):
        super().__init__()
        self.started, self.first, self.last = started, None, None

    def write(self, text: str) -> int:
        written = super().write(text)
        if ANSWER[:20] in self.getvalue() and self.first is None:
            self.first = time.monotonic() - self.started
        if ANSWER in self.getvalue() and self.last is None:
            self.last = time.monotonic() - self.started
        return written


def measure(name: str) -> tuple:
    stage = importlib.import_module(name)
    with tempfile.TemporaryDirectory() as folder, FakeAPI([reply(ANSWER)], chars_per_second=SPEED) as api:
        stage.WORKDIR, stage.client = Path(folder), api.client()
        clock = Clock(time.monotonic())
        with contextlib.redirect_stdout(clock):
            stage.run_turn([], "Tell me a long story.")
    return clock.first, clock.last


def main() -> None:
    print(f"a {len(ANSWER):,}-character answer written at {SPEED} characters a second")
    print(f"{'stage':<14} {'first text':>11} {'last text':>10} {'first / last':>13}")
    for name in STAGES:
        first, last = measure(name)
        print(f"{name:<14} {first:>10.2f}s {last:>9.2f}s {first / last:>13.1%}")


if __name__ == "__main__":
    main()
