"""Benchmark: does a real model finish real tasks through the real loop?

Run by hand, against whatever the settings point at (Anthropic's API, or a local server):

    ANTHROPIC_BASE_URL=http://127.0.0.1:8080 ANTHROPIC_API_KEY=any MODEL_ID=local \\
        MAX_TOKENS=1024 API_TIMEOUT=600 python tests/bench_real.py --runs 3

It is a benchmark, not a test: it calls a real model, so pytest never collects it. Each task runs
K times, each time in a fresh temporary workspace, through the stage's own code in this process
(its loop, tools, fences and subagent, as a user's turn runs them). A run is completed only if
what is on disk says so: the file holds a program that prints the right number when this script
runs it, or the right number that only a file could tell. What the model says counts for nothing.
The stage's transcript (TRANSCRIPT, written outside the workspace) gives the model calls, the
tokens and whether a tool call the task needs was made.

One line per task: its name, completed N/K, then the means per run of model calls, tokens (all
the model read and wrote) and seconds. The screen of each run goes to a log (--logs FOLDER keeps
them); each retry line the stages showed is counted and its reasons listed at the end.
"""

import argparse
import contextlib
import importlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]


def hello_task(stage: str) -> dict:
    """Write a program and run it: the answer is only right if the file really computes it."""
    def prepare(workspace: Path) -> dict:
        numbers = {"a": random.randint(100, 999), "b": random.randint(100, 999)}
        numbers["prompt"] = (f"Use write_file to create hello.py, a Python program that prints "
                             f"the sum of {numbers['a']} and {numbers['b']}. Then use bash to run "
                             "python3 hello.py, and tell me what it printed.")
        return numbers

    def completed(workspace: Path, given: dict, calls: list) -> bool:
        program = workspace / "hello.py"
        if not program.is_file() or program.is_symlink():
            return False
        ran = any("hello.py" in json.dumps(call["input"]) for call in calls if call["name"] == "bash")
        printed = subprocess.run([sys.executable, "hello.py"], cwd=workspace, capture_output=True,
                                 text=True, timeout=30, check=False).stdout
        return ran and printed.strip() == str(given["a"] + given["b"])

    return {"name": f"write and run ({stage[:3]})", "stage": stage, "prepare": prepare,
            "completed": completed}


def task_reads_a_file() -> dict:
    """s04: a subagent must read a file to learn a number nobody could guess; the parent writes it."""
    def prepare(workspace: Path) -> dict:
        port = random.randint(20000, 29999)
        (workspace / "settings.ini").write_text(f"[server]\nhost = 127.0.0.1\nport = {port}\n")
        prompt = ("Use the task tool: ask a subagent to read settings.ini and report the server's "
                  "port. Then write that port number, alone, into port.txt.")
        return {"port": port, "prompt": prompt}

    def completed(workspace: Path, given: dict, calls: list) -> bool:
        answer = workspace / "port.txt"
        if not answer.is_file() or answer.is_symlink():
            return False
        asked = any(call["name"] == "task" and call["agent"] == "parent" for call in calls)
        child_read = any("settings.ini" in json.dumps(call["input"]) for call in calls
                         if call["agent"] != "parent")
        return asked and child_read and answer.read_text().strip() == str(given["port"])

    return {"name": "task reads a file (s04)", "stage": "s04_subagent", "prepare": prepare,
            "completed": completed}


TASKS = [hello_task("s02_tools"), hello_task("s03_safety"), task_reads_a_file()]


def set_up(stage, workspace: Path, max_calls: int | None, child_max_calls: int | None) -> None:
    """What main() does before the first prompt, for this process: the settings, the client."""
    stage.WORKDIR = workspace
    stage.API_TIMEOUT = stage.number_setting("API_TIMEOUT", 60)
    stage.API_RETRIES = stage.number_setting("API_RETRIES", 2, least=0)
    stage.MAX_TOKENS = stage.number_setting("MAX_TOKENS", 8000)
    stage.MAX_MODEL_CALLS = max_calls or stage.number_setting("MAX_MODEL_CALLS", 50)
    if child_max_calls and hasattr(stage, "SUBAGENT_MAX_CALLS"):
        stage.SUBAGENT_MAX_CALLS = child_max_calls
    stage.client = stage.make_client()


