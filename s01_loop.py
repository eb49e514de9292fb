#!/usr/bin/env python3
"""s01_loop.py - the agent loop.

    you --> messages --> model --> reply
               ^                     |
               |                     |  stop_reason == "tool_use"?
               +-- tool_result <-- run the tools it asked for
                                     |
                                     +-- anything else: show the text, your turn

Key insight: an agent is a loop around a model call. The model decides when
the loop ends; the code only runs the tools it asks for and keeps the history
valid (every tool_use answered by a tool_result, whatever goes wrong).

Map: settings and the tool's schema; the loop (agent_loop, call_model,
take_reply, run_turn); the tool (run_bash, dispatch); what you see and the
wire (safe to skip on a first reading); start-up (main).
"""

import contextlib
import json
import logging
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from dotenv import load_dotenv  # the anthropic SDK: imported by make_client(), with a key

DEFAULT_MODEL = "claude-sonnet-5-5"
MAX_TOKENS = 8000  # the longest reply one call may write
BASH_TIMEOUT = 120  # seconds
MAX_OUTPUT = 50_000  # characters of tool output sent back to the model
# Seconds the server may stay silent (while streaming: between two events) before a try is given up.
API_TIMEOUT = 60
API_RETRIES = 2  # more tries the SDK gives a failed call: timeouts, lost connections, 429, 529, 5xx
MAX_MODEL_CALLS = 50  # model calls one turn may make before it is stopped (a weak model may loop)
# main() reads the four above from the environment or .env too: a slow local server needs a longer
# API_TIMEOUT, a small model that loops fewer MAX_TOKENS.
QUIET_SECONDS = 5  # a call still silent after this long says so
WORKDIR = Path.cwd()
STAGE = "s01"
PROMPT = f"{STAGE} >> "

# Built by main(), never at import, so that importing a stage has no side
# effects. Tests put a scripted model here.
client = None

# Each transcript line says which run of the stage (one random id per process) and which of your
# turns (run_turn counts them, from 1) it belongs to.
SESSION = secrets.token_hex(4)
turn_number = 0

TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command in the workspace and return its output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
]


# -- the loop: call the model, run the tools it asks for, until it stops ---------


def agent_loop(messages: list) -> str:
    """Call the model and run its tools until it stops; return its final text. A model that never
    stops (a weak one can loop) is stopped after MAX_MODEL_CALLS calls."""
    for _ in range(MAX_MODEL_CALLS):
        response = call_model(messages)
        show_usage(response.usage)
        final_text = take_reply(messages, response)
        if final_text is not None:
            return final_text
    raise TurnFailed(f"the model made {MAX_MODEL_CALLS} calls without finishing (MAX_MODEL_CALLS); "
                     "ask for a smaller step")


def call_model(messages: list):
    """The one place the API is called; the reply's text is printed as it arrives. Each call is
    recorded in the transcript, also one that fails or is cut short (Ctrl-C, a signal)."""
    request = {
        "model": os.environ.get("MODEL_ID") or DEFAULT_MODEL,
        "system": system_prompt(),
        "messages": messages,
        "tools": TOOLS,
        # The API's default, but some compatible servers offer no tools without it.
        "tool_choice": {"type": "auto"},
        "max_tokens": MAX_TOKENS,
        # Every call re-sends the whole conversation; caching makes the repeat cheap.
        "cache_control": {"type": "ephemeral"},
    }
    line = {"time": datetime.now(UTC).isoformat(), "seconds": None, "session": SESSION,
            "turn": turn_number, "agent": "parent", "request": request, "response": None}
    started = time.monotonic()
    try:
        line["response"] = stream_reply(request)
    except BaseException as error:  # recorded here, then passed on (run_turn handles it)
        line["error"] = describe_error(error)
        raise
    finally:
        line["seconds"] = round(time.monotonic() - started, 3)
        save_transcript(line)
    if text_of(line["response"].content):
        print()  # end the line the text streamed onto
    return line["response"]


