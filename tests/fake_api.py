"""A scripted model, for tests and the demo: no network, no key.

A script is a list of what the model does next, one item per model call:
- `reply(...)`: a Messages API reply (strings are text blocks, `tool(...)` are tool calls);
- `api_error(status, message)`: the API answers with that HTTP error (a JSON body and a request id);
- `web_page(status, page)`: a web server answers instead, with an HTML page and no request id
  (FakeAPI only);
- `SILENCE`: the server takes the request and never answers (FakeAPI only);
- what compatible servers do (FakeAPI only): `reply(..., plain_json=True)` answers a streamed
  request with one JSON body, `reply(..., hang_up=True)` closes the stream after the first piece
  of text, and `broken_tool(name, raw)` is a tool call whose arguments are the text `raw`, not JSON;
- a function of the request: called, and its return value used (it may also raise,
  or send a signal, to act out what happens while the model "thinks").
`FakeAPI(script, closes_kept_alive=True)` acts out a server that keeps each connection open after
its reply (chunked encoding), then closes it just as the next request comes in, unread: the race
every client meets with a server that closes idle connections when it likes.

Two ways to serve a script, both streaming the reply as the API does:
- `ScriptedClient(script)` stands in for `anthropic.Anthropic()` inside the test
  process: `client.messages.stream(...)` yields the reply's text in pieces, then
  gives a real `anthropic.types.Message`; an `api_error` (the history check's 400 too) raises
  the SDK's own `APIStatusError`, as the real client does.
- `FakeAPI(script)` is a local HTTP server speaking the Messages API, with server-sent
  events when asked to stream, so the real SDK (and a stage run as a subprocess) talks
  to it through `ANTHROPIC_BASE_URL`.
Both record every request they get, as JSON-like dicts, in `.requests`.
"""

import itertools
import json
import os
import select
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import anthropic
import pydantic

_ids = itertools.count(1)


def text(words: str) -> dict:
    return {"type": "text", "text": words}


def tool(name: str, **tool_input) -> dict:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": tool_input}


def broken_tool(name: str, raw: str) -> dict:
    """A tool call whose arguments arrive as `raw`, text that is not JSON (a small model's slip)."""
    return {**tool(name), "raw": raw}


def reply(*blocks, stop_reason: str | None = None, gate=None, plain_json=False, hang_up=False):
    """A model reply. Strings become text blocks; stop_reason defaults to what the blocks imply.
    With a `Gate`, FakeAPI streams the first piece of text, then waits for the gate before the rest.
    `plain_json` and `hang_up` act out odd servers (see the top of this file)."""
    content = [text(block) if isinstance(block, str) else block for block in blocks]
    if stop_reason is None:
        stop_reason = "tool_use" if any(block["type"] == "tool_use" for block in content) else "end_turn"
    odd = {"gate": gate, "plain_json": plain_json, "hang_up": hang_up}
    odd = {key: value for key, value in odd.items() if value}
    return {"content": content, "stop_reason": stop_reason, **odd}


class Gate:
    """Lets a test see what the client shows while the server still holds back the rest of a reply."""

    def __init__(self):
        self.opened = threading.Event()  # the test opens it, e.g. when the first text is on screen
        self.rest_sent = threading.Event()  # set by the server once it sends the rest


SILENCE = {"silence": True}


def press_ctrl_c(request: dict) -> dict:
    """A script item: the user presses Ctrl-C while the model is thinking (use it with FakeAPI)."""
    os.kill(os.getpid(), signal.SIGINT)
    return reply("never seen: the interrupt arrives first")


def api_error(status: int, message: str, kind: str = "api_error") -> dict:
    """The API answers with HTTP `status`, body {"type": "error", "error": {"type": kind, ...}}."""
    return {"error_status": status, "message": message, "kind": kind}


def web_page(status: int, page: str) -> dict:
    """Not the API but a web server (nginx, a proxy, a dev server) answers: HTTP `status`, HTML."""
    return {"web_page": page, "status": status}


NGINX_500 = "<html><body><h1>500 Internal Server Error</h1>nginx</body></html>"
APACHE_501 = """<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">
<html><head>
<title>501 Not Implemented</title>
</head><body>
<h1>Not Implemented</h1>
<p>POST to /v1/messages not supported.<br />
</p>
<hr>
<address>Apache/2.4.62 (Debian) Server at 127.0.0.1 Port 80</address>
</body></html>
"""


