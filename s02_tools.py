#!/usr/bin/env python3
"""s02_tools.py - a tool set, dispatched by name.

    tool_use {name, input} --> arguments checked against the tool's schema
                                   |
                         TOOL_HANDLERS[name](**input)
          bash | read_file | write_file | edit_file | list_dir
                                   |
    tool_result <-- text, or is_error with a message the model can act on

Key insight: the loop is the same as in s01. A new tool is a schema the model reads plus a plain
function a table points to; whatever the model sends (a bad name, a missing argument, a failing
tool), it gets a tool_result back.

Map: THE LESSON: new here: the idea (TOOLS, dispatch, check_args), the file tools, their hardening
(check_kind, read_start, write_atomically); then s01's loop and bash, and TOOL_HANDLERS; THE
MACHINERY, to skip on a first reading: the screen, the wire, start-up (main).
"""

import contextlib
import difflib
import functools
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_MODEL = "claude-sonnet-5-5"
MAX_TOKENS = 8000  # the longest reply one call may write
BASH_TIMEOUT = 120  # seconds
MAX_OUTPUT = 50_000  # characters of tool output sent back to the model
MAX_EDIT = 10 * 2**20  # bytes: edit_file holds a file in memory twice
API_TIMEOUT = 60  # seconds the server may stay silent (while streaming: between two pieces)
API_RETRIES = 2  # more tries the SDK gives a call that timed out, lost its connection, 429, 5xx
MAX_MODEL_CALLS = 50  # model calls one turn may make (a weak model may never stop)
WORKDIR = Path.cwd()
STAGE = "s02"
client = None  # built by main(), never at import: importing a stage has no side effects

# == THE LESSON ===================================================================================
# -- new in s02: a tool is a schema the model reads and a function, looked up by name --------------