def take_reply(messages: list, response) -> str | None:
    """Add the model's reply to the history and act on why it stopped.

    Returns the final text when the turn is over, or None when the model
    should be called again (its tools have run, or it was paused).
    """
    reason = response.stop_reason
    if reason == "refusal":
        raise TurnFailed("the model declined this request (refusal); rephrase it and try again")
    if reason == "model_context_window_exceeded":
        raise TurnFailed("the conversation no longer fits the model's context window; "
                         "start a new session")
    if reason is None:  # the stream ended before the server said why the reply stopped
        raise TurnFailed("the reply stopped midway (the server closed the stream); "
                         "check ANTHROPIC_BASE_URL")
    # The API rejects an empty text block sent back to it (some compatible servers write them),
    # and an empty assistant message would make every later request invalid.
    content = [block for block in response.content if block.type != "text" or block.text]
    if not content:
        print(dim("(the model sent an empty reply)"))
        content = [{"type": "text", "text": "(empty reply)"}]
    if messages[-1]["role"] == "assistant":  # the turn was paused: this reply continues it
        messages[-1]["content"] = [*messages[-1]["content"], *content]
    else:
        messages.append({"role": "assistant", "content": content})
    calls = [block for block in response.content if block.type == "tool_use"]
    if reason == "pause_turn":
        return None  # the API paused a long turn; sending it back as it is resumes it
    if reason == "max_tokens":
        print(dim("(the reply was cut off at max_tokens)"))
        if calls:  # a cut-off call may have lost arguments: answer it, never run it
            cut = "error: not run: your reply was cut off at max_tokens. Try a shorter call."
            results = [tool_result(block, cut, True) for block in calls]
            messages.append({"role": "user", "content": results})
            return None
    if reason == "tool_use" and calls:
        messages.append({"role": "user", "content": [run_tool(block) for block in calls]})
        return None
    return text_of(response.content)


def run_turn(messages: list, user_text: str) -> None:
    """One turn of the conversation. On any failure, drop the turn so the history stays valid."""
    global turn_number
    turn_number += 1  # the transcript says which turn each call belongs to
    start = len(messages)
    messages.append({"role": "user", "content": valid_utf8(user_text)})
    try:
        agent_loop(messages)
    # Nothing that goes wrong in a turn ends the session.
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001
        del messages[start:]
        print(f"\n{describe_error(error)}. This turn was dropped from the conversation "
              "(files it changed stay changed).")


def system_prompt() -> str:
    return valid_utf8(
        f"You are a coding agent working in {WORKDIR}. Use the tools to inspect "
        "and change files, then answer briefly."
    )


class TurnFailed(Exception):
    """A turn that cannot go on; it is dropped from the history and the message shown."""


# -- the tool: bash, and a tool_result for every tool_use -------------------------


def cap(text: str) -> str:
    """Cut text to MAX_OUTPUT characters, saying how much was cut."""
    if len(text) <= MAX_OUTPUT:
        return text
    return text[:MAX_OUTPUT] + f"\n... [{len(text) - MAX_OUTPUT} more characters cut]"


