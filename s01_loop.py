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
"""

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anthropic
from dotenv import load_dotenv

DEFAULT_MODEL = "claude-sonnet-5-5"
MAX_TOKENS = 8000
BASH_TIMEOUT = 120  # seconds
MAX_OUTPUT = 50_000  # characters of tool output sent back to the model
API_TIMEOUT = 60  # seconds the server may stay silent (while streaming: between two events) before a call is given up
API_RETRIES = 2  # the SDK tries a failed call this many more times: timeouts, lost connections, 429, 529 and 5xx
WORKDIR = Path.cwd()
STAGE = "s01"
PROMPT = f"{STAGE} >> "

# Built by main(), never at import, so that importing a stage has no side
# effects. Tests put a scripted model here.
client = None

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


def valid_utf8(text: str) -> str:
    """Text the API can take. Python stands in for bytes that are not UTF-8 (in a file name, say)
    with lone surrogates, which cannot be sent; each becomes the replacement character."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


def system_prompt() -> str:
    return valid_utf8(
        f"You are a coding agent working in {WORKDIR}. Use the tools to inspect "
        "and change files, then answer briefly."
    )


# -- the tool ----------------------------------------------------------------


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
    return {"type": "tool_result", "tool_use_id": block.id, "content": valid_utf8(text), "is_error": is_error}


def dispatch(block) -> dict:
    """Run the tool a tool_use block names. Whatever the model sent, answer with a tool_result."""
    if block.name != "bash":
        return tool_result(block, f"error: unknown tool {block.name!r}; the only tool is 'bash'", True)
    if not isinstance(block.input, dict):
        return tool_result(block, f"error: a tool's input must be an object of arguments, not {type(block.input).__name__}", True)
    command = block.input.get("command")
    if not isinstance(command, str):
        return tool_result(block, "error: bash needs a 'command' string", True)
    return tool_result(block, run_bash(command))


# -- the loop ----------------------------------------------------------------


class TurnFailed(Exception):
    """A turn that cannot go on; it is dropped from the history and the message shown."""


def dim(text: str) -> str:
    """Grey on a terminal; plain in a pipe or a file, or when NO_COLOR is set."""
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        return f"\033[2m{text}\033[0m"
    return text


def show_tool_call(block) -> None:
    arguments = block.input if isinstance(block.input, dict) else {"input": block.input}  # shown before it is checked
    args = " ".join(str(value) for value in arguments.values()).replace("\n", " ")
    print(dim(f"> {block.name}: {args[:120]}"))


def show_tool_result(result: dict) -> None:
    lines = result["content"].splitlines() or [""]
    more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    print(dim(f"  {lines[0][:120]}{more}"))


def run_tool(block) -> dict:
    """Run one tool call, showing the call and the first line of its result."""
    show_tool_call(block)
    result = dispatch(block)
    show_tool_result(result)
    return result


