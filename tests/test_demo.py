"""The offline demo: every stage runs for real against a scripted model, with no key."""

import re
import subprocess
import sys
from pathlib import Path

import demo
import pytest
from conftest import ROOT, clean_env, context_sizes

EXPECTED = {  # what each stage's demo must show a newcomer
    "s01": ["> bash:", "20 lines"],
    "s02": ["> edit_file: greet.py", "Hello, world!"],
    "s03": ["outside the workspace", "refused, not run: sudo", "> bash: rm -rf build/"],
    "s04": ["> task: survey src/", "    > read_file: src/cli.py", "= subagent (survey src/): 3 replies"],
}


pytestmark = pytest.mark.usefixtures("stages_put_back")  # the demo moves each stage's WORKDIR


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
    """The parent's two usage lines (a child's are indented) differ by little, though the child
    read four files."""
    demo.main(["s04"])
    parent_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    sizes = context_sizes("\n".join(parent_lines))
    assert len(sizes) == 2 and sizes[1] - sizes[0] < 300


def test_the_s04_demo_says_what_the_parents_context_grew_by(capsys):
    """Between the parent's two calls, its context grows by its own reply (its text and the task
    call) and by the task's result, which holds the child's summary. The demo counts both: they
    are the parent's messages 2 and 3 in its table, and they add up to the growth its usage lines
    show, but for the punctuation between messages."""
    assert demo.main(["s04"]) == 0
    out = capsys.readouterr().out
    sizes = context_sizes("\n".join(line for line in out.splitlines() if line.startswith("[")))
    said = re.search(r"grew by ([\d,]+) tokens.*?~([\d,]+) are its own reply.*?~([\d,]+) are the task's",
                     out, re.DOTALL)
    grew, own_reply, result = [int(figure.replace(",", "")) for figure in said.groups()]
    assert grew == sizes[1] - sizes[0]
    assert 0 <= grew - (own_reply + result) <= 5
    table = out.split("=== the message lists at the end")[1].splitlines()
    parent_rows = {row[:2].strip(): row[:38].split()[-1] for row in table if row[:2].strip().isdigit()}
    assert parent_rows["2"] == str(own_reply) and parent_rows["3"] == str(result)


def test_the_documented_demo_command_works_with_no_key(tmp_path):
    """`python tests/demo.py s04`, exactly as the README says, in an environment with no key."""
    done = subprocess.run([sys.executable, "tests/demo.py", "s04"], cwd=ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "SCRIPTED" in done.stdout and "= subagent" in done.stdout


def test_the_wire_option_shows_what_each_call_adds_and_the_tools_once(capsys):
    """`--wire` prints, for each model call (from the stage's own TRANSCRIPT feature), only the
    messages its request adds to that agent's previous one, then the reply; the system prompt and
    the tool list are printed once per agent, not on every call."""
    assert demo.main(["s04", "--wire"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- call ") == 5 and out.count("system prompt: ") == out.count("tools (") == 2
    assert "  bash(command): Run a shell command" in out and "task(prompt, description?)" in out
    asked = "user       text: What do the modules in src/ do?"
    assert out.count(asked) == 1, "each message is shown once"
    assert "got back: stop_reason tool_use" in out and "tool_result toolu_" in out
    assert "(its reply above)" in out and len(out.splitlines()) < 120


def test_the_wire_full_option_shows_each_request_and_reply_whole(capsys):
    """`--wire-full` prints every request and reply as sent and received, then the message list
    after each turn: what a learner with a key would find in the TRANSCRIPT file."""
    assert demo.main(["s01", "--wire-full"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- parent request ---") == out.count("--- parent response ---") == 2
    assert '"tool_choice": {' in out and '"stop_reason": "tool_use"' in out
    assert "--- the message list after this turn ---" in out and '"type": "tool_result"' in out


def test_the_s04_demo_ends_with_both_message_lists_side_by_side(capsys):
    """The parent keeps 4 messages; the child's 6, beside them, are thrown away: role, block types
    and size of each, and the command that draws the run as a page."""
    assert demo.main(["s04"]) == 0
    out = capsys.readouterr().out.split("=== the message lists at the end")[1]
    assert "parent (kept): 4 messages" in out
    assert "child 1: survey src/ (thrown away): 6 messages" in out
    [row] = [line for line in out.splitlines() if "tool_result x3" in line]
    assert row.startswith(" " * 30) and row.split()[:2] == ["5", "user"], "no parent row beside"
    assert "python tests/demo.py s04 --html run.html" in out


def test_the_html_option_writes_a_page_of_the_run(tmp_path, capsys):
    """`--html run.html` writes the page of tests/view.py for the demo's run, and says where."""
    assert demo.main(["s04", "--html", str(tmp_path / "run.html")]) == 0
    assert f"The picture of this run: {tmp_path / 'run.html'}" in capsys.readouterr().out
    page = (tmp_path / "run.html").read_text()
    assert page.count("data-call=") == page.count("data-bar=") == 5


def test_output_into_a_pipe_that_closes_early_ends_quietly(tmp_path):
    """`python tests/demo.py s01 --wire | head` closes the pipe after ten lines: the demo stops
    without a BrokenPipeError traceback. (Here the pipe is closed before the first line.)"""
    demo_run = subprocess.Popen([sys.executable, str(ROOT / "tests/demo.py"), "s01", "--wire"],
                                cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    demo_run.stdout.close()  # as `head` does once it has its lines
    errors = demo_run.stderr.read()
    assert demo_run.wait(timeout=60) != 0
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors


@pytest.mark.slow  # starts Chromium: seconds; CI runs it
def test_a_picture_alone_names_no_page_that_is_gone(tmp_path, capsys):
    """`--png x.png` without `--html` draws the page in a temporary folder: what the demo prints
    names only files that are still there when it ends (the picture, not the deleted page)."""
    code = demo.main(["s04", "--png", str(tmp_path / "x.png")])
    out = capsys.readouterr().out
    named = [Path(word.rstrip(".,)")) for word in out.split() if word.endswith((".png", ".html"))]
    assert code == 0 and tmp_path / "x.png" in named
    assert all(path.exists() for path in named if path.is_absolute()), out


def test_the_demo_explains_its_usage(capsys):
    """An unknown stage name gets the usage line, not a traceback."""
    assert demo.main(["s09"]) == 2
    assert "usage: python tests/demo.py" in capsys.readouterr().err
