"""Watch a stage work with no API key:  python tests/demo.py s01   (or s02, s03, s04)
Add --wire to see what goes over the wire: per model call, what its request adds to that
agent's previous one, and the reply (--wire-full prints every request and reply whole).
--html run.html writes a page of the run (see tests/view.py); --png picture.png takes a
picture of that page (it needs chromium).

The MODEL IS SCRIPTED: its replies are written below, not generated. Everything else is real:
the stage's loop, tools, fences and subagent run on a throwaway workspace and talk to the
scripted model over HTTP through the anthropic SDK, exactly as they would talk to the API.
"""

import argparse
import collections
import importlib
import itertools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import browser
import view
from fake_api import FakeAPI, as_json, estimate_tokens, reply, tool

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
                  "storage.py keeps them as JSON."),
        ]),
    ],
}


def make_workspace(folder: Path) -> None:
    for name, text in SAMPLE_PROJECT.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def show_full_wire(transcript: Path, seen: int, messages: list) -> int:
    """Print the transcript lines after the first `seen` whole, then the message list;
    return the new count of lines."""
    lines = transcript.read_text().splitlines() if transcript.exists() else []
    for line in lines[seen:]:
        call = json.loads(line)
        print(f"\n--- {call['agent']} request ---\n{json.dumps(call['request'], indent=2)}")
        print(f"--- {call['agent']} response ---\n{json.dumps(call['response'], indent=2)}")
    print(f"\n--- the message list after this turn ---\n{json.dumps(as_json(messages), indent=2)}")
    return len(lines)


def one_line(value, width: int = 100) -> str:
    """A value on one line, cut to `width` characters."""
    words = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    words = words.replace("\n", "\\n")
    return words if len(words) <= width else words[:width - 3] + "..."


def block_lines(block: dict) -> list:
    """A content block in a line or a few: its type, then what matters in it."""
    kind = block.get("type")
    if kind == "text":
        return [f"text: {one_line(block.get('text', ''))}"]
    if kind == "tool_use":
        arguments = one_line(block.get("input"), 80)
        return [f"tool_use {block.get('name')} {block.get('id')}: {arguments}"]
    if kind == "tool_result":
        text = view.result_text(block)
        lines = [line for line in text.splitlines() if line.strip()] or [""]
        error = " is_error" if block.get("is_error") else ""
        shown = [f"  {one_line(line)}" for line in lines[:3]]
        more = [f"  (+{len(lines) - 3} more lines)"] if len(lines) > 3 else []
        return [f"tool_result {block.get('tool_use_id')}{error}:", *shown, *more]
    return [f"{kind}: {one_line(block)}"]


def tool_line(tool: dict) -> str:
    """A tool's name, its arguments (? when optional) and the start of its description."""
    schema = tool.get("input_schema", {})
    required = schema.get("required", [])
    names = [name if name in required else name + "?" for name in schema.get("properties", {})]
    return f"  {tool.get('name')}({', '.join(names)}): {one_line(tool.get('description', ''), 60)}"


def show_request_once(request: dict) -> None:
    """What an agent sends on every call and does not change: its settings and its tools."""
    settings = {key: value for key, value in request.items()
                if key not in ("system", "messages", "tools")}
    print(f"settings: {json.dumps(settings)}")
    print(f"tools ({len(request.get('tools', []))}; --wire-full shows their schemas):")
    print("\n".join(tool_line(tool) for tool in request.get("tools", [])))


def show_new_messages(call: dict) -> None:
    """The messages of a request that the agent's previous request did not hold, block by block."""
    count = len(view.messages_of(call))
    print(f"sent: {count} message{'' if count == 1 else 's'}, new since this agent's last call:")
    new = call["new"]
    if call["repeats_reply"]:
        print(f"  {'assistant':<10} (its reply above)")
        new = new[1:]
    for message in new:
        role = message.get("role")
        for block in view.blocks_of(message.get("content")):
            first, *rest = block_lines(block)
            print(f"  {role:<10} {first}")
            for line in rest:
                print(f"  {'':<10} {line}")
            role = ""  # the role is shown on the message's first block only


def show_new_calls(transcript: Path, seen: int, messages: list) -> int:
    """Print each model call after the first `seen`: only what its request adds to that agent's
    previous one (the system prompt and tools once per agent), then the reply. Return the new
    count of calls."""
    calls = view.read_calls(transcript.read_text().splitlines() if transcript.exists() else [])
    view.build_lanes(calls)
    for call in calls[seen:]:
        print(f"\n--- call {call['number']}: {call['lane']['name']} ---")
        if call["system_shown"]:
            print(f"system prompt: {call['request'].get('system')}")
        if call["tools_shown"]:
            show_request_once(call["request"])
        if call["dropped"]:
            print(f"({call['dropped']} earlier messages are no longer sent)")
        show_new_messages(call)
        if call["response"] is None:
            print(f"got no reply: {call['error'] or 'the call failed'}")
            continue
        usage = view.usage_of(call)
        print(f"got back: stop_reason {call['response'].get('stop_reason')}, "
              f"context {view.context_size(call):,} tokens "
              f"({usage['cache_read_input_tokens']:,} from cache), "
              f"output {usage['output_tokens']:,}")
        for block in view.reply_blocks(call):
            print("\n".join(f"  {line}" for line in block_lines(block)))
    size = sum(estimate_tokens(message) for message in as_json(messages))
    print(f"\n--- the parent's message list now: {len(messages)} messages, ~{size:,} tokens ---")
    return len(calls)


def describe(message: dict) -> list:
    """A message as [role, block types, estimated tokens]."""
    blocks = view.blocks_of(message.get("content"))
    kinds = collections.Counter(block.get("type") for block in blocks)
    types = ", ".join(kind if count == 1 else f"{kind} x{count}" for kind, count in kinds.items())
    return [message.get("role"), types, estimate_tokens(message)]


