"""The page of a recorded run (tests/view.py), checked in a real browser: headless Chromium."""

import datetime
import importlib
import json
import os
import subprocess
import sys

import browser
import demo
import pytest
import view
from conftest import ROOT, clean_env, run_stage
from fake_api import FakeAPI, api_error, press_ctrl_c, reply, tool

HOSTILE = (
    "<script>document.title = 'taken over'</script><img src=x onerror=\"document.title='img'\">"
)


pytestmark = pytest.mark.usefixtures("stages_put_back")  # the demo moves each stage's WORKDIR


def open_browser() -> browser.Browser:
    """A headless Chromium. Without one the test is skipped, but not in CI (CI=true): it fails."""
    if browser.chromium() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed in CI: .ci/run installs it when missing")
        pytest.skip("chromium is not installed (Debian package chromium; .ci/run installs it)")
    return browser.Browser(width=1200, height=900)


def with_new_fields(lines: list) -> list:
    """The demo's transcript with fixed times and session, so that the page can be checked word for
    word. The stages write time, seconds, session, turn, agent, stage and, for a child, its task's id."""
    start = datetime.datetime(2026, 12, 1, 15, 40, tzinfo=datetime.UTC)
    assert all("turn" in line and "session" in line for line in lines), "the stages write them"
    assert all("task" in line for line in lines if line.get("agent") == "child")
    for number, line in enumerate(lines):
        line.update(time=(start + datetime.timedelta(seconds=2 * number)).isoformat(), seconds=1.5,
                    session="3f9a1c2e")
    return lines


def old_format(lines: list) -> list:
    """The transcript as the first stages wrote it: agent, request, response, and no agent at all
    on the parent's lines (every line without one is the parent's)."""
    old = []
    for line in lines:
        agent = {"agent": "child"} if line.get("agent") == "child" else {}
        old.append({**agent, "request": line["request"], "response": line["response"]})
    return old


def read_lines(transcript) -> list:
    return [json.loads(line) for line in transcript.read_text().splitlines()]


def write_lines(transcript, lines: list) -> None:
    transcript.write_text("".join(json.dumps(line) + "\n" for line in lines))


def context_size(line: dict) -> int:
    """The context size of a call, read from the transcript line itself (not from the page)."""
    usage = (line["response"] or {}).get("usage", {})
    return sum(
        usage.get(name) or 0
        for name in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )


# What the browser measures on the page, as one JSON value.
MEASURE = """JSON.stringify({
  title: document.title,
  scripts: document.scripts.length,
  images: document.images.length,
  text: document.body.innerText,
  turns: [...document.querySelectorAll('.divider.turn')].map(e => e.innerText),
  lanes: [...document.querySelectorAll('.lane-head[data-lane]')].map(e => ({
    lane: e.dataset.lane, agent: e.dataset.agent, task: e.dataset.task,
    links: [...e.querySelectorAll('a')].map(a => a.getAttribute('href'))})),
  calls: [...document.querySelectorAll('[data-call]')].map(e => ({
    call: +e.dataset.call, lane: e.dataset.lane, left: e.getBoundingClientRect().left,
    top: e.getBoundingClientRect().top, text: e.innerText,
    uses: [...e.querySelectorAll('[data-tool-use]')].map(u => u.dataset.toolUse),
    results: [...e.querySelectorAll('[data-tool-result]')].map(r => ({
      id: r.dataset.toolResult, classes: r.className, text: r.innerText}))})),
  bars: [...document.querySelectorAll('[data-bar]')].map(e => ({
    call: +e.dataset.bar, height: e.getBoundingClientRect().height,
    cached: e.querySelector('.cached').getBoundingClientRect().height})),
})"""


def look_at(page, picture) -> tuple:
    """Open the page in headless Chromium: what it shows, the errors it reported, what it loaded."""
    with open_browser() as chromium:
        chromium.open(page)
        shown = json.loads(chromium.evaluate(MEASURE))
        chromium.screenshot(picture)
        return shown, chromium.errors(), chromium.requested()


