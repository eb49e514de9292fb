"""Shared fixtures: every stage is tested against a scripted model in a temporary workspace."""

import importlib
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fake_api import FakeAPI, ScriptedClient, history_problem, press_ctrl_c, reply, tool

ROOT = Path(__file__).resolve().parent.parent
STAGE_NAMES = [path.stem for path in sorted(ROOT.glob("s0[1-9]_*.py"))]
NO_WALL = importlib.import_module("s03_safety").bwrap_problem()  # why the wall cannot go up here, or None


def stages_from(first: str, quick_run_checks_the_last_only: bool = False) -> list:
    """The stages from `first` on, as pytest params: a later stage must keep an earlier one's promises.
    The quick run (the README's command) checks the first and the last of them; the stages between
    are marked slow and run in CI (`python -m pytest -m ""`). The code they share with those two is
    the same, and tests/test_stage_drift.py checks that it stays so. A test that starts a stage as a
    process of its own (seconds each, to load the SDK) may check only the last in the quick run."""
    names = STAGE_NAMES[STAGE_NAMES.index(first):]
    between = names[:-1] if quick_run_checks_the_last_only else names[1:-1]
    return [pytest.param(importlib.import_module(name), id=name,
                         marks=[pytest.mark.slow] if name in between else [])
            for name in names]


def clean_env(**extra) -> dict:
    """The environment for a stage run as a subprocess: no real key, no .env file, nothing inherited by chance."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("ANTHROPIC_") and key not in USER_SETTINGS}
    return {**env, "PYTHON_DOTENV_DISABLED": "1", **extra}


def run_stage(script: Path, stdin: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """Run a stage the way a user does, typing `stdin` at its prompt."""
    return subprocess.run([sys.executable, str(script)], input=stdin, env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=30, check=False)


USER_SETTINGS = ("MODEL_ID", "TRANSCRIPT", "SANDBOX", "NETWORK", "NO_COLOR", "API_TIMEOUT", "API_RETRIES",
                 "MAX_TOKENS", "MAX_MODEL_CALLS")  # and every ANTHROPIC_* variable


@pytest.fixture(autouse=True)
def no_user_settings(monkeypatch):
    """Every test starts from no settings, whatever the learner's shell exports (tests set what they need).
    Where the wall cannot go up (macOS, some containers), stages 3 and 4 would run no command at all,
    so tests run them with SANDBOX=off there; the wall's own tests are skipped on such a machine."""
    for name in [*USER_SETTINGS, *(name for name in os.environ if name.startswith("ANTHROPIC_"))]:
        monkeypatch.delenv(name, raising=False)
    if NO_WALL:
        monkeypatch.setenv("SANDBOX", "off")


@pytest.fixture(autouse=True)
def ctrl_c_raises_keyboard_interrupt():
    """Ctrl-C raises KeyboardInterrupt in every test, even when pytest was started with SIGINT
    ignored (as `cmd &` in a script does): the tests do not depend on how they were started."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def stages_put_back(monkeypatch):
    """Whatever a test points each stage's WORKDIR and client at (the demo does), they are put back after it."""
    for name in STAGE_NAMES:
        stage = importlib.import_module(name)
        monkeypatch.setattr(stage, "WORKDIR", stage.WORKDIR)
        monkeypatch.setattr(stage, "client", stage.client)


@pytest.fixture
def user_env(monkeypatch):
    """The environment main() starts in: no key, no .env, no model chosen (no_user_settings
    cleared the shell's). What main() changes in this process (the settings it reads, its client,
    its workspace) is put back afterwards."""
    monkeypatch.setenv("PYTHON_DOTENV_DISABLED", "1")
    for name in STAGE_NAMES:
        stage = importlib.import_module(name)
        for setting in ("API_TIMEOUT", "API_RETRIES", "MAX_TOKENS", "MAX_MODEL_CALLS", "WORKDIR",
                        "client"):
            monkeypatch.setattr(stage, setting, getattr(stage, setting))
    return monkeypatch


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """An empty workspace folder; each stage's WORKDIR points at it for the test."""
    for name in STAGE_NAMES:
        monkeypatch.setattr(importlib.import_module(name), "WORKDIR", tmp_path)
    return tmp_path


@pytest.fixture
def project(monkeypatch):
    """For the filter, which reads spellings only: a workspace where projects live in the home
    folder, ~/projects/app (nothing on disk: /work/me/projects/app), not under /tmp. With the wall
    up the home folder is in memory, but for ~ and ~/projects, which hold the workspace."""
    monkeypatch.setenv("HOME", "/work/me")
    for name in STAGE_NAMES:
        monkeypatch.setattr(importlib.import_module(name), "WORKDIR", Path("/work/me/projects/app"))
    return Path("/work/me/projects/app")


@pytest.fixture
def scripted(monkeypatch, workspace):
    """attach(stage, script) gives `stage` a scripted model and returns it (see fake_api.py)."""
    def attach(stage, script, client=None):
        client = client or ScriptedClient(script)
        monkeypatch.setattr(stage, "client", client)
        return client
    return attach


def ctrl_c_cancels_only_that_turn(stage, scripted, capsys, turn_so_far: list) -> None:
    """Turn one is answered; turn two plays `turn_so_far`, then Ctrl-C; turn three must work."""
    with FakeAPI([reply("first"), *turn_so_far, press_ctrl_c, reply("after")]) as api:
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "one")
        stage.run_turn(messages, "two")
        assert "interrupted" in capsys.readouterr().out and len(messages) == 2
        stage.run_turn(messages, "three")
    assert history_problem(messages) is None and "after" in capsys.readouterr().out


def call_tool(stage, scripted, name: str, **tool_input) -> dict:
    """Have the scripted model make one tool call through the real loop; return the tool_result sent back."""
    model = scripted(stage, [reply(tool(name, **tool_input)), reply("ok")])
    stage.run_turn([], "go")
    return model.requests[1]["messages"][-1]["content"][0]


def context_sizes(output: str) -> list:
    """The context sizes that the usage lines in a stage's output show, in order."""
    return [int(size.replace(",", "")) for size in re.findall(r"\[context ([\d,]+) tokens", output)]


class Terminal(io.StringIO):
    """A stand-in for a terminal: it says it is one (so colour is on) and can watch what is written."""

    def __init__(self, on_write=None):
        super().__init__()
        self.on_write = on_write or (lambda shown: None)

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        written = super().write(text)
        self.on_write(self.getvalue())
        return written
