"""Stage 4: the subagent. A `task` tool runs a child agent in a fresh conversation and gives the
parent only its final text. Each test scripts both models: the parent's calls and the child's."""

import json

import pytest
from conftest import Terminal, context_sizes, ctrl_c_cancels_only_that_turn
from fake_api import FakeAPI, api_error, history_problem, reply, tool

import s04_subagent as s04

CHILD_NAMES = ["bash", "read_file", "write_file", "edit_file", "list_dir"]


def tool_names(request: dict) -> list:
    return [t["name"] for t in request["tools"]]


def is_child(request: dict) -> bool:
    """Told apart by the system prompt, not by the tools: a child offered task must still be seen as the child."""
    return request["system"] == s04.child_system_prompt()


def delegate(prompt: str = "Find where the tests live.", description: str = "explore tests") -> dict:
    """The parent's reply that hands `prompt` to a subagent."""
    return reply(tool("task", prompt=prompt, description=description))


def task_result(model) -> dict:
    """The tool_result the parent got back for its task call."""
    after = [r for r in model.requests if not is_child(r)][1]
    return after["messages"][-1]["content"][0]


def test_the_child_has_the_s03_tools_and_the_parent_adds_only_task():
    """CHILD_TOOLS are s03's five tools; PARENT_TOOLS are those plus task, and nothing else."""
    assert [t["name"] for t in s04.CHILD_TOOLS] == CHILD_NAMES
    assert [t["name"] for t in s04.PARENT_TOOLS] == [*CHILD_NAMES, "task"]


def test_the_child_starts_from_a_fresh_conversation_holding_only_the_prompt(scripted):
    """Context isolation: the child sees the task prompt and nothing of the parent's conversation,
    with its own system prompt and without the task tool."""
    model = scripted(s04, [reply("earlier answer"), delegate("List the test files."), reply("tests/ has 4 files."),
                           reply("Done.")])
    messages = []
    s04.run_turn(messages, "a first, unrelated question")
    s04.run_turn(messages, "where are the tests?")
    [child] = [r for r in model.requests if is_child(r)]
    assert child["messages"] == [{"role": "user", "content": "List the test files."}]
    assert child["system"] == s04.child_system_prompt() != s04.system_prompt()
    assert "task" not in tool_names(child), "the child was offered task: it could start children of its own"
    assert tool_names(child) == CHILD_NAMES


def test_only_the_childs_final_text_reaches_the_parent(scripted, workspace):
    """What the child read stays in the child: the parent gets its summary as the task result."""
    (workspace / "big.txt").write_text("DETAIL-" * 2000)
    model = scripted(s04, [delegate(), reply(tool("read_file", path="big.txt")), reply("big.txt repeats DETAIL."),
                           reply("Summary received.")])
    s04.run_turn([], "what is in big.txt?")
    result = task_result(model)
    assert result["content"] == "big.txt repeats DETAIL." and not result["is_error"]
    parent_after = [r for r in model.requests if not is_child(r)][1]
    assert "DETAIL-DETAIL" not in str(parent_after["messages"])


def test_the_parent_history_grows_by_one_tool_use_and_one_tool_result(scripted):
    """However many turns the child takes, the parent's history gets one task call and its result."""
    scripted(s04, [delegate(), reply(tool("bash", command="ls")), reply(tool("bash", command="pwd")), reply("found"),
                   reply("Done.")])
    messages = []
    s04.run_turn(messages, "explore")
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert [b.type for b in messages[1]["content"]] == ["tool_use"]
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result"]


def test_a_child_that_calls_task_gets_an_unknown_tool_error(scripted):
    """Recursion is impossible by construction: task is not among the child's tools, so a child
    that names it anyway is told it does not exist."""
    model = scripted(s04, [delegate(), reply(tool("task", prompt="go deeper")), reply("I could not delegate."),
                           reply("Done.")])
    s04.run_turn([], "go")
    child_second = [r for r in model.requests if is_child(r)][1]
    result = child_second["messages"][-1]["content"][0]
    assert result["is_error"] and "no tool 'task'" in result["content"]
    assert len([r for r in model.requests if is_child(r)]) == 2  # no grandchild was started


def test_the_child_works_behind_the_same_fences(scripted, workspace):
    """The child's tools go through the same safe_path and check_command as the parent's."""
    model = scripted(s04, [delegate(), reply(tool("read_file", path="../outside.txt"), tool("bash", command="sudo ls")),
                           reply("Both were refused."), reply("Done.")])
    s04.run_turn([], "go")
    escape, sudo = [r for r in model.requests if is_child(r)][1]["messages"][-1]["content"]
    assert escape["is_error"] and "outside the workspace" in escape["content"]
    assert sudo["is_error"] and "refused, not run" in sudo["content"]


