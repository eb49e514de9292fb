"""Watch a stage work with no API key:  python tests/demo.py s01   (or s02, s03, s04)
Add --wire to see what goes over the wire: each request and reply, and the message list after each turn.

The MODEL IS SCRIPTED: its replies are written below, not generated. Everything else is real:
the stage's loop, tools, fences and subagent run on a throwaway workspace and talk to the
scripted model over HTTP through the anthropic SDK, exactly as they would talk to the API.
"""

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from fake_api import FakeAPI, as_json, reply, tool

STAGES = {"s01": "s01_loop", "s02": "s02_tools", "s03": "s03_safety", "s04": "s04_subagent"}

SAMPLE_PROJECT = {
    "greet.py": 'def greet(name):\n    return f"Helo, {name}!"\n\n\nprint(greet("world"))\n',
    "src/storage.py": '"""Saves and loads notes as JSON files."""\n\n\ndef save(note): ...\n\n\ndef load(name): ...\n',
    "src/search.py": '"""Finds notes whose text contains every word of a query."""\n\n\ndef search(words): ...\n',
    "src/cli.py": '"""The command line: `notes add`, `notes find`."""\n\n\ndef main(): ...\n',
    "build/output.bin": "compiled\n",
}

# Each session is a list of (what the user types, what the scripted model does next).
SESSIONS = {
    "s01": [
        ("How many lines of Python are in this folder?", [
            reply("I'll count them with wc.", tool("bash", command="find . -name '*.py' | xargs wc -l")),
            reply("There are 4 Python files with 20 lines in all; src/storage.py is the longest."),
        ]),
    ],
    "s02": [
        ("greet.py prints a typo. Fix it and run it.", [
            reply(tool("read_file", path="greet.py")),
            reply("The greeting says 'Helo'.", tool("edit_file", path="greet.py", old_text="Helo", new_text="Hello")),
            reply(tool("bash", command="python3 greet.py")),
            reply("Fixed: greet.py now prints 'Hello, world!'."),
        ]),
    ],
    "s03": [
        ("Show me the machine's password file.", [
            reply(tool("read_file", path="../../../../etc/passwd")),
            reply("That path is outside the workspace. I'll try the shell.", tool("bash", command="sudo cat /etc/shadow")),
            reply("Both ways are fenced off: files outside the workspace and sudo are refused. I can't show it."),
        ]),
        ("Clean out the build folder.", [
            reply(tool("bash", command="rm -rf build/ && ls")),
            reply("Done: build/ is gone; greet.py and src/ remain."),
        ]),
    ],
    "s04": [
        ("What do the modules in src/ do?", [
            reply("I'll hand the reading to a subagent.", tool(
                "task", description="survey src/",
                prompt="Read every file in src/ and summarise, in one line each, what each module does.")),
            # the child's own conversation starts here
            reply(tool("list_dir", path="src")),
            reply(tool("read_file", path="src/cli.py"), tool("read_file", path="src/search.py"),
                  tool("read_file", path="src/storage.py")),
            reply("cli.py: the `notes add` / `notes find` commands. search.py: finds notes containing every word "
                  "of a query. storage.py: saves and loads notes as JSON files."),
            # back in the parent
            reply("src/ is a small notes app: cli.py is the command line, search.py finds notes by words, and "
                  "storage.py keeps them as JSON. Its context grew only by that summary."),
        ]),
    ],
}


def make_workspace(folder: Path) -> None:
    for name, text in SAMPLE_PROJECT.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def show_wire(transcript: Path, seen: int, messages: list) -> int:
    """Print the transcript lines after the first `seen`, then the message list; return the new count."""
    lines = transcript.read_text().splitlines() if transcript.exists() else []
    for line in lines[seen:]:
        call = json.loads(line)
        print(f"\n--- {call['agent']} request ---\n{json.dumps(call['request'], indent=2)}")
        print(f"--- {call['agent']} response ---\n{json.dumps(call['response'], indent=2)}")
    print(f"\n--- the message list after this turn ---\n{json.dumps(as_json(messages), indent=2)}")
    return len(lines)


def run_demo(short_name: str, wire: bool = False) -> None:
    """Play the stage's session: the real stage code, a scripted model, a throwaway workspace.
    With `wire`, the stage's own TRANSCRIPT feature records each call, and it is printed after each turn."""
    stage = importlib.import_module(STAGES[short_name])
    session = SESSIONS[short_name]
    print(f"=== {STAGES[short_name]}.py demo: the model is SCRIPTED (no API key, no network); the stage code is real ===")
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as wire_folder, \
            FakeAPI([r for _, replies in session for r in replies]) as api:
        make_workspace(Path(folder))
        stage.WORKDIR, stage.client = Path(folder), api.client()
        transcript, seen = Path(wire_folder) / "wire.jsonl", 0
        if wire:
            os.environ["TRANSCRIPT"] = str(transcript)
        try:
            messages = []
            for typed, _ in session:
                print(f"\n{stage.PROMPT}{typed}")
                stage.run_turn(messages, typed)
                if wire:
                    seen = show_wire(transcript, seen, messages)
        finally:
            if wire:
                del os.environ["TRANSCRIPT"]
    print("\n=== end of the scripted demo. With a key in .env, run the stage itself to talk to a real model. ===")


def main(argv: list) -> int:
    wire = "--wire" in argv
    names = [arg for arg in argv if arg != "--wire"]
    if len(names) != 1 or names[0] not in STAGES:
        print(f"usage: python tests/demo.py {{{','.join(STAGES)}}} [--wire]", file=sys.stderr)
        return 2
    run_demo(names[0], wire)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