def transcript_facts(path: Path) -> tuple:
    """From a transcript: how many model calls, how many tokens, and every tool call run."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    tokens, calls = 0, []
    for line in lines:
        response = line.get("response") or {}
        usage = response.get("usage") or {}
        read = sum(usage.get(key) or 0 for key in ("input_tokens", "cache_read_input_tokens",
                                                   "cache_creation_input_tokens"))
        tokens += read + (usage.get("output_tokens") or 0)
        if response.get("stop_reason") == "max_tokens":
            continue  # a reply cut off: the stage runs none of its calls
        for block in response.get("content") or []:
            if block.get("type") == "tool_use":
                calls.append({**block, "agent": line.get("agent")})
    return len(lines), tokens, calls


def run_once(task: dict, logs: Path, number: int, limits: tuple) -> dict:
    stage = importlib.import_module(task["stage"])
    with tempfile.TemporaryDirectory() as folder:
        workspace = Path(folder)
        given = task["prepare"](workspace)
        transcript = logs / f"{task['stage']}-{number}.jsonl"
        screen = logs / f"{task['stage']}-{number}.log"
        os.environ["TRANSCRIPT"] = str(transcript)
        set_up(stage, workspace, *limits)
        started = time.monotonic()
        with open(screen, "w") as log, contextlib.redirect_stdout(log):
            stage.run_turn([], given["prompt"])
        seconds = time.monotonic() - started
        calls_made, tokens, calls = transcript_facts(transcript)
        done = task["completed"](workspace, given, calls)
    retries = [line.strip() for line in screen.read_text().splitlines() if "trying again" in line]
    return {"done": done, "calls": calls_made, "tokens": tokens, "seconds": seconds,
            "retries": retries}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each task (K)")
    parser.add_argument("--only", help="run only the tasks whose name contains this")
    parser.add_argument("--max-calls", type=int, help="MAX_MODEL_CALLS for this benchmark")
    parser.add_argument("--child-max-calls", type=int, help="SUBAGENT_MAX_CALLS (s04)")
    parser.add_argument("--logs", help="keep each run's screen and transcript in this folder")
    options = parser.parse_args()
    if not os.environ.get("ANTHROPIC_API_KEY"):
        sys.exit("set ANTHROPIC_API_KEY (any text for a local server), ANTHROPIC_BASE_URL, MODEL_ID")
    logs = Path(options.logs or tempfile.mkdtemp(prefix="bench_real-"))
    logs.mkdir(parents=True, exist_ok=True)
    where = os.environ.get("ANTHROPIC_BASE_URL") or "Anthropic's API"
    print(f"model {os.environ.get('MODEL_ID') or 'the stages default'} at {where}; "
          f"{options.runs} runs a task; screens and transcripts in {logs}")
    print(f"{'task':<26} {'completed':>12} {'calls/run':>10} {'tokens/run':>11} {'s/run':>8}")
    retries = []
    for task in TASKS:
        if options.only and options.only not in task["name"]:
            continue
        limits = (options.max_calls, options.child_max_calls)
        runs = [run_once(task, logs, number, limits) for number in range(1, options.runs + 1)]
        done = len([run for run in runs if run["done"]])
        calls, tokens, seconds = (sum(run[key] for run in runs) / len(runs)
                                  for key in ("calls", "tokens", "seconds"))
        print(f"{task['name']:<26} {f'completed {done}/{len(runs)}':>12} {calls:>10.1f} "
              f"{tokens:>11,.0f} {seconds:>8.1f}", flush=True)
        retries += [line for run in runs for line in run["retries"]]
    print(f"retry lines shown: {len(retries)}")
    for line in sorted(set(retries)):
        print(f"  {retries.count(line)} x {line}")


if __name__ == "__main__":
    main()