def assert_heights_in_proportion(bars: list, lines: list) -> None:
    """One bar per call, its height proportional to the call's context size, the cached part too."""
    assert [bar["call"] for bar in bars] == list(range(1, len(lines) + 1))
    sizes = [context_size(line) for line in lines]
    tallest = max(bar["height"] for bar in bars)
    assert abs(tallest - view.BAR_HEIGHT) < 1, "the largest context gets the tallest bar"
    pixels_per_token = tallest / max(sizes)
    for bar, line, size in zip(bars, lines, sizes):
        assert abs(bar["height"] - size * pixels_per_token) < 1, (bar, size)
        cached = (line["response"] or {}).get("usage", {}).get("cache_read_input_tokens") or 0
        assert abs(bar["cached"] - cached * pixels_per_token) < 1, (bar, cached)


@pytest.mark.parametrize("fields", ["old", "new"])
@pytest.mark.slow  # starts Chromium: seconds each; CI runs it
def test_the_s04_page_shows_the_parent_and_the_child_in_lanes_tied_by_the_task(
    fields, tmp_path, capsys
):
    """Render the s04 demo's transcript and open it in Chromium: two lanes side by side (every
    parent call in one column, every child call in another), one bar per call with heights in
    proportion to the context sizes, the child lane tied to the task call before it and to the
    result after it. Old transcripts (no time, turn, session or task; no "agent" on the parent's
    lines) work too. A screenshot lands in the test's folder."""
    transcript, page = tmp_path / "wire.jsonl", tmp_path / "run.html"
    demo.run_demo("s04", keep=transcript)
    lines = read_lines(transcript)
    write_lines(transcript, old_format(lines) if fields == "old" else with_new_fields(lines))
    view.write_page(transcript, page)
    shown, errors, fetched = look_at(page, tmp_path / "s04.png")

    assert not errors, errors
    assert all(url.startswith(("file:", "data:")) for url in fetched), "nothing from the network"
    parent, child = shown["lanes"]
    assert (parent["agent"], child["agent"]) == ("parent", "child")
    calls = shown["calls"]
    assert [call["call"] for call in calls] == [1, 2, 3, 4, 5]
    lefts = {lane: {call["left"] for call in calls if call["lane"] == lane} for lane in ("0", "1")}
    assert len(lefts["0"]) == len(lefts["1"]) == 1, "each lane is one column"
    assert min(lefts["1"]) > max(lefts["0"]), "the child's column is right of the parent's"
    assert [call["lane"] for call in calls] == ["0", "1", "1", "1", "0"]
    task_id = lines[0]["response"]["content"][-1]["id"]
    assert child["task"] == task_id and task_id in calls[0]["uses"]
    assert child["links"][:2] == ["#call-1", "#call-5"], "its task call, then its result"
    assert [result["id"] for result in calls[4]["results"]] == [task_id]
    tops = [call["top"] for call in calls]
    assert tops == sorted(tops), "in order, top to bottom"
    assert_heights_in_proportion(shown["bars"], lines)
    assert "Read every file in src/" in calls[1]["text"], "the child's call shows its prompt"
    assert "What do the modules" not in calls[1]["text"], "and nothing of the parent's"
    if fields == "new":  # the time of each call, the session, and the time per agent
        assert calls[0]["text"].startswith("call 1 · 15:40:00 · 1.5s")
        assert "session 3f9a1c2e s04" in shown["text"]  # and the stage that ran it
        assert "3.0s" in shown["text"] and "4.5s" in shown["text"]
    assert (tmp_path / "s04.png").read_bytes().startswith(b"\x89PNG")


def record_a_bad_run(stage, transcript, workspace) -> None:
    """A session with a child whose command is refused, a file of hostile text, an API error and a
    model refusal, against a scripted model (the stage's TRANSCRIPT setting records it)."""
    (workspace / "notes.html").write_text(HOSTILE)
    script = [
        reply(tool("task", description=HOSTILE, prompt="Read notes.html, and try sudo.")),
        reply(tool("bash", command="sudo cat /etc/shadow")),  # the child: refused by the filter
        reply(tool("read_file", path="notes.html")),
        reply(f"notes.html holds {HOSTILE}"),
        reply("The file holds markup."),  # the parent again
        api_error(500, f"overloaded {HOSTILE}"),  # turn 2 fails, and is dropped
        reply("I will not do that.", stop_reason="refusal"),  # turn 3: the model refuses
    ]
    with FakeAPI(script) as api:
        stage.WORKDIR, stage.client = workspace, api.client()
        messages = []
        for typed in ("What is in notes.html?", "And now?", "Something forbidden"):
            stage.run_turn(messages, typed)