def run_bash(command: str) -> str:
    """Run a shell command in WORKDIR; return its output and any failure."""
    try:
        done = subprocess.run(
            ["bash", "-c", command], cwd=WORKDIR, timeout=BASH_TIMEOUT, check=False,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
    except subprocess.TimeoutExpired:
        return f"error: timed out after {BASH_TIMEOUT}s"
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        output += f"\n(exit code {done.returncode})"
    return cap(output) or "(no output)"


def tool_result(block, text: str, is_error: bool = False) -> dict:
    return {"type": "tool_result", "tool_use_id": block.id, "content": valid_utf8(text),
            "is_error": is_error}


def dispatch(block) -> dict:
    """Run the tool a tool_use block names. Whatever the model sent, answer with a tool_result."""
    if block.name != "bash":
        return tool_result(block, f"error: unknown tool {block.name!r}; the only tool is 'bash'",
                           True)
    if not isinstance(block.input, dict):
        kind = type(block.input).__name__
        problem = f"error: a tool's input must be an object of arguments, not {kind}"
        return tool_result(block, problem, True)
    command = block.input.get("command")
    if not isinstance(command, str):
        return tool_result(block, "error: bash needs a 'command' string", True)
    return tool_result(block, run_bash(command))


def run_tool(block) -> dict:
    """Run one tool call, showing the call and a glimpse of its result."""
    show_tool_call(block)
    result = dispatch(block)
    show_tool_result(result)
    return result


# -- what you see: calls, results and usage on the screen (safe to skip) ---------


def dim(text: str) -> str:
    """Grey on a terminal; plain in a pipe or a file, or when NO_COLOR is set."""
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        return f"\033[2m{text}\033[0m"
    return text


def count(number: int, thing: str) -> str:
    """A number and its noun: "1 line", "2 lines"."""
    return f"{number:,} {thing}" if number == 1 else f"{number:,} {thing}s"


def shorten(line: str, width: int = 120) -> str:
    """A line cut to `width` characters, ending with … when something was cut."""
    return line if len(line) <= width else line[:width - 1] + "…"


def show_tool_call(block) -> None:
    # Shown before it is checked: the input may be anything.
    arguments = block.input if isinstance(block.input, dict) else {"input": block.input}
    args = " ".join(str(value) for value in arguments.values()).replace("\n", " ")
    print(dim(f"> {block.name}: {shorten(args)}"))


def show_tool_result(result: dict) -> None:
    """A glimpse of a result (the model gets all of it): its first line; for an error or a failed
    command, its last lines, where a traceback says what went wrong."""
    # From stage 2 on, a tool that raises answers "error: PermissionError: refused, ...": drop the
    # Python words and keep the user's.
    text = re.sub(r"^error: \w+Error: ", "", result["content"])
    lines = [line for line in text.splitlines() if line.strip()] or [""]
    failed = result["is_error"] or lines[-1].startswith("(exit code")
    if not failed or len(lines) == 1:
        more = f" (+{count(len(lines) - 1, 'line')})" if len(lines) > 1 else ""
        print(dim(f"  {shorten(lines[0])}{more}"))
        return
    if len(lines) > 3:
        print(dim(f"  ({count(len(lines) - 3, 'line')} before)"))
    for line in lines[-3:]:
        print(dim(f"  {shorten(line)}"))


def context_tokens(usage) -> int:
    """All the model read for one call: new input, plus what it read from or wrote to the cache."""
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return usage.input_tokens + cached


def show_usage(usage) -> None:
    """One line per model call: how big the context is, and how much came from the cache."""
    cached = usage.cache_read_input_tokens or 0
    print(dim(f"[context {context_tokens(usage):,} tokens, {cached:,} read from cache; "
              f"output {usage.output_tokens:,}]"))


def text_of(content) -> str:
    return "\n".join(block.text for block in content if block.type == "text")


def valid_utf8(text: str) -> str:
    """Text the API can take. Python stands in for bytes that are not UTF-8 (in a file name, say)
    with lone surrogates, which cannot be sent; each becomes the replacement character."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


# -- the wire: streaming, the transcript, errors that name a cause (safe to skip) --


def stream_reply(request: dict):
    """Send the request and print the reply's text as it streams in; return the whole reply.
    A server still silent after QUIET_SECONDS is said to be so: one line, not a frozen screen."""
    waiting = threading.Timer(QUIET_SECONDS, print, [dim(
        f"(no answer yet; a try is given up after {API_TIMEOUT}s, API_TIMEOUT. Ctrl-C cancels)")])
    waiting.start()
    events = 0
    try:
        with client.messages.stream(**request) as stream:
            try:
                for event in stream:
                    waiting.cancel()  # the server is talking
                    events += 1
                    if event.type == "text":
                        print(event.text, end="", flush=True)
            except ValueError:  # the SDK could not parse a tool call's arguments (it quotes them)
                raise TurnFailed("a tool call's arguments are not valid JSON; try again, or check "
                                 "MODEL_ID (small models write broken calls)") from None
            if events == 0:  # the body held no server-sent events: nothing to build a reply from
                raise TurnFailed("the server answered a streamed request with plain JSON, not "
                                 "events; check ANTHROPIC_BASE_URL (the endpoint must stream)")
            return stream.get_final_message()
    finally:
        waiting.cancel()


def save_transcript(line: dict | None) -> None:
    """With TRANSCRIPT=file.jsonl set, append one JSON line per model call (the s01 note lists its
    fields). The key is not among them: the client sends it as a header. A file that cannot be
    written is said once and recording stops: a transcript is never worth a turn. main() calls
    this with None at start-up, to find that out before the first turn."""
    path = os.environ.get("TRANSCRIPT")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as file:
            if line is not None:
                as_plain = lambda sdk_object: sdk_object.model_dump(mode="json", exclude_none=True)
                file.write(json.dumps(line, default=as_plain) + "\n")  # the reply is an SDK object
    except OSError as error:
        del os.environ["TRANSCRIPT"]
        print(f"cannot write TRANSCRIPT={path} ({error.strerror or error}); recording is off")


def causes(error: BaseException):
    """The error, then each error behind it: the SDK's errors wrap the one that says why."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def why_unreachable(error: BaseException) -> str:
    """In words, why a try at reaching the server failed, from the errors behind the SDK's own."""
    for cause in causes(error):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused (nothing listens at that address and port)"
        if isinstance(cause, socket.gaierror):
            return "unknown host name"
        if isinstance(cause, ssl.SSLError):
            return f"TLS failed ({cause.reason}): the server may speak http, not https"
        if isinstance(cause, TimeoutError):
            return f"no answer for {API_TIMEOUT}s"
    deepest = list(causes(error))[-1]
    return str(deepest) or type(deepest).__name__


def server_said(error) -> str:
    """The type and message in an error body ({"error": {"type", "message"}}), or its text."""
    body = error.body if isinstance(error.body, dict) else {}
    details = body.get("error")
    if isinstance(details, dict) and details.get("message"):
        return f"{details.get('type', 'error')}: {details['message']}"
    return shorten(error.response.text.strip(), 200) or "no message"


def describe_error(error: BaseException) -> str:
    """What ended a turn (or a model call), in words, naming the setting to check."""
    import anthropic  # loaded by make_client already (see there), so this costs nothing
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, SystemExit):
        return "stopped by a signal (`timeout`, or the terminal was closed)"
    if isinstance(error, TurnFailed):
        return str(error)
    if isinstance(error, anthropic.APITimeoutError):
        return (f"API error: no answer in {API_TIMEOUT}s, {count(API_RETRIES + 1, 'time')}; "
                "check ANTHROPIC_BASE_URL, or raise API_TIMEOUT for a slow server")
    if isinstance(error, anthropic.APIConnectionError):
        return (f"API error: cannot reach {error.request.url}: {why_unreachable(error)}; "
                "check ANTHROPIC_BASE_URL")
    if isinstance(error, anthropic.APIStatusError):
        text = f"API error {error.status_code} ({server_said(error)})"
        if error.request_id:
            text += f", request {error.request_id}"
        if error.status_code in (400, 401, 403, 404):
            # From a proxy or a compatible provider these usually mean a wrong setting.
            text += "; check ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and MODEL_ID"
        return text
    if any(isinstance(cause, TimeoutError) for cause in causes(error)):  # not wrapped by the SDK
        return (f"API error: the reply stopped midway, nothing more for {API_TIMEOUT}s; "
                "check ANTHROPIC_BASE_URL, or raise API_TIMEOUT for a slow server")
    if isinstance(error, anthropic.APIError):
        return f"API error: {error}"
    return f"{type(error).__name__}: {error}"