def test_a_child_that_hits_the_turn_cap_says_it_did_not_finish(scripted):
    """After SUBAGENT_MAX_CALLS model calls the child is stopped, and the parent gets an error
    saying so, naming the child's setting, with the child's last text, not a partial answer
    dressed up as a summary."""
    busy = [reply(f"still looking ({n})", tool("bash", command="true")) for n in range(s04.SUBAGENT_MAX_CALLS)]
    model = scripted(s04, [delegate(), *busy, reply("The child gave up.")])
    s04.run_turn([], "go")
    assert len([r for r in model.requests if is_child(r)]) == s04.SUBAGENT_MAX_CALLS == 30
    result = task_result(model)
    assert result["is_error"] and "30 calls without finishing" in result["content"]
    assert "(SUBAGENT_MAX_CALLS)" in result["content"] and "MAX_MODEL_CALLS" not in result["content"]
    assert "still looking (29)" in result["content"]


def test_a_child_with_no_final_text_gives_a_placeholder(scripted):
    """A child that ends without any text still answers: with an explicit placeholder."""
    model = scripted(s04, [delegate(), reply(), reply("Done.")])
    s04.run_turn([], "go")
    assert task_result(model)["content"] == "(subagent returned no text)"


def test_an_api_error_inside_the_child_is_an_error_result_and_the_parent_carries_on(scripted, capsys):
    """The child's API call fails: the parent gets an is_error result describing it, and goes on."""
    with FakeAPI([delegate(), api_error(500, "child call broke"), reply("The subagent failed; I will look myself.")]) as api:
        scripted(s04, None, client=api.client())
        messages = []
        s04.run_turn(messages, "go")
        result = api.requests[2]["messages"][-1]["content"][0]
    assert result["is_error"] and "subagent stopped" in result["content"] and "child call broke" in result["content"]
    assert "I will look myself." in capsys.readouterr().out and history_problem(messages) is None


def test_ctrl_c_while_the_child_works_returns_to_the_prompt_with_a_valid_history(scripted, capsys):
    """Ctrl-C during the child's model call stops the child and the parent's turn; the session goes on."""
    ctrl_c_cancels_only_that_turn(s04, scripted, capsys, turn_so_far=[delegate()])  # the child's call is interrupted


def test_the_learner_sees_the_task_the_childs_calls_indented_and_one_summary_line(scripted, capsys):
    """The terminal shows the nesting: the task with its description, the child's calls (and its
    usage lines) indented beneath it, then one line, named by the task's description, with its
    replies, tools and seconds (never sent to the model)."""
    model = scripted(s04, [delegate(description="count files"), reply(tool("bash", command="ls"), tool("bash", command="pwd")),
                           reply("3 files"), reply("There are 3 files.")])
    s04.run_turn([], "how many files?")
    lines = capsys.readouterr().out.splitlines()
    task = next(i for i, line in enumerate(lines) if "> task:" in line and "count files" in line)
    child_calls = [line for line in lines[task:] if "    > bash:" in line]
    summary = [line for line in lines if "= subagent" in line]
    assert len(child_calls) == 2 and len(summary) == 1
    assert "2 replies" in summary[0] and "bash x2" in summary[0] and summary[0].endswith("s")
    assert "count files" in summary[0]
    assert "= subagent" not in str(model.requests)


def test_the_summary_line_says_1_reply_for_a_child_that_answered_at_once(scripted, capsys):
    """A child that answers at once made one reply, and its line says so: "1 reply"."""
    scripted(s04, [delegate(), reply("Nothing to do."), reply("Done.")])
    s04.run_turn([], "go")
    [summary] = [line for line in capsys.readouterr().out.splitlines() if "= subagent" in line]
    assert summary.endswith("s") and ": 1 reply, no tools," in summary


def test_a_tool_name_with_an_escape_sequence_is_escaped_in_the_summary_line(scripted, capsys):
    """The summary line names the child's tools as the model wrote them: a made-up name holding an
    escape sequence reaches the screen escaped there too, as on every other line."""
    scripted(s04, [delegate(), reply(tool("\x1b]0;taken over\x07")), reply("Done."), reply("ok")])
    s04.run_turn([], "go")
    out = capsys.readouterr().out
    [summary] = [line for line in out.splitlines() if "= subagent" in line]
    assert "\\x1b]0;taken over\\x07 x1" in summary
    assert "\x1b" not in out and "\x07" not in out