@pytest.mark.slow  # starts Chromium: seconds each; CI runs it
def test_a_refusal_an_api_error_and_hostile_text_are_shown_as_such(tmp_path, capsys, monkeypatch):
    """A run with a refused command, an API error (no reply; the new `error` field is shown when
    the line has it) and a model refusal, full of `<script>` and `onerror=`: in Chromium, no script
    runs (the title is unchanged, the page holds no script or image element), the hostile text is
    shown as text, the refusal and the error are marked, every call has its bar (a failed call's is
    empty), and the page reports no errors."""
    workspace, transcript, page = tmp_path / "work", tmp_path / "wire.jsonl", tmp_path / "bad.html"
    workspace.mkdir()
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    record_a_bad_run(importlib.import_module("s04_subagent"), transcript, workspace)
    lines = with_new_fields(read_lines(transcript))
    failed = [line for line in lines if line["response"] is None]
    assert len(failed) == 1
    failed[0]["error"] = f"API error 500: overloaded {HOSTILE}"
    write_lines(transcript, lines)
    view.write_page(transcript, page)
    shown, errors, _ = look_at(page, tmp_path / "bad.png")

    assert not errors, errors
    assert shown["title"].startswith("The run recorded in"), "no script ran"
    assert shown["scripts"] == shown["images"] == 0, "no element came from the transcript"
    assert shown["text"].count("<script>document.title = 'taken over'</script>") >= 4
    calls = shown["calls"]
    assert len(calls) == len(lines) == 7
    refused = [result for call in calls for result in call["results"] if "sudo" in result["text"]]
    assert len(refused) == 1 and "is-error" in refused[0]["classes"]
    assert "refused by the filter" in refused[0]["text"]
    assert "no reply" in calls[5]["text"]
    assert "API error 500: overloaded <script>" in calls[5]["text"]
    assert "stop_reason: refusal" in calls[6]["text"]
    assert_heights_in_proportion(shown["bars"], lines)
    assert shown["bars"][5]["height"] == 0
    assert (tmp_path / "bad.png").read_bytes().startswith(b"\x89PNG")