def status_error(answer: dict) -> anthropic.APIStatusError:
    """The SDK's exception for an `api_error` answer, as the real client raises it (no HTTP)."""
    body = {"type": "error", "error": {"type": answer["kind"], "message": answer["message"]}}
    request = SimpleNamespace(url="https://api.anthropic.com/v1/messages")  # where the SDK sent it
    response = SimpleNamespace(status_code=answer["error_status"], request=request,
                               headers={"request-id": f"req_fake{next(_ids):04d}"})
    return anthropic.APIStatusError(f"Error code: {answer['error_status']} - {body}",
                                    response=response, body=body)


def as_json(value):
    """A request or message list as the API would see it (SDK objects turned into plain dicts)."""
    def plain(obj):
        if isinstance(obj, pydantic.BaseModel):
            return obj.model_dump(exclude_none=True)
        raise TypeError(f"cannot serialise {type(obj).__name__}")
    return json.loads(json.dumps(value, default=plain))


def as_blocks(content) -> list:
    return [text(content)] if isinstance(content, str) else list(content)


def combined_turns(messages: list) -> list:
    """The API combines consecutive messages of one role into a single turn, and so does this."""
    turns = []
    for message in messages:
        if turns and turns[-1]["role"] == message["role"]:
            turns[-1]["content"] += as_blocks(message["content"])
        else:
            turns.append({"role": message["role"], "content": as_blocks(message["content"])})
    return turns


def history_problem(messages: list) -> str | None:
    """What the Messages API would reject in this history, or None if it is valid. Like the API,
    it first combines consecutive messages of one role into one turn."""
    messages = as_json(messages)
    if not messages or messages[0]["role"] != "user":
        return "the history must start with a user message"
    if any(not message["content"] for message in messages):
        return "a message has empty content"
    messages = combined_turns(messages)
    for index, message in enumerate(messages):
        blocks = message["content"]
        if any(block["type"] == "text" and not block["text"] for block in blocks):
            return f"message {index}: text content blocks must be non-empty"
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