def message_list_column(name: str, held: list) -> list:
    """One column of the side-by-side view: a title, a header, a row per message."""
    rows = [describe(message) for message in held]
    total = sum(size for _, _, size in rows)
    column = [f"{name}: {len(rows)} messages, ~{total:,} tokens",
              f"{'':>2} {'role':<9} {'blocks':<17} ~tokens"]
    for number, (role, types, size) in enumerate(rows, start=1):
        column.append(f"{number:>2} {role:<9} {types[:17]:<17} {size:>7,}")
    return column


def show_message_lists(messages: list, transcript: Path) -> None:
    """The parent's message list and each child's, side by side: role, block types, size.
    A child's list is its last request's messages plus its last reply, rebuilt from the transcript:
    the stage itself threw it away."""
    lanes = view.build_lanes(view.read_calls(transcript.read_text().splitlines()))
    columns = [message_list_column("parent (kept)", as_json(messages))]
    for lane in lanes[1:]:
        last = lane["calls"][-1]
        held = view.messages_of(last)
        if last["response"]:
            held = [*held, {"role": "assistant", "content": last["response"]["content"]}]
        columns.append(message_list_column(f"{lane['name']} (thrown away)", held))
    print("\n=== the message lists at the end "
          "(~tokens: characters / 4; system prompt and tools not shown) ===")
    for row in itertools.zip_longest(*columns, fillvalue=""):
        print("   ".join(f"{cell:<38}" for cell in row).rstrip())


def show_parent_growth(transcript: Path) -> None:
    """What the parent's context grew by from its first call to its second, and of what: its own
    reply (its text and the task call) and the task's result, the child's summary."""
    [parent, *_] = view.build_lanes(view.read_calls(transcript.read_text().splitlines()))
    first, second = parent["calls"][:2]
    reply, result = view.messages_of(second)[len(view.messages_of(first)):]
    grew = view.context_size(second) - view.context_size(first)
    print(f"\nThe parent's context grew by {grew:,} tokens from its first call to its second, of which")
    print(f"  ~{estimate_tokens(reply):,} are its own reply (its text and the task call)")
    print(f"  ~{estimate_tokens(result):,} are the task's result (the child's summary)")
    print("and none are the child's reading.")


def run_demo(short_name: str, wire: str = "", html: Path | None = None,
             keep: Path | None = None, page_is_kept: bool = True) -> None:
    """Play the stage's session: the real stage code, a scripted model, a throwaway workspace.
    The stage's own TRANSCRIPT feature records each call. `wire` prints the calls after each turn:
    "new" what each adds, "full" every request and reply whole. `html` writes a page of the run
    (see tests/view.py), and says where unless it is not kept; `keep` keeps a copy of the
    transcript."""
    stage = importlib.import_module(STAGES[short_name])
    session = SESSIONS[short_name]
    print(f"=== {STAGES[short_name]}.py demo: the model is SCRIPTED (no API key, no network); the stage code is real ===")
    user_transcript = os.environ.get("TRANSCRIPT")
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as wire_folder, \
            FakeAPI([r for _, replies in session for r in replies]) as api:
        make_workspace(Path(folder))
        stage.WORKDIR, stage.client = Path(folder), api.client()
        transcript, seen = Path(wire_folder) / "wire.jsonl", 0
        os.environ["TRANSCRIPT"] = str(transcript)  # the demo's own; the user's is put back below
        show_wire = {"new": show_new_calls, "full": show_full_wire}.get(wire)
        try:
            messages = []
            for typed, _ in session:
                print(f"\n{stage.STAGE} >> {typed}")
                stage.run_turn(messages, typed)
                if show_wire:
                    seen = show_wire(transcript, seen, messages)
        finally:
            if user_transcript is None:
                del os.environ["TRANSCRIPT"]
            else:
                os.environ["TRANSCRIPT"] = user_transcript
        if short_name == "s04":
            show_message_lists(messages, transcript)
            show_parent_growth(transcript)
        if keep:
            shutil.copyfile(transcript, keep)
        if html:
            page = view.write_page(transcript, html)
            if page_is_kept:
                print(f"\nThe picture of this run: {page} (open it in a browser)")
        elif short_name == "s04":
            print(f"\nSee this run as a page: python tests/demo.py {short_name} --html run.html")
    print("\n=== end of the scripted demo. With a key in .env, run the stage itself to talk to a real model. ===")


def main(argv: list) -> int:
    about = __doc__.splitlines()[0]
    parser = argparse.ArgumentParser(prog="python tests/demo.py", description=about)
    parser.add_argument("stage", choices=STAGES)
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--wire", action="store_const", const="new", dest="wire", default="",
                       help="per model call, what it adds to that agent's previous one")
    shown.add_argument("--wire-full", action="store_const", const="full", dest="wire",
                       help="every request and reply whole")
    parser.add_argument("--html", type=Path, metavar="PAGE.html", help="write a page of the run")
    parser.add_argument("--png", type=Path, metavar="PICTURE.png",
                        help="and a picture of it (needs chromium)")
    try:
        options = parser.parse_args(argv)
    except SystemExit as stop:  # argparse has printed the usage
        return stop.code
    if not options.png:
        run_demo(options.stage, options.wire, options.html)
        return 0
    with tempfile.TemporaryDirectory() as folder:  # a page is needed for the picture
        page = options.html or Path(folder) / "run.html"
        run_demo(options.stage, options.wire, page, page_is_kept=page == options.html)
        problem = browser.screenshot_problem(page, options.png)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    print(f"A picture of the page: {options.png}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # the reader left early (`| head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush
        sys.exit(1)