TOOLS = [{
    "name": "bash",
    "description": "Run a shell command in the workspace and return its output.",
    "input_schema": {"type": "object", "required": ["command"],
                     "properties": {"command": {"type": "string"}}},
}, {
    "name": "read_file",
    "description": "Read a UTF-8 text file. `limit` keeps only the first N lines.",
    "input_schema": {"type": "object", "required": ["path"],
                     "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}}},
}, {
    "name": "write_file",
    "description": "Create or overwrite a file with `content`, creating missing folders.",
    "input_schema": {"type": "object", "required": ["path", "content"],
                     "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
}, {
    "name": "edit_file",
    "description": "Replace `old_text`, which must occur exactly once in the file, by `new_text`.",
    "input_schema": {"type": "object", "required": ["path", "old_text", "new_text"],
                     "properties": {"path": {"type": "string"}, "old_text": {"type": "string"},
                                    "new_text": {"type": "string"}}},
}, {
    "name": "list_dir",
    "description": "List a folder (default: the workspace); folders end with '/'.",
    "input_schema": {"type": "object", "required": [],
                     "properties": {"path": {"type": "string"}}},
}]

def dispatch(block) -> dict:
    """Run the tool a tool_use block names. Whatever the model sent, answer with a tool_result."""
    schemas = {tool["name"]: tool["input_schema"] for tool in TOOLS}
    if block.name not in schemas:
        return tool_result(block, f"error: no tool {block.name!r}; the tools: {', '.join(schemas)}",
                           True)
    if not isinstance(block.input, dict):
        return tool_result(block, "error: a tool's arguments must be an object", True)
    args = {name: value for name, value in block.input.items() if value is not None}  # null: unset
    problem = check_args(schemas[block.name], args)
    if problem:
        return tool_result(block, f"error: {block.name}: {problem}", True)
    try:
        return tool_result(block, TOOL_HANDLERS[block.name](**args))
    except Exception as error:  # noqa: BLE001 - a failing tool is news for the model, not a crash
        return tool_result(block, f"error: {type(error).__name__}: {error}", True)

def check_args(schema: dict, args: dict) -> str | None:
    """What is wrong with the model's arguments for a tool, or None if they fit its schema."""
    for name in schema["required"]:
        if name not in args:
            return f"missing required argument {name!r}"
    for name, value in args.items():
        if name not in schema["properties"]:
            return f"unexpected argument {name!r}; it takes {', '.join(schema['properties'])}"
        wanted = schema["properties"][name].get("type")
        types = JSON_TYPES.get(wanted) if isinstance(wanted, str) else None  # a list: unchecked
        if types and type(value) not in types:  # type(), not isinstance(): True is an int too
            return f"argument {name!r} must be of type {wanted}, not {type(value).__name__}"
    return None

JSON_TYPES = {"string": [str], "integer": [int], "number": [int, float], "boolean": [bool],
              "array": [list], "object": [dict], "null": [type(None)]}  # as JSON is read

# -- the file tools: plain functions (TOOL_HANDLERS, after run_bash, names them) -------------------

def read_file(path: str, limit: int | None = None) -> str:
    file = WORKDIR / path
    check_kind(file, path)
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    try:  # text mode completes a character split between two reads; newline="" keeps \r\n
        with open(file, encoding="utf-8", newline="") as opened:
            text = read_start(opened, limit)
            more = opened.read(1) != ""
        if "\0" in text:  # in what was read: the rest is never read
            raise UnicodeError
    except UnicodeError:
        problem = f"{path} is a binary or non-UTF-8 file ({file.stat().st_size:,} bytes); not shown"
        raise ValueError(problem) from None
    if not more:
        return text
    left = file.stat().st_size - len(text.encode())  # not read: the file's size says how much
    return text + ("" if text.endswith("\n") else "\n") + f"... [{left} more bytes not shown]"

def write_file(path: str, content: str) -> str:
    file = WORKDIR / path
    if file.exists():
        check_kind(file, path)
    file.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(file, content)
    return f"wrote {len(content):,} characters to {path}"

def edit_file(path: str, old_text: str, new_text: str) -> str:
    file = WORKDIR / path
    check_kind(file, path)
    if file.stat().st_size > MAX_EDIT:
        raise ValueError(f"{path} is over {MAX_EDIT:,} bytes; edit it with a command (sed)")
    text = file.read_bytes().decode("utf-8")  # bytes, so that \r\n line ends survive the edit
    if not old_text:
        raise ValueError("old_text is empty; give the exact text to replace")
    found = text.count(old_text)
    if found == 0:
        raise ValueError(f"old_text not found in {path}; read the file and copy the text exactly")
    if found > 1:
        raise ValueError(f"old_text occurs {found} times in {path}; add lines so it matches once")
    write_atomically(file, text.replace(old_text, new_text))
    return f"edited {path}"

def list_dir(path: str = ".") -> str:
    folder = WORKDIR / path
    check_kind(folder, path, "a folder")
    entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir())
    return cap("\n".join(entries)) or "(empty folder)"

# -- hardening: no file tool hangs, floods the context, or leaves a file half-written --------------

FILE_KINDS = [(stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"),
              (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]

def check_kind(file: Path, path: str, wanted: str = "a regular file") -> None:
    """Refuse anything but a regular file (or a folder, for list_dir) before opening it: a FIFO
    waits for a writer forever, and a device such as /dev/zero never ends."""
    mode = file.stat().st_mode
    kind = next((name for is_kind, name in FILE_KINDS if is_kind(mode)), "a special file")
    if kind != wanted:
        raise ValueError(f"{path} is {kind}, not {wanted}")

def read_start(opened, limit: int | None) -> str:
    """The first `limit` lines (all if None) of an open file, never over MAX_OUTPUT characters."""
    lines, size = [], 0
    while (limit is None or len(lines) < limit) and size < MAX_OUTPUT:
        line = opened.readline(MAX_OUTPUT - size)  # a size, so that one endless line is cut too
        if not line:
            break
        lines.append(line)
        size += len(line)
    return "".join(lines)

def write_atomically(file: Path, text: str) -> None:
    """Write a new file beside `file`, then rename it over `file` in one step: until then the old
    file is untouched, and a hard link's other name keeps the old content."""
    target = file.resolve()  # through a symlink, as open() goes: the file it points to is replaced
    if target.exists() and not os.access(target, os.W_OK):
        raise PermissionError(f"{file} is read-only")
    temp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        with open(temp, "x", encoding="utf-8", newline="") as out:  # newline="": exactly as given
            if target.exists():  # keep its permission bits (a script stays executable), but
                os.chmod(temp, target.stat().st_mode & 0o777)  # drop setuid, setgid
            out.write(text)
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename: a crash cannot leave it empty
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise

# -- from s01: the loop, and bash ------------------------------------------------------------------

def agent_loop(messages: list) -> str:
    """Call the model and run the tools it asks for until it stops; return its final text."""
    for _ in range(MAX_MODEL_CALLS):
        response = call_model(messages)
        final_text = take_reply(messages, response)
        if final_text is not None:
            return final_text
    raise TurnFailed(f"the model made {MAX_MODEL_CALLS} calls without finishing (MAX_MODEL_CALLS)")

def call_model(messages: list):
    """One call: the whole conversation goes out; the reply's text streams onto the screen."""
    request = {
        "model": os.environ.get("MODEL_ID") or DEFAULT_MODEL,
        "system": system_prompt(),
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": {"type": "auto"},  # the API's default; some compatible servers need it
        "max_tokens": MAX_TOKENS,
        "cache_control": {"type": "ephemeral"},  # each call re-sends the history: cache it
    }
    response = stream_reply(client.messages.stream(**request), request)  # the API call
    show_usage(response.usage)
    return response

TURN_ENDERS = {  # stop reasons after which the turn cannot go on
    "refusal": "the model declined this request (refusal); rephrase it and try again",
    "model_context_window_exceeded": "the conversation outgrew the context window; start anew",
}

def take_reply(messages: list, response) -> str | None:
    """Add the reply to the history; return its final text, or None to call the model again."""
    stop = response.stop_reason
    if stop in TURN_ENDERS:
        raise TurnFailed(TURN_ENDERS[stop])
    add_reply(messages, response.content)
    calls = [block for block in response.content if block.type == "tool_use"]
    if stop == "max_tokens":
        show("(the reply was cut off at max_tokens)", grey=True)
    if stop == "max_tokens" and calls:  # a cut-off call may have lost arguments: never run it
        cut = "error: not run: your reply was cut off at max_tokens. Try a shorter call."
        messages.append({"role": "user", "content": [tool_result(b, cut, True) for b in calls]})
        return None
    if calls:  # stop_reason "tool_use"; some compatible servers say "end_turn" and mean it too
        messages.append({"role": "user", "content": [run_tool(block) for block in calls]})
        return None
    if stop == "pause_turn":
        return None  # the API paused a long turn: sending the history back resumes it
    return text_of(response.content)

def run_turn(messages: list, user_text: str) -> None:
    """One turn. If it fails, it is taken out of the history, which so stays valid; the session
    goes on."""
    start = len(messages)
    messages.append({"role": "user", "content": valid_utf8(user_text)})
    try:
        agent_loop(messages)
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001
        replies = [message["content"] for message in messages[start:] if message["role"] != "user"]
        tool_called = any(block.type == "tool_use" for reply in replies for block in reply)
        del messages[start:]
        changed = " (what its tools did is not undone)" if tool_called else ""
        show(f"\n{describe_error(error)}. The turn was dropped{changed}.")

def add_reply(messages: list, content: list) -> None:
    """Without empty text blocks (the API rejects them), and not at all if empty."""
    content = [block for block in content if block.type != "text" or block.text]
    if content:
        messages.append({"role": "assistant", "content": content})
    else:
        show("(the model sent an empty reply)", grey=True)

def system_prompt() -> str:
    return valid_utf8(f"You are a coding agent working in {WORKDIR}. Use the tools to inspect "
                      "and change files, then answer briefly.")

class TurnFailed(Exception):
    """A turn that cannot go on; it is dropped from the history and the message shown."""

def run_tool(block) -> dict:
    show_tool_call(block)
    result = dispatch(block)
    show_tool_result(result)
    return result

def run_bash(command: str) -> str:
    """Run a shell command in WORKDIR; return its output and how it failed (a timeout raises)."""
    done = subprocess.run(["bash", "-c", command], cwd=WORKDIR, timeout=BASH_TIMEOUT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    output = cap(done.stdout.decode(errors="replace"))  # then the note, which is never cut
    if done.returncode != 0:
        output += f"\n(exit code {done.returncode})"
    return output or "(no output)"

TOOL_HANDLERS = {  # what each tool's name runs: here, once all its functions are defined
    "bash": run_bash,
    "read_file": read_file,
    "write_file": write_file,
    "edit_file": edit_file,
    "list_dir": list_dir,
}

def tool_result(block, text: str, is_error: bool = False) -> dict:
    return {"type": "tool_result", "tool_use_id": block.id, "content": valid_utf8(text),
            "is_error": is_error}

def cap(text: str) -> str:
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT] + f"\n... [{len(text) - MAX_OUTPUT} more characters cut]"

# == THE MACHINERY: the screen, the wire, start-up. Safe to skip on a first reading. =============

waiting = False  # a line ended in "\r" is on the screen: what comes next clears it first

def show(text: str, grey: bool = False, end: str = "\n", file=None) -> None:
    """All a stage prints, control characters escaped: an escape sequence can drive the terminal."""
    global waiting
    text = re.sub("[\x00-\x08\x0b-\x1f\x7f-\x9f]", lambda char: repr(char[0])[1:-1], text)
    if grey and sys.stdout.isatty() and not os.environ.get("NO_COLOR"):  # on a terminal only
        text = f"\033[2m{text}\033[0m"
    if waiting:  # a line that ended in a carriage return waits to be cleared (\033[K)
        text = "\033[K" + text
    waiting = end == "\r"
    print(text, end=end, file=file, flush=True)  # flush: a streamed piece shows at once

def shorten(line: str, width: int = 120) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"

def show_tool_call(block) -> None:
    arguments = block.input.values() if isinstance(block.input, dict) else [block.input]
    shown = " ".join(map(str, arguments)).replace("\n", " ")  # one line, however long the input
    show(f"> {block.name}: {shorten(shown)}", grey=True)

def show_tool_result(result: dict) -> None:
    """A glimpse (the model gets all of it): the first line, or after a failure the last lines,
    where the error is; then the notes a tool ends with, in brackets, which always show."""
    lines = [line for line in result["content"].splitlines() if line.strip()] or [""]
    printed = len(lines)
    while printed > 1 and lines[printed - 1].startswith("(") and lines[printed - 1].endswith(")"):
        printed -= 1  # a note: "(exit code 1)", "(not kept: ...)", "(stopped: ...)"
    notes = lines[printed:]
    ended_badly = [note for note in notes if note.startswith(("(exit code", "(stopped"))]
    failed = result["is_error"] or bool(ended_badly)
    glimpse = lines[:printed][-3:] if failed else lines[:1]
    for line in glimpse:
        show(f"  {shorten(line)}", grey=True)
    for note in notes:  # the tool's own words: whole, unless absurdly long
        show(f"  {shorten(note, 300)}", grey=True)
    if len(glimpse) < printed:
        show(f"  ({len(lines)} lines in all)", grey=True)

def context_tokens(usage) -> int:
    """All the model read for one call: new input, plus what it read from or wrote to the cache."""
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return usage.input_tokens + cached

def show_usage(usage) -> None:
    show(f"[context {context_tokens(usage):,} tokens, {usage.cache_read_input_tokens or 0:,} read "
         f"from cache; output {usage.output_tokens:,}]", grey=True)

def text_of(content) -> str:
    return "\n".join(block.text for block in content if block.type == "text")

def valid_utf8(text: str) -> str:
    """Python keeps bytes that are not UTF-8 as lone surrogates, which the API cannot take."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)

def stream_reply(stream, request: dict, **fields):
    """Open the stream (the SDK sends the request then), show its text as it comes, record it."""
    import anthropic  # loaded by make_client already
    if sys.stdout.isatty():  # a slow server may think for minutes; what comes next clears it
        show("(waiting for the model)", grey=True, end="\r")
    with recorded(request, **fields) as call, stream as events:
        try:
            for text in events.text_stream:
                show(text, end="")
            call["response"] = events.get_final_message()
        except anthropic.APIStatusError:  # an error event in the stream: the server's own words
            raise
        except Exception as error:  # noqa: BLE001 - SDK 2 wraps a gap (APITimeoutError); 0.x: not
            cause = error.__cause__ if isinstance(error, anthropic.APIConnectionError) else error
            raise TurnFailed(broke_off(cause or error, events.response.headers)) from None
        finally:  # the transcript keeps what streamed of a reply cut off (the SDK asserts: none)
            with contextlib.suppress(AssertionError):
                call["response"] = call["response"] or events.current_message_snapshot
        if text_of(call["response"].content):
            show("")  # end the line the text streamed onto
        show_written_call(call["response"], request["tools"])
        if call["response"].stop_reason is None:  # the stream ended before its stop reason
            raise TurnFailed("the reply stopped midway (the server closed the stream)")
    return call["response"]

def show_written_call(response, tools: list) -> None:
    """A small model may write a tool call as JSON text, which its server does not take for one:
    the agent seems to do nothing. Say so; never run it (the lesson is tool_use)."""
    if any(block.type == "tool_use" for block in response.content):
        return
    text = text_of(response.content)
    for brace in re.finditer("{", text):
        with contextlib.suppress(ValueError):  # no JSON starts at this brace
            call = json.JSONDecoder().raw_decode(text, brace.start())[0]  # always an object
            arguments = call.get("arguments", call.get("parameters"))
            if call.get("name") in [tool["name"] for tool in tools] and isinstance(arguments, dict):
                show(f"(the model wrote a {call['name']} call as text, not as a tool call: try a "
                     "model that can call tools, or the server's tool-call settings)", grey=True)
                return

def broke_off(error: Exception, headers) -> str:
    """Why a stream failed: the SDK says only "timed out", or asserts when no events came at all."""
    sent = headers.get("content-type") or "no content type"
    if not sent.startswith("text/event-stream"):
        return (f"the server did not answer with the Messages API's stream of events (it sent "
                f"{sent}); check ANTHROPIC_BASE_URL")
    slow = "Timeout" in type(error).__name__  # the HTTP library's ReadTimeout: a gap too long
    hint = "raise API_TIMEOUT for a slow server" if slow else "check ANTHROPIC_BASE_URL, MODEL_ID"
    return f"the reply broke off ({shorten(str(error) or type(error).__name__, 100)}); {hint}"

SESSION = os.urandom(4).hex()  # each transcript line names its run of the stage...
turn_number = 0  # ...and your turn, counted here

@contextlib.contextmanager
def recorded(request: dict, **fields):
    """Record a model call in TRANSCRIPT, also one that fails or is cut short by Ctrl-C."""
    global turn_number
    if "agent" not in fields and isinstance(request["messages"][-1]["content"], str):
        turn_number += 1  # a parent's call after what you typed (a string; tool results: a list)
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": None,
            "session": SESSION, "turn": turn_number, "agent": "parent", "stage": STAGE, **fields,
            "request": request, "response": None}
    started = time.monotonic()
    try:
        yield line
    except BaseException as error:
        line["error"] = describe_error(error)
        raise
    finally:
        line["seconds"] = round(time.monotonic() - started, 3)
        save_transcript(json.dumps(line, default=lambda sdk_object: sdk_object.model_dump(
            mode="json", exclude_none=True)) + "\n")

def save_transcript(text: str) -> None:
    """Append text to TRANSCRIPT, if set; if it cannot, say so and stop recording."""
    path = os.environ.get("TRANSCRIPT")
    if not path:
        return
    try:
        file = transcript_file(path)
        file.write(text)
        file.flush()  # a line is on disk at once, for a viewer and for a session that crashes
    except OSError as error:
        del os.environ["TRANSCRIPT"]
        show(f"cannot write TRANSCRIPT={path} ({error.strerror or error}); recording is off")

@functools.cache  # opened once: what a command later does to the name (a link, a rename) is moot
def transcript_file(path: str):
    """TRANSCRIPT, open to append: only a regular file, and never through a link, in its name or
    its folders. (The model can put a link to ~/.bashrc in its place, or a FIFO, which would hang
    a plain open(), or make its folder a link to the home folder.)"""
    folder = os.path.dirname(path) or "."
    if os.path.realpath(folder) != os.path.abspath(folder):  # O_NOFOLLOW sees the last part only
        raise OSError(f"a link leads to its folder; name the folder {os.path.realpath(folder)}")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    descriptor = os.open(path, flags, 0o600)  # 0o600: it holds the whole conversation
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError("it is not a regular file")
    return open(descriptor, "a", encoding="utf-8")

def describe_error(error: BaseException) -> str:
    """What ended a turn (or a model call), in one line naming the setting to check."""
    import anthropic  # loaded by make_client already
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, anthropic.APIConnectionError):  # the error it chains says why
        slow = isinstance(error, anthropic.APITimeoutError)  # not a refused port or unknown host
        hint = ", or raise API_TIMEOUT for a slow server" if slow else ""
        return (f"API error: cannot reach {error.request.url} ({error.__cause__ or error}); "
                f"check ANTHROPIC_BASE_URL{hint}")
    if isinstance(error, anthropic.APIStatusError):
        request = f", request {error.request_id}" if error.request_id else ""  # many servers: none
        text = f"API error {error.status_code} ({server_said(error)}){request}"
        url = error.request.url  # the base URL and the path the SDK adds: /v1/messages
        if error.status_code in (401, 403, 404, 405, 501):  # a setting; a 400: the request itself
            text += f"; check ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and MODEL_ID (tried {url})"
        if "/v1/v1/" in str(url):  # OpenAI-style servers' habit: a base URL ending in /v1
            text += "; drop the /v1 that ANTHROPIC_BASE_URL ends in: the SDK adds it"
        return text
    return str(error) if isinstance(error, TurnFailed) else f"{type(error).__name__}: {error}"

def server_said(error) -> str:
    """An error body's type and message (old SDKs lack fields for them), or a page's words."""
    details = error.body.get("error") if isinstance(error.body, dict) else None
    if isinstance(details, dict):
        return f"{details.get('type')}: {details.get('message')}"
    page = re.sub("<title>.*</title>", "", error.response.text)  # its heading says it again
    words = re.sub("<[^>]*>", " ", page).split()  # each <tag> becomes a space
    return shorten(" ".join(words), 100) or "no message"

MISSING_KEY = f"""\
No API key: set ANTHROPIC_API_KEY in the environment, or in .env beside this script (copy
.env.example). A compatible provider also needs ANTHROPIC_BASE_URL and MODEL_ID; a local server
(see the README) takes a placeholder key. A scripted demo, no key: python tests/demo.py {STAGE}"""

def make_client():
    """The API client. (The SDK, imported here, takes seconds: main's checks come first.)"""
    import anthropic
    hooks = {"request": [show_retry], "response": [note_answer]}  # called on each try
    return anthropic.Anthropic(base_url=base_url(), timeout=API_TIMEOUT, max_retries=API_RETRIES,
                               http_client=anthropic.DefaultHttpxClient(event_hooks=hooks))

last_try = {}  # how the SDK's last try went (see make_client and note_step)

def show_retry(request) -> None:
    """The SDK retries by itself, silently, and numbers its tries in a header: say each retry,
    and how the last try ended (the SDK keeps its error to itself until the last try)."""
    retry = request.headers.get("x-stainless-retry-count", "0")
    if retry != "0":
        ended = last_try.get("ended", "failed")
        show(f"(the last try {ended}; trying again, {retry} of {API_RETRIES})", grey=True)
    last_try.clear()
    request.extensions["trace"] = note_step  # the HTTP client reports each step of this try

def note_answer(response) -> None:
    last_try["ended"] = f"got HTTP {response.status_code}"

def note_step(step: str, info: dict) -> None:
    """How a try failed. A server may close a connection kept open between calls as the next
    request goes out: that is not a server that did not answer."""
    error = info.get("exception")
    if step == "connection.connect_tcp.started":
        last_try["new connection"] = True
    elif step.endswith(".failed") and "Timeout" in type(error).__name__:
        last_try["ended"] = f"got no answer within API_TIMEOUT ({API_TIMEOUT}s)"
    elif step.endswith(".failed") and "new connection" not in last_try:
        last_try["ended"] = "failed: the server closed the connection kept open from the last call"
    elif step.endswith(".failed"):
        last_try["ended"] = f"failed ({error})"

def base_url() -> str:  # empty means unset (as in a copied .env.example); not so to the SDK
    return os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"

SETTINGS = ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "MODEL_ID", "TRANSCRIPT", "API_TIMEOUT",
            "API_RETRIES", "MAX_TOKENS", "MAX_MODEL_CALLS", "NO_COLOR"]

def show_unknown_settings() -> None:
    """A mistyped setting would be ignored without a word: name each key that looks like one."""
    for name in sorted(os.environ):  # the keys of .env too, once loaded
        near = difflib.get_close_matches(name, SETTINGS, n=1, cutoff=0.85)
        if name not in SETTINGS and (near or name.startswith("ANTHROPIC_")):
            guess = f"; did you mean {near[0]}?" if near else ""
            show(f"({name} is not one of {STAGE}'s settings{guess})", grey=True)

def number_setting(name: str, default: int, least: int = 1) -> int:
    """A whole number from the environment, or `default` if unset; one that cannot work stops."""
    value = os.environ.get(name, "").strip()
    if value and not (value.isdecimal() and int(value) >= least):
        raise ValueError(f"{name}={value!r} cannot work: write a whole number, {least} or more")
    return int(value) if value else default

def main() -> int:
    global client, API_TIMEOUT, API_RETRIES, MAX_TOKENS, MAX_MODEL_CALLS
    from dotenv import load_dotenv  # here: a missing package is said plainly (see the end)
    sys.stdout.reconfigure(errors="replace")  # a character the terminal cannot show prints as "?"
    load_dotenv(Path(__file__).with_name(".env"))  # beside the script, never in a folder above
    show_unknown_settings()
    try:  # a setting that cannot work is one line now, not a failure at each call
        API_TIMEOUT = number_setting("API_TIMEOUT", API_TIMEOUT)
        API_RETRIES = number_setting("API_RETRIES", API_RETRIES, least=0)
        MAX_TOKENS = number_setting("MAX_TOKENS", MAX_TOKENS)
        MAX_MODEL_CALLS = number_setting("MAX_MODEL_CALLS", MAX_MODEL_CALLS)
        if not re.fullmatch(r"https?://[^/:]+(:[0-9]+)?(/.*)?", base_url()):  # http(s)://host:port
            raise ValueError(f"ANTHROPIC_BASE_URL={base_url()!r} is not a URL: write it as "
                             "http://host:port or https://host")
        if not os.environ.get("ANTHROPIC_API_KEY"):
            raise ValueError(MISSING_KEY)
    except ValueError as problem:
        show(str(problem), file=sys.stderr)
        return 2
    client = make_client()
    save_transcript("")  # can it be written? If not, it says so now and recording is off
    model = os.environ.get("MODEL_ID") or DEFAULT_MODEL
    show(f"model {model} at {base_url().rstrip('/')}", grey=True)
    show("commands run unfenced: with your rights, anywhere you can write (s03 walls them in)")
    readline = None  # on a terminal only: it holds the line being typed
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not every Python has it
            import readline  # input() gets line editing; Up recalls earlier lines
    messages, warned = [], False
    while True:
        try:
            user_text = input(f"{STAGE} >> ")
        except EOFError:
            show("")
            return 0
        except KeyboardInterrupt:
            show("")
            if readline and readline.get_line_buffer():  # as in bash: Ctrl-C throws the line away
                warned = False
            elif warned:
                return 0
            else:  # on an empty line it asks once before leaving
                show("(press Ctrl-C again or type q to leave)", grey=True)
                warned = True
            continue
        warned = False
        if user_text.strip().lower() in ("q", "exit", "quit"):
            return 0
        if user_text.strip():
            run_turn(messages, user_text)

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the prompt came (loading the SDK takes seconds)
        sys.exit(130)
    except ModuleNotFoundError as missing:  # started outside the virtual environment
        sys.exit(f"{missing.name} is not installed for {sys.executable}: activate the virtual "
                 "environment (. .venv/bin/activate), or pip install -r requirements.txt")
