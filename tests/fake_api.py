"""A scripted model, for tests and the demo: no network, no key.

A script is a list of what the model does next, one item per model call:
- `reply(...)`: a Messages API reply (strings are text blocks, `tool(...)` are tool calls);
- `api_error(status, message)`: the API answers with that HTTP error;
- a function of the request: called, and its return value used (it may also raise,
  or send a signal, to act out what happens while the model "thinks").

Two ways to serve a script:
- `ScriptedClient(script)` stands in for `anthropic.Anthropic()` inside the test
  process: `client.messages.create(...)` returns real `anthropic.types.Message` objects.
- `FakeAPI(script)` is a local HTTP server speaking the Messages API, so the real SDK
  (and a stage run as a subprocess) talks to it through `ANTHROPIC_BASE_URL`.
Both record every request they get, as JSON-like dicts, in `.requests`.
"""

import itertools
import json
import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import pydantic

_ids = itertools.count(1)


def text(words: str) -> dict:
    return {"type": "text", "text": words}


def tool(name: str, **tool_input) -> dict:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": tool_input}


def reply(*blocks, stop_reason: str | None = None) -> dict:
    """A model reply. Strings become text blocks; stop_reason defaults to what the blocks imply."""
    content = [text(block) if isinstance(block, str) else block for block in blocks]
    if stop_reason is None:
        stop_reason = "tool_use" if any(block["type"] == "tool_use" for block in content) else "end_turn"
    return {"content": content, "stop_reason": stop_reason}


def press_ctrl_c(request: dict) -> dict:
    """A script item: the user presses Ctrl-C while the model is thinking (use it with FakeAPI)."""
    os.kill(os.getpid(), signal.SIGINT)
    return reply("never seen: the interrupt arrives first")


def api_error(status: int, message: str) -> dict:
    return {"error_status": status, "message": message}


def as_json(value):
    """A request or message list as the API would see it (SDK objects turned into plain dicts)."""
    def plain(obj):
        if isinstance(obj, pydantic.BaseModel):
            return obj.model_dump(exclude_none=True)
        raise TypeError(f"cannot serialise {type(obj).__name__}")
    return json.loads(json.dumps(value, default=plain))


def history_problem(messages: list) -> str | None:
    """What the Messages API would reject in this history, or None if it is valid."""
    messages = as_json(messages)
    if not messages or messages[0]["role"] != "user":
        return "the history must start with a user message"
    for index, message in enumerate(messages):
        content = message["content"]
        if not content:
            return f"message {index} has empty content"
        if index and message["role"] == messages[index - 1]["role"]:
            return f"messages {index - 1} and {index} are both {message['role']} messages"
        blocks = content if isinstance(content, list) else []
        asked = [block["id"] for block in blocks if block["type"] == "tool_use"]
        if not asked:
            continue
        if index + 1 == len(messages):
            return f"message {index} ends the history with unanswered tool_use blocks"
        following = messages[index + 1]["content"]
        answered = [block.get("tool_use_id") for block in following] if isinstance(following, list) else []
        if answered[: len(asked)] != asked:
            return f"the tool_use blocks of message {index} are not answered in order by message {index + 1}"
    return None


def estimate_tokens(value) -> int:
    return len(json.dumps(value)) // 4  # about four characters a token, near enough to watch growth


class Script:
    """Hands out a script's items in order, fills in ids and usage, and records requests."""

    def __init__(self, items):
        self.items = list(items)
        self.requests = []
        self.lock = threading.Lock()

    def next_reply(self, request: dict) -> dict:
        problem = history_problem(request["messages"])
        if problem:  # the real API rejects such a request with a 400
            return api_error(400, f"invalid conversation history: {problem}")
        with self.lock:
            if not self.items:
                raise AssertionError(f"the script ran out of replies at request {len(self.requests) + 1}")
            previous = [r for r in self.requests if r.get("system") == request.get("system")]
            self.requests.append(request)
            item = self.items.pop(0)
        if callable(item):
            item = item(request)
        if "error_status" in item:
            return item
        # The cache holds the previous request of the same conversation when this one extends it.
        cached = 0
        if previous and request["messages"][: len(previous[-1]["messages"])] == previous[-1]["messages"]:
            cached = estimate_tokens(previous[-1])
        usage = {"input_tokens": max(estimate_tokens(request) - cached, 1), "output_tokens": estimate_tokens(item["content"]),
                 "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
        return {"id": f"msg_{next(_ids):04d}", "type": "message", "role": "assistant",
                "model": request.get("model", "scripted"), "stop_sequence": None, "usage": usage, **item}


class ScriptedClient:
    """Stands in for anthropic.Anthropic(): `.messages.create(**request)` plays the script."""

    def __init__(self, items):
        self.script = Script(items)
        self.messages = self  # so that client.messages.create(...) works

    @property
    def requests(self) -> list:
        return self.script.requests

    def create(self, **request):
        answer = self.script.next_reply(as_json(request))
        if "error_status" in answer:
            # The real API would answer with this HTTP error; a test that wants the SDK's
            # exception for it uses FakeAPI, where the real SDK makes that exception.
            raise AssertionError(f"the API would answer {answer['error_status']}: {answer['message']}")
        return anthropic.types.Message.model_validate(answer)


class FakeAPI:
    """A local Messages API server playing a script; use as a context manager."""

    def __init__(self, items):
        self.script = Script(items)
        script = self.script

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self.path.startswith("/v1/messages"):
                    answer = api_error(404, f"no such endpoint {self.path}")
                else:
                    answer = script.next_reply(request)
                status = answer.get("error_status", 200)
                if status != 200:
                    answer = {"type": "error", "error": {"type": "api_error", "message": answer["message"]}}
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass  # keep test output clean

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def requests(self) -> list:
        return self.script.requests

    def client(self) -> anthropic.Anthropic:
        """A real SDK client pointed at this server. No retries, so an error shows at once."""
        return anthropic.Anthropic(api_key="test-key", base_url=self.url, max_retries=0)

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()  # quick shutdown
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