def test_agent_loop_given_only_the_messages_is_the_parent(scripted, monkeypatch):
    """As in s01-s03, agent_loop(messages) runs the parent: its tools (task among them), its system
    prompt and its cap, MAX_MODEL_CALLS. Only run_subagent passes a child's."""
    monkeypatch.setattr(s04, "MAX_MODEL_CALLS", 2)  # the setting, as main() reads it
    model = scripted(s04, [reply(tool("bash", command="true")) for _ in range(3)])
    with pytest.raises(s04.TurnFailed, match="2 calls without finishing"):
        s04.agent_loop([{"role": "user", "content": "go"}])
    assert len(model.requests) == 2
    assert all(tool_names(request) == [*CHILD_NAMES, "task"] for request in model.requests)
    assert model.requests[0]["system"] == s04.system_prompt()


def test_the_usage_line_shows_the_parents_context_staying_small(scripted, workspace, capsys):
    """The parent's usage lines (not indented: a child's are) show that delegating a large read
    barely grows the parent's context."""
    for n in range(10):
        (workspace / f"f{n}.txt").write_text("x" * 4000)
    reads = reply(*[tool("read_file", path=f"f{n}.txt") for n in range(10)])
    scripted(s04, [delegate(), reads, reply("Ten files of x."), reply("Done.")])
    s04.run_turn([], "read everything")
    parent_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    sizes = context_sizes("\n".join(parent_lines))
    assert len(sizes) == 2  # the parent's two calls
    assert sizes[1] - sizes[0] < 500  # the child read about 10,000 tokens


@pytest.mark.parametrize("tool_input", [{"prompt": 123}, {"prompt": None}, {"prompt": "go", "description": 7}])
def test_a_task_call_with_bad_arguments_is_an_error_and_starts_no_child(tool_input, scripted):
    """The task tool's arguments are checked like any other tool's (and shown without crashing)."""
    model = scripted(s04, [reply(tool("task", **tool_input)), reply("ok")])
    s04.run_turn([], "go")
    assert model.requests[1]["messages"][-1]["content"][0]["is_error"]
    assert not [r for r in model.requests if is_child(r)]


def test_the_transcript_tells_the_childs_calls_from_the_parents(scripted, tmp_path, monkeypatch):
    """TRANSCRIPT records every model call; the child's say "agent": "child" and hold only its own
    conversation, so a learner can see what each agent really sent."""
    transcript = tmp_path / "wire.jsonl"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    scripted(s04, [delegate("List the files."), reply(tool("bash", command="ls")), reply("no files"), reply("Done.")])
    s04.run_turn([], "go")
    lines = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [line["agent"] for line in lines] == ["parent", "child", "child", "parent"]
    assert lines[1]["request"]["messages"] == [{"role": "user", "content": "List the files."}]


def test_a_childs_calls_belong_to_the_turn_of_its_task_call(scripted, tmp_path, monkeypatch):
    """In the transcript, a child's calls carry the turn of the task call that started them: the
    prompt a child starts from is not a turn of yours."""
    transcript = tmp_path / "wire.jsonl"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    monkeypatch.setattr(s04, "turn_number", 0)
    scripted(s04, [delegate(), reply(tool("bash", command="ls")), reply("no files"), reply("Done."),
                   reply("Again.")])
    messages = []
    s04.run_turn(messages, "one")
    s04.run_turn(messages, "two")
    lines = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [(line["agent"], line["turn"]) for line in lines] == [
        ("parent", 1), ("child", 1), ("child", 1), ("parent", 1), ("parent", 2)]


def test_two_tasks_of_one_turn_are_told_apart_in_the_transcript(scripted, tmp_path, monkeypatch):
    """Each child's transcript lines name the task call that started it ("task": its tool_use id),
    so two children of one turn can be told apart; the parent's lines have no "task"."""
    transcript = tmp_path / "wire.jsonl"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    first, second = tool("task", prompt="Look at a."), tool("task", prompt="Look at b.")
    children = [reply("a is fine"), reply("b is fine")]
    scripted(s04, [reply(first, second), *children, reply("Both fine.")])
    s04.run_turn([], "check a and b")
    lines = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert [line.get("task") for line in lines] == [None, first["id"], second["id"], None]
    assert [line["agent"] for line in lines] == ["parent", "child", "child", "parent"]
    assert lines[1]["request"]["messages"][0]["content"] == "Look at a."



def test_on_a_terminal_the_childs_first_words_are_indented_after_its_waiting_line(
        scripted, monkeypatch):
    """On a terminal each model call shows a waiting line until its first word, and the first
    word takes that line's place. A child's first words are indented under its task all the same."""
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    scripted(s04, [delegate(), reply("Child words."), reply("Parent words.")])
    s04.run_turn([], "go")
    child_line = next(line for line in terminal.getvalue().split("\n") if "Child words." in line)
    assert child_line.endswith("\r    \033[KChild words.")  # its waiting line, then its words