# -- start-up ------------------------------------------------------------------


MISSING_KEY = """\
No API key: set ANTHROPIC_API_KEY, in the environment or in a .env file beside
this script (copy .env.example to .env and fill it in). For an
Anthropic-compatible provider also set ANTHROPIC_BASE_URL; MODEL_ID picks the
model. No key at all? `python tests/demo.py {stage}` shows this stage working
with a scripted model."""


class ShowRetries(logging.Handler):
    """Shows each retry as the SDK makes it, with its reason, from what the SDK logs (logger
    "anthropic"): at DEBUG level why a try failed, then "Retrying request to ... in N seconds"."""

    reason = "the try failed"

    def emit(self, record: logging.LogRecord) -> None:
        pattern = str(record.msg)  # the message before its %-arguments are filled in
        if record.exc_info:  # "Encountered Exception": the error of the try that failed
            self.reason = why_unreachable(record.exc_info[1])
        elif pattern == "Retrying due to status code %i":
            self.reason = f"the server answered {record.args[0]}"
        elif pattern.startswith("Retrying request to"):  # "... to %s in %f seconds"
            print(dim(f"(trying again in {record.args[1]:.1f}s: {self.reason})"), flush=True)


def base_url() -> str:
    # An empty ANTHROPIC_BASE_URL means "not set", which the SDK would not assume.
    return os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"