def context_tokens(usage) -> int:
    """All the model read for one call: new input, plus what was read from or written to the cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def show_usage(usage) -> None:
    """One line per model call: how big the context is, and how much came from the cache."""
    print(dim(f"[context {context_tokens(usage):,} tokens, {usage.cache_read_input_tokens or 0:,} read from cache; "
              f"output {usage.output_tokens:,}]"))


def text_of(content) -> str:
    return "\n".join(block.text for block in content if block.type == "text")


def save_transcript(agent: str, request: dict, response) -> None:
    """With TRANSCRIPT=file.jsonl set, append one JSON line per model call: the arguments sent and
    the reply (null if the call failed). The key is not among them: the client sends it as a header."""
    path = os.environ.get("TRANSCRIPT")
    if path:
        line = {"agent": agent, "request": request, "response": response}
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(line, default=lambda block: block.model_dump(mode="json", exclude_none=True)) + "\n")


def call_model(messages: list) -> anthropic.types.Message:
    """The one place the API is called. The reply streams in, and its text is printed as it arrives."""
    request = {
        "model": os.environ.get("MODEL_ID") or DEFAULT_MODEL,
        "system": system_prompt(),
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": {"type": "auto"},  # the API's default, but some compatible servers offer no tools without it
        "max_tokens": MAX_TOKENS,
        # Every call re-sends the whole conversation; caching makes the repeat cheap.
        "cache_control": {"type": "ephemeral"},
    }
    response = None
    try:
        with client.messages.stream(**request) as stream:
            for text in stream.text_stream:
                print(text, end="", flush=True)
            response = stream.get_final_message()
    finally:
        save_transcript("parent", request, response)
    if text_of(response.content):
        print()  # end the line the text streamed onto
    return response


def take_reply(messages: list, response) -> str | None:
    """Add the model's reply to the history and act on why it stopped.

    Returns the final text when the turn is over, or None when the model
    should be called again (its tools have run, or it was paused).
    """
    reason = response.stop_reason
    if reason == "refusal":
        raise TurnFailed("the model declined this request (refusal); rephrase it and try again")
    if reason == "model_context_window_exceeded":
        raise TurnFailed("the conversation no longer fits the model's context window; start a new session")
    # An empty assistant message would make every later request invalid.
    content = response.content or [{"type": "text", "text": "(empty reply)"}]
    if messages[-1]["role"] == "assistant":  # the turn was paused: this reply goes on with the same message
        messages[-1]["content"] = [*messages[-1]["content"], *content]
    else:
        messages.append({"role": "assistant", "content": content})
    calls = [block for block in response.content if block.type == "tool_use"]
    if reason == "pause_turn":
        return None  # the API paused a long turn; sending it back as it is resumes it
    if reason == "max_tokens":
        print(dim("(the reply was cut off at max_tokens)"))
        if calls:  # a cut-off call may have lost arguments: answer it, never run it
            cut = "error: not run: your reply was cut off at max_tokens. Try again with a shorter call."
            messages.append({"role": "user", "content": [tool_result(block, cut, True) for block in calls]})
            return None
    if reason == "tool_use" and calls:
        messages.append({"role": "user", "content": [run_tool(block) for block in calls]})
        return None
    return text_of(response.content)


def agent_loop(messages: list) -> str:
    """Call the model and run its tools until it stops; return its final text."""
    while True:
        response = call_model(messages)
        show_usage(response.usage)
        final_text = take_reply(messages, response)
        if final_text is not None:
            return final_text


def describe_api_error(error: anthropic.APIError) -> str:
    if isinstance(error, anthropic.APITimeoutError):
        return (f"API error: no answer for {API_TIMEOUT}s, {API_RETRIES + 1} times; "
                "check ANTHROPIC_BASE_URL, or try again later")
    if isinstance(error, anthropic.APIConnectionError):
        return f"API error: cannot reach the API ({error}); check your network and ANTHROPIC_BASE_URL"
    if isinstance(error, anthropic.APIStatusError) and error.status_code in (400, 401, 403, 404):
        # From a proxy or a compatible provider these usually mean a wrong setting, whatever the message says.
        return (f"API error {error.status_code}: {error.message}; "
                "check ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and MODEL_ID")
    if isinstance(error, anthropic.APIStatusError):
        return f"API error {error.status_code}: {error.message}"
    return f"API error: {error}"


def run_turn(messages: list, user_text: str) -> None:
    """One turn of the conversation. On any failure, drop the turn so the history stays valid."""
    start = len(messages)
    messages.append({"role": "user", "content": valid_utf8(user_text)})
    try:
        agent_loop(messages)
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001 - nothing that goes wrong in a turn ends the session
        del messages[start:]
        if isinstance(error, KeyboardInterrupt):
            reason = "interrupted"
        elif isinstance(error, anthropic.APIError):
            reason = describe_api_error(error)
        elif isinstance(error, TurnFailed):
            reason = str(error)
        else:
            reason = f"{type(error).__name__}: {error}"
        print(f"\n{reason}. This turn was dropped from the conversation (files it changed stay changed).")


# -- start-up ------------------------------------------------------------------

MISSING_KEY = """\
No API key: set ANTHROPIC_API_KEY, in the environment or in a .env file beside
this script (copy .env.example to .env and fill it in). For an
Anthropic-compatible provider also set ANTHROPIC_BASE_URL; MODEL_ID picks the
model. No key at all? `python tests/demo.py {stage}` shows this stage working
with a scripted model."""


def make_client():
    """Build the API client from the environment, or None when no key is set."""
    api_key = os.environ.get("ANTHROPIC_API_KEY")
    if not api_key:
        return None
    # An empty ANTHROPIC_BASE_URL means "not set", which the SDK would not assume.
    base_url = os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
    return anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=API_TIMEOUT, max_retries=API_RETRIES)


def main() -> int:
    global client
    sys.stdout.reconfigure(errors="replace")  # a character the terminal cannot show is printed as "?"
    load_dotenv()
    client = make_client()
    if client is None:
        print(MISSING_KEY.format(stage=STAGE), file=sys.stderr)
        return 2
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # not every Python has it
            import readline  # noqa: F401 - loading it gives input() line editing, and Up recalls earlier lines
    messages = []
    while True:
        try:
            user_text = input(PROMPT)
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if user_text.strip().lower() in ("q", "exit"):
            return 0
        if user_text.strip():
            run_turn(messages, user_text)


if __name__ == "__main__":
    sys.exit(main())
