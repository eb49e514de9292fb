"""Drive headless Chromium from Python, stdlib only: open a page, read its DOM, take a picture.

Chromium's DevTools protocol is JSON messages. With --remote-debugging-pipe, Chromium reads them
from its file descriptor 3 and writes answers and events to its descriptor 4, each message ended
by a NUL byte: no port, no websocket, nothing to install. tests/test_view.py uses it to check the
page of tests/view.py in a real browser; `python tests/demo.py s04 --png picture.png` takes the
picture shown in notes/s04_subagent.md.
"""

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

WAIT = 60  # seconds to wait for any one answer before giving up: a stuck browser fails, never hangs


def chromium() -> str | None:
    """The path of the Chromium program (Debian's package is `chromium`), or None."""
    return (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )


class Browser:
    """One headless Chromium with one tab; use as a context manager."""

    def __init__(self, width: int = 1200, height: int = 900):
        program = chromium()
        if program is None:
            raise FileNotFoundError("chromium is not installed (Debian package: chromium)")
        self.width, self.height = width, height
        self.events, self.next_id, self.buffer, self.session = [], 0, b"", None
        self.profile = tempfile.TemporaryDirectory()
        flags = [
            "--headless",
            "--no-sandbox",  # it runs as root in CI
            "--disable-gpu",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",  # no network of its own: no updates, no pings
            "--disable-component-update",
            "--no-pings",
            f"--user-data-dir={self.profile.name}",
            "about:blank",
        ]
        to_browser, self.command_end = os.pipe()
        self.answer_end, from_browser = os.pipe()
        # bash hands our two pipe ends to Chromium as its descriptors 3 and 4.
        wiring = f'exec "$0" "$@" 3<&{to_browser} 4>&{from_browser}'
        self.process = subprocess.Popen(
            ["bash", "-c", wiring, program, *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(to_browser, from_browser),
            start_new_session=True,  # its own process group, so that all of it can be ended
        )
        os.close(to_browser)  # Chromium holds these ends now
        os.close(from_browser)

    def __enter__(self):
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
            self.session = attached["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):  # their events are collected
                self.send(f"{domain}.enable")
            window = {"width": self.width, "height": self.height, "deviceScaleFactor": 1}
            self.send("Emulation.setDeviceMetricsOverride", {**window, "mobile": False})
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        try:
            with contextlib.suppress(RuntimeError, OSError):  # it may be gone already
                self.session = None
                self.send("Browser.close")
            try:
                self.process.wait(timeout=WAIT)
            finally:  # its helper processes too: nothing Chromium started outlives it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        finally:
            os.close(self.command_end)
            os.close(self.answer_end)
            self.profile.cleanup()

    def read_message(self) -> dict:
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.answer_end], [], [], WAIT)
            data = os.read(self.answer_end, 1 << 16) if ready else b""
            if not data:
                raise RuntimeError("chromium stopped answering")
            self.buffer += data
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None) -> dict:
        """Send a command to the tab (the browser, before one is attached); return its result."""
        self.next_id += 1
        command = {"id": self.next_id, "method": method, "params": params or {}}
        if self.session:
            command["sessionId"] = self.session
        os.write(self.command_end, json.dumps(command).encode() + b"\0")
        while True:
            message = self.read_message()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, event: str, since: int) -> dict:
        """The first event of this kind among those after the first `since`, waiting for it."""
        while True:
            for message in self.events[since:]:
                if message.get("method") == event:
                    return message
            since = len(self.events)
            self.events.append(self.read_message())

    def open(self, page: Path) -> None:
        """Load a local page and wait until it has loaded."""
        before = len(self.events)
        self.send("Page.navigate", {"url": page.resolve().as_uri()})
        self.wait_for("Page.loadEventFired", before)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (run by DevTools, not by the page)."""
        answer = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression[:60]}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def screenshot(self, picture: Path, height: int | None = None) -> None:
        """A PNG of the page's top `height` pixels (the window's height when not given)."""
        clip = {"x": 0, "y": 0, "width": self.width, "height": height or self.height, "scale": 1}
        data = self.send(
            "Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True}
        )
        picture.write_bytes(base64.b64decode(data["data"]))

    def errors(self) -> list:
        """What the page reported as errors: exceptions, console.error, and errors in the log."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(params["exceptionDetails"].get("text"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(str(params.get("args")))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"].get("text"))
        return found

    def requested(self) -> list:
        """Every URL the page asked for."""
        return [
            event["params"]["request"]["url"]
            for event in self.events
            if event.get("method") == "Network.requestWillBeSent"
        ]


def screenshot_problem(page: Path, picture: Path, width: int = 1100) -> str | None:
    """Take a picture of the whole of `page` (at most 3,000 pixels of it); return None, or why it
    could not be taken."""
    if chromium() is None:
        return "no picture: chromium is not installed (Debian package: chromium)"
    with Browser(width, 900) as browser:
        browser.open(page)
        height = browser.evaluate("document.documentElement.scrollHeight")
        browser.screenshot(picture, min(height, 3000))
    return None