def endpoint() -> str | None:
    """The host (and port) of ANTHROPIC_BASE_URL, to show; None if it is not an http(s) URL."""
    parts = urlsplit(base_url())
    with contextlib.suppress(ValueError):  # a port that is not a number
        if parts.scheme in ("http", "https") and parts.hostname:
            return f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
    return None


def make_client():
    """Build the API client from the environment, or None when no key is set. The SDK is imported
    here, not at the top: importing it takes seconds, and the no-key message should not wait."""
    api_key = os.environ.get("ANTHROPIC_API_KEY")
    if not api_key:
        return None
    import anthropic
    sdk_log = logging.getLogger("anthropic")  # the SDK logs each retry here
    sdk_log.setLevel(logging.DEBUG)  # a retry's reason is logged at DEBUG level
    sdk_log.handlers = [ShowRetries()]  # one handler, however often a client is built
    sdk_log.propagate = False  # and only here: not on to Python's default handlers
    return anthropic.Anthropic(api_key=api_key, base_url=base_url(), timeout=API_TIMEOUT,
                               max_retries=API_RETRIES)


def number_setting(name: str, default: int) -> int:
    """A whole number from the environment (or .env), else the default; a wrong value is said."""
    value = os.environ.get(name, "").strip()
    if value.isdecimal():
        return int(value)
    if value:
        print(f"{name}={value!r} is not a whole number; using {default}")
    return default


def typed_so_far() -> str:
    """What was typed at the prompt when Ctrl-C came; readline keeps it ("" without readline)."""
    readline = sys.modules.get("readline")
    return readline.get_line_buffer() if readline else ""


def main() -> int:
    global client, API_TIMEOUT, API_RETRIES, MAX_TOKENS, MAX_MODEL_CALLS
    sys.stdout.reconfigure(errors="replace")  # a character the terminal cannot show prints as "?"
    load_dotenv()
    API_TIMEOUT = number_setting("API_TIMEOUT", API_TIMEOUT)
    API_RETRIES = number_setting("API_RETRIES", API_RETRIES)
    MAX_TOKENS = number_setting("MAX_TOKENS", MAX_TOKENS)
    MAX_MODEL_CALLS = number_setting("MAX_MODEL_CALLS", MAX_MODEL_CALLS)
    if endpoint() is None:
        print(f"ANTHROPIC_BASE_URL={base_url()!r} is not a URL: write it as http://host:port "
              "or https://host", file=sys.stderr)
        return 2
    client = make_client()
    if client is None:
        print(MISSING_KEY.format(stage=STAGE), file=sys.stderr)
        return 2
    save_transcript(None)  # can it be written? If not, it says so now and recording is off
    transcript = os.environ.get("TRANSCRIPT")  # still set only if it can be written
    recording = f", recording each call in {transcript}" if transcript else ""
    print(dim(f"model {os.environ.get('MODEL_ID') or DEFAULT_MODEL} at {endpoint()}{recording}"))
    # `timeout` or a closed terminal: leave through every `finally`: a call cut short is recorded.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda number, frame: sys.exit(128 + number))
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not every Python has it
            # Loading it gives input() line editing, and Up recalls earlier lines.
            import readline  # noqa: F401
    messages, warned = [], False
    while True:
        try:
            user_text = input(PROMPT)
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            if typed_so_far():  # as in bash: Ctrl-C throws away the line being typed
                warned = False
            elif warned:
                return 0
            else:
                print(dim("(press Ctrl-C again or type q to leave)"))
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