def test_the_viewer_writes_one_page_and_prints_its_path(tmp_path):
    """`python tests/view.py wire.jsonl -o page.html`: the page is written, its path printed, and it
    loads nothing from elsewhere (no script, no stylesheet, no font)."""
    transcript = tmp_path / "wire.jsonl"
    write_lines(
        transcript,
        [
            {
                "request": {"messages": [{"role": "user", "content": "hi"}]},
                "response": {
                    "content": [{"type": "text", "text": "hello"}],
                    "stop_reason": "end_turn",
                    "usage": {"input_tokens": 10, "output_tokens": 2},
                },
            }
        ],
    )
    done = subprocess.run(
        [sys.executable, "tests/view.py", str(transcript), "-o", str(tmp_path / "page.html")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "page.html")
    text = (tmp_path / "page.html").read_text()
    assert (
        "hello" in text and "<script" not in text and "http" not in text.replace("http-equiv", "")
    )


def test_the_viewer_never_writes_its_page_through_a_link(tmp_path, capsys):
    """A command can leave wire.html, where the page goes by default, as a link to ~/.bashrc (or
    to a .pth file the agent's Python runs at start), or make the folder the page goes to a link
    to the home folder. The page is written as a new file renamed into place: the link is
    replaced, and the file it led to keeps its content; a folder reached through a link is
    refused, with the folder to name instead, and nothing is written there."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("as it was\n")
    transcript = tmp_path / "wire.jsonl"
    write_lines(transcript, [{"request": {"messages": [{"role": "user", "content": "hi"}]}}])
    (tmp_path / "wire.html").symlink_to(home / ".bashrc")
    (tmp_path / "pages").symlink_to(home)
    assert view.main([str(transcript)]) == 0
    assert view.main([str(transcript), "-o", str(tmp_path / "pages" / ".bashrc")]) == 2
    assert str(home) in capsys.readouterr().err
    assert (home / ".bashrc").read_text() == "as it was\n" and sorted(os.listdir(home)) == [".bashrc"]
    assert not (tmp_path / "wire.html").is_symlink() and "hi" in (tmp_path / "wire.html").read_text()


def test_the_viewer_cuts_a_long_tool_result_and_says_how_much(tmp_path):
    """A tool result of 50,000 characters is shown cut, with a note of the characters left out."""
    long_result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "x" * 50_000,
        "is_error": False,
    }
    calls = view.read_calls(
        [
            json.dumps(
                {
                    "request": {"messages": [{"role": "user", "content": [long_result]}]},
                    "response": None,
                }
            )
        ]
    )
    page = view.render_page(calls, "long")
    assert "x" * view.MAX_SHOWN in page and "x" * (view.MAX_SHOWN + 1) not in page
    assert f"[{50_000 - view.MAX_SHOWN:,} more characters cut here]" in page


def test_what_the_wall_stopped_is_marked(tmp_path):
    """A command that the wall (bubblewrap) kept from writing fails with "Read-only file system":
    its result is marked as stopped by the wall, though the tool itself did not fail."""
    walled = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "is_error": False,
        "content": "touch: cannot touch '/usr/x': Read-only file system\n(exit code 1)",
    }
    line = {"request": {"messages": [{"role": "user", "content": [walled]}]}, "response": None}
    page = view.render_page(view.read_calls([json.dumps(line)]), "walled")
    assert "stopped by the wall" in page and "is_error</span>" not in page


def test_the_viewer_survives_lines_that_are_not_calls(tmp_path):
    """A broken line, a line that is not an object, a call without a request, or fields of the
    wrong type (a message that is a number, a tool input that is a list, counts that are text)
    show as calls, with a note where one is due; nothing stops the page from being written."""
    odd_reply = {
        "content": [7, {"type": "tool_use", "id": [3], "name": "task", "input": [1]}],
        "usage": {"input_tokens": "many"},
        "stop_reason": None,
    }
    odd = [
        {"agent": "parent", "request": {"messages": []}, "response": None},
        {
            "agent": "parent",
            "request": {
                "messages": [
                    5,
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": {}}]},
                ]
            },
            "response": odd_reply,
            "time": 12,
            "seconds": "long",
            "turn": [1],
        },
        {"agent": "child", "task": ["x"], "request": {"messages": "all"}, "response": odd_reply},
        {"agent": "martian", "request": [], "response": "yes", "error": {"why": "no"}},
    ]
    lines = [json.dumps(line) for line in odd[:2]] + ["not json", "[1, 2]", "{}"]
    transcript = tmp_path / "wire.jsonl"
    transcript.write_text("\n".join(lines + [json.dumps(line) for line in odd[2:]]) + "\n")
    assert view.main([str(transcript)]) == 0
    page = (tmp_path / "wire.html").read_text()
    assert page.count("data-call=") == 7 == page.count("data-bar=")
    assert "line 3 is not JSON" in page and "line 4 is not a JSON object" in page


@pytest.mark.parametrize("text", ["# A README\n\nSome *prose*, then {braces}.\n", "", "[1, 2]\n"],
                         ids=["prose", "empty", "json_but_no_call"])
def test_the_viewer_refuses_a_file_that_is_not_a_transcript(text, tmp_path, capsys):
    """`python tests/view.py README.md` once wrote a page of "not JSON" calls and said nothing was
    wrong. A file in which no line is a model call is refused with the reason and status 2, and
    no page is written."""
    notes = tmp_path / "notes.md"
    notes.write_text(text)
    assert view.main([str(notes)]) == 2
    assert str(notes) in capsys.readouterr().err
    assert not (tmp_path / "notes.html").exists()


def test_a_reply_cut_off_midway_is_shown_with_its_error_not_as_a_reply_that_ended(
    tmp_path, monkeypatch, capsys
):
    """The server closes the stream after the first words: s01 records the half reply and the
    error it told the user. The page shows that error with the reply and marks the turn cut short
    by it, not by a puzzling `stop_reason: None`."""
    import s01_loop

    transcript, page = tmp_path / "wire.jsonl", tmp_path / "wire.html"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    with FakeAPI([reply("Half of it", hang_up=True)]) as api:
        s01_loop.WORKDIR, s01_loop.client = tmp_path, api.client()
        s01_loop.run_turn([], "talk")
    view.write_page(transcript, page)
    [call] = view.read_calls(transcript.read_text().splitlines())
    text = page.read_text()
    assert call["response"] and "stopped midway" in call["error"]
    assert "cut short: the reply stopped midway" in text and text.count("stopped midway") == 2


def test_the_page_names_the_stage_that_ran_each_session(tmp_path, monkeypatch):
    """Each transcript line names its stage, and the page shows it beside the session it ran, so
    a transcript of s01 is not read as one of s04."""
    import s02_tools

    transcript, page = tmp_path / "wire.jsonl", tmp_path / "wire.html"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    with FakeAPI([reply("hello")]) as api:
        monkeypatch.setattr(s02_tools, "WORKDIR", tmp_path)
        monkeypatch.setattr(s02_tools, "client", api.client())
        s02_tools.run_turn([], "hi")
    view.write_page(transcript, page)
    assert f"session {s02_tools.SESSION} s02 " in page.read_text()


def test_the_viewer_explains_a_missing_file(tmp_path, capsys):
    """A transcript that does not exist gets one line and status 2, not a traceback."""
    assert view.main([str(tmp_path / "nowhere.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.slow  # starts Chromium: seconds each; CI runs it
def test_two_subagents_of_one_turn_get_a_lane_each_tied_to_their_own_task(tmp_path):
    """A real run: s04 as a program, its TRANSCRIPT setting on, a scripted model that starts two
    children in one reply. The page has a lane per child, each tied to its own task call (by its
    prompt when the lines do not name the task) and to the one result that carried its answer."""
    (tmp_path / "a.py").write_text("print('hi')\n")
    script = [
        reply(
            tool("task", description="one", prompt="List the files."),
            tool("task", description="two", prompt="Read a.py."),
        ),
        reply(tool("list_dir")),
        reply("a.py only."),  # child one
        reply(tool("read_file", path="a.py")),
        reply("It prints hi."),  # child two
        reply("Both done."),
    ]
    with FakeAPI(script) as api:
        env = clean_env(
            ANTHROPIC_API_KEY="test",
            ANTHROPIC_BASE_URL=api.url,
            SANDBOX="off",
            TRANSCRIPT=str(tmp_path / "wire.jsonl"),
        )
        done = run_stage(ROOT / "s04_subagent.py", "look\n", env, tmp_path)
    assert "Both done." in done.stdout, done.stdout + done.stderr
    calls = view.read_calls((tmp_path / "wire.jsonl").read_text().splitlines())
    parent, one, two = view.build_lanes(calls)
    task_one, task_two = calls[0]["response"]["content"]
    assert [one["name"], two["name"]] == ["child 1: one", "child 2: two"]
    assert [one["task"], two["task"]] == [task_one["id"], task_two["id"]]
    assert [call["number"] for call in parent["calls"]] == [1, 6]
    assert [call["number"] for call in one["calls"]] == [2, 3]
    assert [call["number"] for call in two["calls"]] == [4, 5]
    assert one["result_call"] is two["result_call"] is calls[5]
    page = view.render_page(calls, "two children")
    assert page.count('class="lane-head') == 3 and page.count('class="waiting"') == 2


# -- a turn cut short: the stage drops it from its history, the page says so ----------------------


def page_of_turns(typed: list, script: list, tmp_path, monkeypatch) -> dict:
    """Type `typed` into s04, one turn each, against a scripted model, with TRANSCRIPT on; render
    the transcript and open the page in Chromium. Returns what the page shows."""
    stage = importlib.import_module("s04_subagent")
    transcript, page = tmp_path / "wire.jsonl", tmp_path / "run.html"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    monkeypatch.setattr(stage, "turn_number", 0)  # the turns of this session count from 1
    with FakeAPI(script) as api:
        stage.WORKDIR, stage.client = tmp_path, api.client()
        messages = []
        for words in typed:
            stage.run_turn(messages, words)
    view.write_page(transcript, page)
    shown, errors, _ = look_at(page, tmp_path / "run.png")
    assert not errors, errors
    return shown


@pytest.mark.slow  # starts Chromium: seconds each; CI runs it
def test_a_turn_cut_short_by_an_api_error_is_marked_and_its_dropped_messages_counted(
    tmp_path, monkeypatch, capsys
):
    """Turn 2 makes a tool call, then its next model call fails (API error 500): the stage drops
    the whole turn (the typed words, the tool call, its result) and the user types the same words
    again. The page marks turn 2 as cut short, with the error; turn 3's call says that the 3
    messages of turn 2 are no longer sent, and shows the words typed again as new (its request
    starts the same as turn 2's first one, yet it is a new turn)."""
    script = [
        reply("Hello."),
        reply(tool("list_dir")),
        api_error(500, "overloaded"),  # turn 2 fails here, and is dropped
        reply("Only run.png."),
    ]
    typed = ["Hello there", "list the files", "list the files"]
    shown = page_of_turns(typed, script, tmp_path, monkeypatch)

    first, cut, again = shown["turns"]
    assert first == "turn 1: Hello there" and again == "turn 3: list the files"
    assert cut.startswith("turn 2: list the files cut short: API error 500 (api_error: overloaded)")
    calls = shown["calls"]
    assert len(calls) == 4 and "no reply" in calls[2]["text"]
    assert "3 message(s) of turn 2 are no longer sent" in calls[3]["text"]
    assert "sent (new)\nuser\nlist the files" in calls[3]["text"]
    assert "no longer sent" not in calls[0]["text"] + calls[1]["text"] + calls[2]["text"]


@pytest.mark.slow  # starts Chromium: seconds each; CI runs it
def test_a_turn_interrupted_while_its_child_works_is_marked_and_its_dropped_messages_counted(
    tmp_path, monkeypatch, capsys
):
    """Turn 1 gets an empty reply (the stage adds nothing to the history, so two user messages
    follow each other). Turn 2's first reply is paused (pause_turn: it goes back as its own
    assistant message), then the parent starts a child, and Ctrl-C stops the child's model call.
    The stage drops turn 2: the typed words, the paused reply and the task call. The page marks
    turn 2 as cut short (interrupted), and turn 3's call says that those 3 messages are no longer
    sent and shows only what is new: the words of turn 3."""
    script = [
        reply(),  # turn 1: an empty reply
        reply("Looking.", stop_reason="pause_turn"),
        reply(tool("task", description="explore", prompt="List the files.")),
        press_ctrl_c,  # the child's model call: Ctrl-C
        reply("Fine."),
    ]
    shown = page_of_turns(["Hello there", "explore", "and now?"], script, tmp_path, monkeypatch)

    assert shown["turns"] == [
        "turn 1: Hello there",
        "turn 2: explore cut short: interrupted",
        "turn 3: and now?",
    ]
    calls = shown["calls"]
    assert [call["lane"] for call in calls] == ["0", "0", "0", "1", "0"]
    assert "sent (new)" not in calls[2]["text"], "the paused reply goes back: nothing else is new"
    assert "assistant: the reply above" in calls[2]["text"]
    assert "interrupted" in calls[3]["text"], "the child's call"
    assert "3 message(s) of turn 2 are no longer sent" in calls[4]["text"]
    assert "sent (new)\nuser\nand now?" in calls[4]["text"]
    assert "Hello there" not in calls[4]["text"], "turn 1's words were sent before"


@pytest.mark.slow  # starts Chromium: seconds each; CI runs it
def test_a_turn_dropped_after_ctrl_c_in_a_tool_is_marked_though_no_call_failed(
    tmp_path, monkeypatch, capsys
):
    """Ctrl-C while a command runs: every model call of turn 2 got its reply, so no line of the
    transcript says that the turn failed; the next request shows it, as it no longer carries the
    turn's 2 messages (the typed words and the tool call). The page marks turn 2 as cut short
    and counts the 2 dropped messages, though turn 3's words are the same as turn 2's."""
    monkeypatch.setenv("SANDBOX", "off")  # inside s03's wall a command cannot signal the agent
    ctrl_c = "kill -INT $PPID; sleep 20"  # the shell's parent is this process
    script = [reply("Hello."), reply(tool("bash", command=ctrl_c)), reply("Done.")]
    shown = page_of_turns(["Hello there", "run it", "run it"], script, tmp_path, monkeypatch)

    first, cut, again = shown["turns"]
    assert first == "turn 1: Hello there" and again == "turn 3: run it"
    assert cut == f"turn 2: run it cut short: {view.DROPPED_UNSAID}"
    calls = shown["calls"]
    assert len(calls) == 3 and "no reply" not in shown["text"]
    assert "2 message(s) of turn 2 are no longer sent" in calls[2]["text"]
    assert "sent (new)\nuser\nrun it" in calls[2]["text"]
