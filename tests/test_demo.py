"""The offline demo: every stage runs for real against a scripted model, with no key."""

import importlib
import subprocess
import sys

import demo
import pytest
from conftest import ROOT, clean_env, context_sizes

EXPECTED = {  # what each stage's demo must show a newcomer
    "s01": ["> bash:", "20 lines"],
    "s02": ["> edit_file: greet.py", "Hello, world!"],
    "s03": ["outside the workspace", "refused, not run: sudo", "> bash: rm -rf build/"],
    "s04": ["> task: survey src/", "    > read_file: src/cli.py", "= subagent: 3 turns"],
}


@pytest.fixture(autouse=True)
def restore_stages(monkeypatch):
    """The demo points each stage's WORKDIR and client elsewhere; put them back after each test."""
    for name in demo.STAGES.values():
        stage = importlib.import_module(name)
        monkeypatch.setattr(stage, "WORKDIR", stage.WORKDIR)
        monkeypatch.setattr(stage, "client", stage.client)


@pytest.mark.parametrize("short_name", demo.STAGES)
def test_the_demo_runs_every_stage_and_says_the_model_is_scripted(short_name, capsys):
    """Each stage's demo plays a short session through the real stage code and the real SDK."""
    assert demo.main([short_name]) == 0
    out = capsys.readouterr().out
    assert "SCRIPTED" in out and "Traceback" not in out
    assert all(text in out for text in EXPECTED[short_name]), out


def test_the_s01_demos_answer_is_what_its_command_prints(tmp_path):
    """The scripted answer is true of the sample project: the files, lines and longest file that `wc -l` counts."""
    demo.make_workspace(tmp_path)
    [(_, [asked, answered])] = demo.SESSIONS["s01"]
    command = asked["content"][-1]["input"]["command"]
    printed = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=10, check=True)
    *files, (total, _) = [line.split() for line in printed.stdout.strip().splitlines()]
    longest = max(files, key=lambda row: int(row[0]))[1].removeprefix("./")
    said = answered["content"][0]["text"]
    assert f"{len(files)} Python files with {total} lines" in said and f"{longest} is the longest" in said, said


def test_the_s04_demo_shows_the_parents_context_staying_small(capsys):
    """The parent's two usage lines differ by little, though the child read four files."""
    demo.main(["s04"])
    sizes = context_sizes(capsys.readouterr().out)
    assert len(sizes) == 2 and sizes[1] - sizes[0] < 300


def test_the_documented_demo_command_works_with_no_key(tmp_path):
    """`python tests/demo.py s04`, exactly as the README says, in an environment with no key."""
    done = subprocess.run([sys.executable, "tests/demo.py", "s04"], cwd=ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "SCRIPTED" in done.stdout and "= subagent:" in done.stdout


def test_the_wire_option_shows_each_request_reply_and_the_message_list(capsys):
    """`--wire` prints what the stage sent and got back on each model call (from its own TRANSCRIPT
    feature), then the message list after each turn: what a learner with a key would find in the file."""
    assert demo.main(["s01", "--wire"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- parent request ---") == out.count("--- parent response ---") == 2
    assert '"tool_choice": {' in out and '"stop_reason": "tool_use"' in out
    assert "--- the message list after this turn ---" in out and '"type": "tool_result"' in out


def test_the_demo_explains_its_usage(capsys):
    """An unknown stage name gets the usage line, not a traceback."""
    assert demo.main(["s09"]) == 2
    assert "usage: python tests/demo.py" in capsys.readouterr().err