def without_nulls(value):
    """A request without its null fields: versions of the SDK differ in which ones they send."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def estimate_tokens(value) -> int:
    """About four characters a token: near enough to watch a context grow, the same for every SDK."""
    return len(json.dumps(without_nulls(value))) // 4


class Script:
    """Hands out a script's items in order, fills in ids and usage, and records requests."""

    def __init__(self, items):
        self.items = list(items)
        self.requests = []
        self.lock = threading.Lock()

    def next_reply(self, request: dict) -> dict:
        problem = history_problem(request["messages"])
        if problem:  # the real API rejects such a request with a 400
            return api_error(400, f"invalid conversation history: {problem}", "invalid_request_error")
        with self.lock:
            if not self.items:
                raise AssertionError(f"the script ran out of replies at request {len(self.requests) + 1}")
            previous = [r for r in self.requests if r.get("system") == request.get("system")]
            self.requests.append(request)
            item = self.items.pop(0)
        if callable(item):
            item = item(request)
        if "error_status" in item or "silence" in item or "web_page" in item:
            return item
        # The cache holds the previous request of the same conversation when this one extends it.
        cached = 0
        if previous and request["messages"][: len(previous[-1]["messages"])] == previous[-1]["messages"]:
            cached = estimate_tokens(previous[-1])
        usage = {"input_tokens": max(estimate_tokens(request) - cached, 1), "output_tokens": estimate_tokens(item["content"]),
                 "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
        return {"id": f"msg_{next(_ids):04d}", "type": "message", "role": "assistant",
                "model": request.get("model", "scripted"), "stop_sequence": None, "usage": usage, **item}


def text_pieces(message: dict, size: int = 16):
    """The text of a reply in small pieces, as the API streams it."""
    for block in message["content"]:
        if block["type"] == "text":
            yield from (block["text"][i:i + size] for i in range(0, len(block["text"]), size))


class ScriptedStream:
    """What `client.messages.stream(...)` returns, played from a script item. As the SDK's, it
    sends nothing until it is opened (`with ... as stream`): then the script plays its next item."""

    def __init__(self, play):
        self.play = play
        self.answer = None

    def __enter__(self):
        self.answer = self.play()
        return self

    def __exit__(self, *exc):
        return False

    def __iter__(self):
        """The stream's events, as far as a stage reads them: each piece of text, then the end."""
        for piece in text_pieces(self.answer):
            yield SimpleNamespace(type="text", text=piece)
        yield SimpleNamespace(type="message_stop")

    @property
    def text_stream(self):
        return (event.text for event in self if event.type == "text")

    def get_final_message(self) -> anthropic.types.Message:
        return anthropic.types.Message.model_validate(self.answer)


class ScriptedClient:
    """Stands in for anthropic.Anthropic(): `.messages.stream(**request)` plays the script."""

    def __init__(self, items):
        self.script = Script(items)
        self.messages = self  # so that client.messages.stream(...) works

    @property
    def requests(self) -> list:
        return self.script.requests

    def stream(self, **request) -> ScriptedStream:
        return ScriptedStream(lambda: self.answer(request))

    def answer(self, request: dict) -> dict:
        answer = self.script.next_reply(as_json(request))
        if "error_status" in answer:  # what the SDK raises for it (the history check's 400 too)
            raise status_error(answer)
        odd = ("silence", "web_page", "plain_json", "hang_up")
        if any(key in answer for key in odd) or any("raw" in block for block in answer["content"]):
            # A test that wants what the SDK makes of such an answer uses FakeAPI.
            raise AssertionError(f"ScriptedClient cannot act out {answer}; use FakeAPI")
        answer.pop("gate", None)
        return answer


def sse_events(message: dict, gate: Gate | None = None):
    """A reply as the server-sent events of a streamed Messages API response. A reply that hangs up
    ends after its first piece of text, with no message_stop."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    yield {"type": "message_start", "message": start}
    text_sent = False
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            for piece in text_pieces({"content": [block]}):
                yield {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}
                if gate and not text_sent:
                    gate.opened.wait(5)
                    gate.rest_sent.set()
                if message.get("hang_up"):
                    return
                text_sent = True
        else:
            started = {key: value for key, value in block.items() if key != "raw"}
            started["input"] = {}
            yield {"type": "content_block_start", "index": index, "content_block": started}
            partial_json = block.get("raw") or json.dumps(block["input"])
            yield {"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta", "partial_json": partial_json}}
        yield {"type": "content_block_stop", "index": index}
    yield {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
           "usage": {"output_tokens": usage["output_tokens"]}}
    yield {"type": "message_stop"}


class FakeAPI:
    """A local Messages API server playing a script; use as a context manager.
    `chars_per_second` paces streamed text, like a model writing (for benchmarks).
    `closes_kept_alive` keeps a connection open after a streamed reply, then closes it once the
    next request starts to arrive, without reading it (see the top of this file)."""

    def __init__(self, items, chars_per_second: float | None = None, closes_kept_alive=False):
        self.script = Script(items)
        self.closing = threading.Event()
        script, closing = self.script, self.closing

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if closes_kept_alive else "HTTP/1.0"

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self.path.startswith("/v1/messages"):
                    answer = api_error(404, f"no such endpoint {self.path}")
                else:
                    answer = script.next_reply(request)
                if "silence" in answer:
                    closing.wait(10)  # the request was taken; no answer ever comes
                    return
                if "web_page" in answer:
                    self.send_page(answer["status"], answer["web_page"])
                    return
                status = answer.get("error_status", 200)
                if status != 200:
                    request_id = f"req_fake{next(_ids):04d}"
                    error = {"type": answer.get("kind", "api_error"), "message": answer["message"]}
                    body = {"type": "error", "error": error, "request_id": request_id}
                    self.send_json(status, body, request_id)
                elif request.get("stream") and not answer.pop("plain_json", False):
                    self.send_events(answer)
                else:
                    answer.pop("gate", None)
                    self.send_json(200, answer)

            def send_json(self, status: int, answer: dict, request_id: str | None = None):
                body = json.dumps(answer).encode()
                self.send_response(status)
                if request_id:
                    self.send_header("request-id", request_id)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def send_page(self, status: int, page: str):
                body = page.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def send_events(self, answer: dict):
                if closes_kept_alive:
                    self.send_events_kept_alive(answer)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for event in sse_events(answer, answer.pop("gate", None)):
                    self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                    if chars_per_second and event.get("delta", {}).get("type") == "text_delta":
                        time.sleep(len(event["delta"]["text"]) / chars_per_second)  # the model "writing"
                self.close_connection = True

            def send_events_kept_alive(self, answer: dict):
                """The reply in chunks on a connection kept open; then, as soon as the next
                request's first bytes are in, the connection is closed with them unread."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in sse_events(answer):
                    data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                select.select([self.connection], [], [], 10)  # the next request comes (or 10 s)
                self.close_connection = True  # closed with the next request unread

            def log_message(self, *args):
                pass  # keep test output clean

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a client that hangs up mid-stream (Ctrl-C, a timeout) is expected here

        self.server = Server(("127.0.0.1", 0), Handler)
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
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
