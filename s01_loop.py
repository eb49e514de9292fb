#!/usr/bin/env python3
"""s01_loop.py - the agent loop.

    you --> messages --> model --> reply
               ^                     |  stop_reason == "tool_use"?
               +-- tool_result <-- run the tools it asked for
                                     +-- anything else: show the text, your turn

Key insight: an agent is a loop around a model call. The model decides when it ends; the code
runs the tools it asks for and keeps every tool_use answered by a tool_result, whatever happens.

Map: THE LESSON: the loop (agent_loop, call_model, take_reply, run_turn), the tool (dispatch,
run_bash); THE MACHINERY, to skip on a first reading: the screen, the wire, start-up (main).
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
API_TIMEOUT = 60  # seconds the server may stay silent (while streaming: between two pieces)
API_RETRIES = 2  # more tries the SDK gives a call that timed out, lost its connection, 429, 5xx
MAX_MODEL_CALLS = 50  # model calls one turn may make (a weak model may never stop)
WORKDIR = Path.cwd()
STAGE = "s01"
client = None  # built by main(), never at import: importing a stage has no side effects

TOOLS = [{
    "name": "bash",
    "description": "Run a shell command in the workspace and return its output.",
    "input_schema": {"type": "object", "required": ["command"],
                     "properties": {"command": {"type": "string"}}},
}]

# == THE LESSON ===================================================================================

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

def dispatch(block) -> dict:
    """Run the tool a tool_use block names. Whatever the model sent, answer with a tool_result."""
    if block.name != "bash":
        return tool_result(block, f"error: no tool {block.name!r}; the only tool is bash", True)
    command = block.input.get("command") if isinstance(block.input, dict) else None
    if not isinstance(command, str):
        return tool_result(block, "error: bash needs an object with a 'command' string", True)
    try:
        return tool_result(block, run_bash(command))
    except subprocess.TimeoutExpired:  # it never finished: an error, which the model must see
        return tool_result(block, f"error: timed out after {BASH_TIMEOUT}s", True)

def run_bash(command: str) -> str:
    """Run a shell command in WORKDIR; return its output and how it failed (a timeout raises)."""
    done = subprocess.run(["bash", "-c", command], cwd=WORKDIR, timeout=BASH_TIMEOUT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    output = cap(done.stdout.decode(errors="replace"))  # then the note, which is never cut
    if done.returncode != 0:
        output += f"\n(exit code {done.returncode})"
    return output or "(no output)"

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
