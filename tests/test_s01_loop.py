"""Stage 1: the agent loop. Every later stage must keep these promises, so most tests run on all stages."""

import ast
import contextlib
import http.server
import io
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from datetime import datetime

import anthropic
import pytest
from conftest import (
    ROOT,
    STAGE_NAMES,
    Terminal,
    call_tool,
    clean_env,
    context_sizes,
    ctrl_c_cancels_only_that_turn,
    run_stage,
    stages_from,
)
from fake_api import (
    APACHE_501,
    NGINX_500,
    SILENCE,
    FakeAPI,
    Gate,
    api_error,
    broken_tool,
    history_problem,
    reply,
    tool,
    web_page,
)

import s01_loop
import s02_tools

ALL_STAGES = stages_from("s01_loop")


def tool_results(request: dict) -> list:
    """The tool_result blocks a request sends back (in its last message)."""
    return [block for block in request["messages"][-1]["content"] if block["type"] == "tool_result"]


# -- the loop ----------------------------------------------------------------


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_loop_runs_the_tool_and_sends_its_result_back(stage, scripted, capsys):
    """The heart of an agent: the model asks for a tool, the loop runs it, the result goes back,
    and the loop ends when the model stops asking."""
    model = scripted(stage, [reply(tool("bash", command="echo hello")), reply("It printed hello.")])
    messages = []
    stage.run_turn(messages, "say hello")
    [result] = tool_results(model.requests[1])
    assert "hello" in result["content"] and not result["is_error"]
    assert "It printed hello." in capsys.readouterr().out
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_every_tool_call_of_a_reply_is_answered_in_one_message_in_order(stage, scripted):
    """One reply may ask for several tools: all of them run, and all results go back together,
    in the order of the calls, or the API rejects the next request."""
    calls = [tool("bash", command="echo one"), tool("bash", command="echo two")]
    model = scripted(stage, [reply(*calls), reply("done")])
    stage.run_turn([], "go")
    results = tool_results(model.requests[1])
    assert [r["tool_use_id"] for r in results] == [c["id"] for c in calls]
    assert "one" in results[0]["content"] and "two" in results[1]["content"]


@pytest.mark.parametrize("stage", ALL_STAGES)
@pytest.mark.parametrize("reason", ["end_turn", "stop_sequence"])
def test_a_finished_reply_prints_its_text_and_ends_the_turn(stage, reason, scripted, capsys):
    """end_turn and stop_sequence mean the model is done: show the text, back to the prompt."""
    model = scripted(stage, [reply("All done.", stop_reason=reason)])
    messages = []
    stage.run_turn(messages, "hi")
    assert "All done." in capsys.readouterr().out
    assert len(model.requests) == 1 and messages[-1]["role"] == "assistant"


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_cut_off_tool_call_is_never_run(stage, scripted, workspace, capsys):
    """A reply cut off at max_tokens may hold a half-written call: it is answered with an error,
    not run, and the model gets another try."""
    model = scripted(stage, [reply(tool("bash", command="touch ran"), stop_reason="max_tokens"), reply("ok")])
    stage.run_turn([], "go")
    assert not (workspace / "ran").exists(), "the cut-off call was run"
    [result] = tool_results(model.requests[1])
    assert result["is_error"] and "max_tokens" in result["content"]
    assert "cut off" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_cut_off_text_reply_tells_the_user(stage, scripted, capsys):
    """A text reply cut at max_tokens is shown, with a note that it was cut."""
    scripted(stage, [reply("The answer is", stop_reason="max_tokens")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    assert "The answer is" in out and "cut off" in out


@pytest.mark.parametrize("stage", ALL_STAGES)
@pytest.mark.parametrize(("reason", "said"), [("refusal", "declined"),
                                              ("model_context_window_exceeded", "context window")])
def test_a_turn_that_cannot_go_on_is_dropped_and_explained(stage, reason, said, scripted, capsys):
    """A refusal or a full context window ends the turn: the user is told why, and the turn
    leaves the history so the conversation can go on."""
    scripted(stage, [reply("Sorry", stop_reason=reason), reply("hello again")])
    messages = []
    stage.run_turn(messages, "go")
    assert said in capsys.readouterr().out and messages == []
    stage.run_turn(messages, "hello")
    assert history_problem(messages) is None


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_pause_turn_sends_the_paused_reply_back_and_the_model_goes_on(stage, scripted, capsys):
    """pause_turn means the API paused a long turn: send the history back with the paused reply
    last, as it is, and the model goes on. (The API combines two assistant messages in a row into
    one turn, and so does the fake API's history check.)"""
    model = scripted(stage, [reply("Working on it.", stop_reason="pause_turn"), reply("Finished."), reply("ok")])
    messages = []
    stage.run_turn(messages, "go")
    assert model.requests[1]["messages"][-1]["role"] == "assistant"  # resumed as it was
    assert [stage.text_of(m["content"]) for m in messages[1:]] == ["Working on it.", "Finished."]
    out = capsys.readouterr().out
    assert "Working on it." in out and "Finished." in out
    stage.run_turn(messages, "next")
    assert history_problem(model.requests[2]["messages"]) is None


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_an_empty_reply_keeps_the_history_valid(stage, scripted):
    """A reply with no content must not become an empty assistant message: the API rejects
    every later request that carries one."""
    model = scripted(stage, [reply(), reply("fine")])
    messages = []
    stage.run_turn(messages, "one")
    stage.run_turn(messages, "two")
    assert history_problem(model.requests[1]["messages"]) is None


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_an_empty_reply_says_so(stage, scripted, capsys):
    """A reply with nothing in it (a small model, a compatible server) is said in one line, not
    left as a usage line with `output 0` and nothing else."""
    scripted(stage, [reply()])
    stage.run_turn([], "one")
    assert "(the model sent an empty reply)" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_empty_text_blocks_never_enter_the_history(stage, scripted, capsys):
    """Some compatible servers send `{"type": "text", "text": ""}` beside a tool call. The API
    rejects a request that sends such a block back ("text content blocks must be non-empty"), and
    so does the fake API: the block must be left out of the history."""
    script = [reply("", tool("bash", command="echo hi")), reply("done"), reply("next")]
    model = scripted(stage, script)
    messages = []
    stage.run_turn(messages, "one")
    stage.run_turn(messages, "two")
    assert "done" in capsys.readouterr().out and len(messages) == 6
    assert history_problem(model.requests[-1]["messages"]) is None


def test_the_fake_api_rejects_an_empty_text_block_as_the_real_one_does():
    """The fake API's history check is only worth what it catches: an empty text block too."""
    empty = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": [{"type": "text", "text": ""}]},
             {"role": "user", "content": "again"}]
    assert "text content blocks must be non-empty" in history_problem(empty)


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_requests_ask_for_prompt_caching(stage, scripted):
    """Every call re-sends the whole conversation, so each asks the API to cache it."""
    model = scripted(stage, [reply("hi")])
    stage.run_turn([], "hi")
    assert model.requests[0]["cache_control"] == {"type": "ephemeral"}


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_usage_line_shows_the_context_growing(stage, scripted, capsys):
    """After each model call a dim line shows the context size and the cache reads."""
    scripted(stage, [reply(tool("bash", command="echo hi")), reply("done")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    sizes = context_sizes(out)
    assert len(sizes) == 2 and sizes[1] > sizes[0]
    assert "read from cache" in out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_model_id_comes_from_the_environment(stage, scripted, monkeypatch):
    """MODEL_ID picks the model; without it the stage's default is used."""
    model = scripted(stage, [reply("a"), reply("b")])
    stage.run_turn([], "hi")
    monkeypatch.setenv("MODEL_ID", "some-other-model")
    stage.run_turn([], "hi")
    assert [r["model"] for r in model.requests] == [stage.DEFAULT_MODEL, "some-other-model"]


# -- when things go wrong ------------------------------------------------------


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_api_error_drops_the_failed_turn_and_the_session_goes_on(stage, scripted, capsys):
    """An API error half-way through a turn prints one line and drops the turn, so the history
    holds no unanswered tool_use; the next turn is accepted by the (history-checking) API."""
    script = [reply("first answer"), reply(tool("bash", command="echo hi")), api_error(500, "server broke"),
              reply("still here")]
    with FakeAPI(script) as api:
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "one")
        stage.run_turn(messages, "two")
        assert "server broke" in capsys.readouterr().out
        assert len(messages) == 2
        stage.run_turn(messages, "three")
    assert "still here" in capsys.readouterr().out


def test_an_overloaded_api_is_retried_by_the_sdk(scripted, monkeypatch, capsys):
    """Retrying 429, 529 and 5xx is the SDK's job: the client main() builds keeps its retries,
    so a passing overload costs a short wait, not the turn. The wait is shown as it happens."""
    with FakeAPI([api_error(529, "overloaded"), reply("made it")]) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        scripted(s01_loop, None, client=s01_loop.make_client())
        s01_loop.run_turn([], "hi")
        assert len(api.requests) == 2
    out = capsys.readouterr().out
    assert "made it" in out and "trying again" in out


def retry_lines(out: str) -> list:
    return [line for line in out.splitlines() if "trying again" in line]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_retry_says_why_the_last_try_failed(stage, scripted, monkeypatch, capsys):
    """"Trying again" alone does not say whether the server is overloaded or not there at all:
    each retry line names what the last try got, the HTTP status of an answer (here 529), or no
    answer at all (a silent server)."""
    with FakeAPI([api_error(529, "overloaded"), SILENCE, reply("made it")]) as api:
        scripted(stage, None, client=client_with_short_waits(stage, api, monkeypatch, retries=2))
        stage.run_turn([], "hi")
    overloaded, silent = retry_lines(capsys.readouterr().out)
    assert "529" in overloaded and "529" not in silent and "no answer" in silent


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_kept_alive_connection_the_server_closed_is_not_called_no_answer(stage, scripted,
                                                                          monkeypatch, capsys):
    """Between two calls the HTTP client keeps the connection open, to send the next request on
    it. A server may close it just as that request goes out, unread (here, always). The SDK tries
    again on a new connection, and the retry line says what happened: the server closed the
    connection kept open, not "no answer" (it answered every request it read)."""
    script = [reply(tool("bash", command="false")), reply("done")]
    with FakeAPI(script, closes_kept_alive=True) as api:
        scripted(stage, None, client=client_with_short_waits(stage, api, monkeypatch))
        stage.run_turn([], "go")
    out = capsys.readouterr().out
    [retry] = retry_lines(out)
    assert "the server closed the connection kept open" in retry and "no answer" not in retry
    assert "done" in out and len(api.requests) == 2


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_authentication_error_says_to_check_the_key(stage, scripted, capsys):
    """A 401 is almost always a wrong key: say which setting to check."""
    with FakeAPI([api_error(401, "invalid x-api-key")]) as api:
        scripted(stage, None, client=api.client())
        stage.run_turn([], "hi")
    assert "ANTHROPIC_API_KEY" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_unreachable_api_says_so(stage, scripted, capsys):
    """No server at ANTHROPIC_BASE_URL: one clear line with the URL tried and why it failed (from
    the errors behind the SDK's "Connection error."), naming the setting; no traceback."""
    with FakeAPI([]) as api:
        client = api.client()
    scripted(stage, None, client=client)
    messages = []
    stage.run_turn(messages, "hi")
    out = capsys.readouterr().out
    assert f"cannot reach {api.url}/v1/messages" in out and "refused" in out
    assert "check ANTHROPIC_BASE_URL" in out and "Traceback" not in out and messages == []
    assert "API_TIMEOUT" not in out, "nothing is slow at a closed port: no timeout hint"


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_https_to_a_plain_http_server_says_tls_failed(stage, scripted, capsys):
    """`https://` to a server that speaks only http: the SDK says "Connection error."; the stage
    shows the error the SDK chains to it, which names the TLS failure, with the URL tried."""
    with FakeAPI([]) as api:
        https = api.url.replace("http://", "https://")
        client = anthropic.Anthropic(api_key="test-key", base_url=https, max_retries=0)
        scripted(stage, None, client=client)
        stage.run_turn([], "hi")
    out = capsys.readouterr().out
    assert f"cannot reach {https}/v1/messages" in out and "SSL" in out and "ANTHROPIC_BASE_URL" in out
    assert "API_TIMEOUT" not in out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_rejected_request_shows_the_servers_type_message_and_request_id_not_a_dict(
        stage, scripted, capsys):
    """A 404 for a wrong MODEL_ID: the line shows the error's type and message from the body and
    the request id (what a provider's support asks for), not the SDK's Python dict."""
    with FakeAPI([api_error(404, "model: claude-nope", "not_found_error")]) as api:
        scripted(stage, None, client=api.client())
        stage.run_turn([], "hi")
    out = capsys.readouterr().out
    said = r"API error 404 \(not_found_error: model: claude-nope\), request req_\w+; check"
    assert re.search(said, out)
    assert "{'type'" not in out


@pytest.mark.parametrize("stage", ALL_STAGES)
@pytest.mark.parametrize(("page", "status", "shown"),
                         [(NGINX_500, 500, "500 Internal Server Error nginx"),
                          (APACHE_501, 501, "Not Implemented POST to /v1/messages not supported.")],
                         ids=["nginx_500", "apache_501"])
def test_an_error_page_shows_its_status_and_words_not_its_html(stage, page, status, shown, scripted,
                                                               capsys):
    """A web server or a proxy answers with an HTML error page and no request id: the line shows
    the status and the page's words, without its tags or line breaks, and no `request None`. The
    page's <title> is left out: its heading says the same again."""
    with FakeAPI([web_page(status, page), reply("later")]) as api:
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "hi")
        [said] = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
        stage.run_turn(messages, "again")
    assert said.startswith(f"API error {status} ({shown}") and "dropped" in said
    assert "<" not in said and "None" not in said
    assert "later" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
@pytest.mark.parametrize("answer", [web_page(200, NGINX_500), reply("hello", plain_json=True)],
                         ids=["web_page", "plain_json"])
def test_an_answer_that_is_not_a_stream_of_events_names_the_server_not_the_model(
        stage, answer, scripted, capsys):
    """A server that answers 200 with a web page, or with one JSON body where the Messages API
    streams events: the SDK fails with a bare AssertionError. The line says what the server sent
    and names ANTHROPIC_BASE_URL, not a timeout or the model."""
    with FakeAPI([answer]) as api:
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "hi")
    out = capsys.readouterr().out
    sent = "text/html" if "web_page" in answer else "application/json"
    assert sent in out and "ANTHROPIC_BASE_URL" in out and messages == []
    assert "AssertionError" not in out and "API_TIMEOUT" not in out and "MODEL_ID" not in out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_each_retry_is_shown_as_it_happens(stage, scripted, monkeypatch, capsys):
    """The SDK retries a call that got no answer by itself, silently; the stage shows each retry
    as the SDK makes it (the client's per-try hook), so a wait does not look like a hang. Into a
    pipe it is a plain line."""
    with FakeAPI([SILENCE, SILENCE]) as api:
        scripted(stage, None, client=client_with_short_waits(stage, api, monkeypatch))
        stage.run_turn([], "hello?")
    out = capsys.readouterr().out
    assert out.count("trying again") == 1 and "\033[" not in out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_tool_arguments_that_are_not_json_get_one_line_not_a_dump(stage, scripted, capsys):
    """A small model writes a tool call whose arguments are not JSON. The SDK's error quotes all of
    them (kilobytes); the stage says in one line that the reply broke off and what to check."""
    raw = '{"command": ls -la ' + "x" * 3000 + "}"
    with FakeAPI([reply(broken_tool("bash", raw)), reply("after")]) as api:
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "one")
        out = capsys.readouterr().out
        assert "broke off" in out and "MODEL_ID" in out and "API_TIMEOUT" not in out
        assert "xxxxxxxx" not in out and messages == []
        stage.run_turn(messages, "two")
    assert "after" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_stream_that_hangs_up_midway_drops_the_turn_and_runs_no_tool(stage, scripted, workspace,
                                                                      capsys):
    """The server closes the stream half-way, before it says why the reply stopped: the SDK hands
    back a reply with no stop_reason. Its tool call may be cut, so it is not run; the turn is
    dropped."""
    with FakeAPI([reply("Half of it", tool("bash", command="touch ran"), hang_up=True)]) as api:
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "hi")
    out = capsys.readouterr().out
    assert "the reply stopped midway" in out
    assert messages == [] and not (workspace / "ran").exists()


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_reply_cut_off_midway_is_in_the_transcript_with_its_error(stage, scripted, tmp_path,
                                                                     monkeypatch):
    """A reply the server cut short is a failed call: its transcript line has an "error", as the
    user was told it, so a viewer does not show it as a reply that ended normally."""
    transcript = tmp_path / "wire.jsonl"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    with FakeAPI([reply("Half of it", hang_up=True)]) as api:
        scripted(stage, None, client=api.client())
        stage.run_turn([], "hi")
    [line] = read_transcript(transcript)
    assert "stopped midway" in line["error"]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_the_parent_stops_after_max_model_calls_and_says_so(stage, scripted, monkeypatch, capsys):
    """A weak model may call tools forever. One turn makes at most MAX_MODEL_CALLS model calls;
    then it stops with a line naming the setting, and the session goes on."""
    monkeypatch.setattr(stage, "MAX_MODEL_CALLS", 3)
    busy = [reply(tool("bash", command="true")) for _ in range(3)]
    model = scripted(stage, [*busy, reply("next")])
    messages = []
    stage.run_turn(messages, "loop")
    assert len(model.requests) == 3 and messages == []
    out = capsys.readouterr().out
    assert "made 3 calls without finishing" in out and "MAX_MODEL_CALLS" in out
    stage.run_turn(messages, "again")
    assert "next" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_ctrl_c_during_a_model_call_cancels_only_that_turn(stage, scripted, capsys):
    """Ctrl-C while waiting for the model: the turn is cancelled, the history stays valid,
    and the session goes on."""
    ctrl_c_cancels_only_that_turn(stage, scripted, capsys, turn_so_far=[])


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_ctrl_c_during_a_tool_run_cancels_only_that_turn(stage, scripted, capsys, monkeypatch):
    """Ctrl-C while a command runs stops the command and the turn, not the program."""
    monkeypatch.setenv("SANDBOX", "off")  # inside s03's wall a command cannot signal the agent
    ctrl_c = "kill -INT $PPID; sleep 20; touch late.txt"  # the shell's parent is this process
    scripted(stage, [reply(tool("bash", command=ctrl_c)), reply("after")])
    messages = []
    stage.run_turn(messages, "one")
    assert messages == [] and not (stage.WORKDIR / "late.txt").exists()  # the command was stopped
    assert "interrupted" in capsys.readouterr().out
    stage.run_turn(messages, "two")
    assert history_problem(messages) is None


# -- the bash tool -------------------------------------------------------------



@pytest.mark.parametrize("stage", ALL_STAGES)
def test_bash_runs_in_the_workspace_with_stderr_included(stage, scripted, workspace):
    """Commands run in WORKDIR, and the model sees stderr as well as stdout."""
    result = call_tool(stage, scripted, "bash", command="pwd; echo oops >&2")
    assert str(workspace) in result["content"] and "oops" in result["content"]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_bash_reports_a_nonzero_exit_code_even_after_output_too_long_to_keep(stage, scripted):
    """A failing command says how it failed, and the note comes after the cut: output longer than
    MAX_OUTPUT never hides how the command ended. (From s03 on, such a command is stopped as its
    output passes MAX_OUTPUT, and the note says that.)"""
    assert "exit code 3" in call_tool(stage, scripted, "bash", command="exit 3")["content"]
    flood = "head -c 60000 /dev/zero | tr '\\0' x; exit 3"
    content = call_tool(stage, scripted, "bash", command=flood)["content"]
    assert re.search(r"\n\((exit code 3|stopped: output passed [^\n]*)\)$", content), content[-300:]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_bash_output_is_capped_with_a_marker(stage, scripted):
    """Huge output is cut at MAX_OUTPUT, and the cut is said, so the model knows it saw part."""
    content = call_tool(stage, scripted, "bash", command="head -c 60000 /dev/zero | tr '\\0' x")["content"]
    assert len(content) < stage.MAX_OUTPUT + 200 and "characters cut" in content


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_bash_decodes_bad_bytes_without_crashing(stage, scripted):
    """Output that is not UTF-8 is decoded with replacement characters."""
    assert "\ufffd" in call_tool(stage, scripted, "bash", command="printf 'a\\377b'")["content"]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_bash_times_out(stage, scripted, monkeypatch):
    """A command that runs past BASH_TIMEOUT is stopped. It did not finish, so the result is an
    error (is_error), and says it timed out."""
    monkeypatch.setattr(stage, "BASH_TIMEOUT", 0.3)
    result = call_tool(stage, scripted, "bash", command="exec sleep 20")
    assert "timed out" in result["content"] and result["is_error"]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_bad_tool_call_gets_an_error_result(stage, scripted):
    """An unknown tool or a missing argument is answered with is_error, never a crash."""
    model = scripted(stage, [reply(tool("fly"), tool("bash")), reply("ok")])
    stage.run_turn([], "go")
    unknown, missing = tool_results(model.requests[1])
    assert unknown["is_error"] and "bash" in unknown["content"]
    assert missing["is_error"] and "command" in missing["content"]


# -- start-up, as a user runs it -------------------------------------------------


def test_importing_a_stage_has_no_side_effects():
    """Importing builds no client, reads no .env and needs no key: tests and readers can import any stage."""
    code = "; ".join(f"import {name}; assert {name}.client is None" for name in STAGE_NAMES)
    done = subprocess.run([sys.executable, "-c", code + "; print('ok')"], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_missing_key_gives_one_clear_paragraph_and_exit_2(stage, user_env, capsys):
    """Without ANTHROPIC_API_KEY, main() says what to set (and about the demo) and returns 2."""
    assert stage.main() == 2
    err = capsys.readouterr().err
    assert "ANTHROPIC_API_KEY" in err and ".env.example" in err
    assert f"python tests/demo.py {stage.STAGE}" in err


def test_empty_base_url_means_the_default_api(monkeypatch):
    """ANTHROPIC_BASE_URL= (empty, as in a copied .env.example) means unset, not an empty URL."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "")
    assert str(s01_loop.make_client().base_url).startswith("https://api.anthropic.com")


@pytest.mark.parametrize("stage", stages_from("s01_loop", quick_run_checks_the_last_only=True))
def test_the_repl_runs_end_to_end_through_the_real_sdk(stage, tmp_path):
    """The stage as a user runs it: a prompt, a tool call over HTTP, the answer, then `q`."""
    script = [reply(tool("bash", command="echo made > proof.txt")), reply("Made proof.txt.")]
    with FakeAPI(script) as api:
        env = clean_env(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url)
        done = run_stage(ROOT / f"{stage.__name__}.py", "make a file\nq\n", env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Made proof.txt." in done.stdout and (tmp_path / "proof.txt").read_text() == "made\n"
    assert api.requests[0]["messages"][0]["content"] == "make a file"


@pytest.mark.parametrize("typed", ["exit\n", "q\n", "Q\n", " EXIT \n", "quit\n", ""],
                         ids=["exit", "q", "Q", "EXIT", "quit", "eof"])
def test_exit_q_and_eof_end_the_program_with_status_0(typed, user_env):
    """`q`, `exit`, `quit` (in any case) or end of input leave cleanly, without calling the
    model."""
    with FakeAPI([reply("a quit word was sent to the model")]) as api:
        user_env.setenv("ANTHROPIC_API_KEY", "test-key")
        user_env.setenv("ANTHROPIC_BASE_URL", api.url)
        user_env.setattr("sys.stdin", io.StringIO(typed))
        assert s01_loop.main() == 0
    assert api.requests == []


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_start_up_names_the_model_and_the_host_never_the_key(stage, user_env, capsys):
    """Before the first request, one line says which model and which endpoint (scheme, host and
    port) will be used, so a wrong MODEL_ID or ANTHROPIC_BASE_URL shows at once. The key is never shown."""
    with FakeAPI([]) as api:
        user_env.setenv("ANTHROPIC_API_KEY", "sk-very-secret")
        user_env.setenv("ANTHROPIC_BASE_URL", api.url + "/")
        user_env.setenv("MODEL_ID", "claude-nope")
        user_env.setattr("sys.stdin", io.StringIO("q\n"))
        assert stage.main() == 0
    out = capsys.readouterr().out
    assert f"model claude-nope at {api.url}\n" in out
    assert "sk-very-secret" not in out


@pytest.mark.parametrize("stage", [s01_loop, s02_tools])
def test_s01_and_s02_say_at_start_up_that_commands_run_unfenced(stage, user_env, capsys):
    """s01 and s02 run the model's commands as you, with no wall (s03 builds it): they say so at
    start-up, in one line, before the first prompt, so nobody runs them on a folder they care
    about unaware."""
    with FakeAPI([]) as api:
        user_env.setenv("ANTHROPIC_API_KEY", "test-key")
        user_env.setenv("ANTHROPIC_BASE_URL", api.url)
        user_env.setattr("sys.stdin", io.StringIO("q\n"))
        assert stage.main() == 0
    [said] = [line for line in capsys.readouterr().out.splitlines() if "unfenced" in line]
    assert "your rights" in said and "s03" in said


@pytest.mark.parametrize("url", ["not a url", "localhost:8080", "http://host:port"])
def test_a_base_url_that_is_not_a_url_is_said_at_start_up(url, user_env, capsys):
    """An ANTHROPIC_BASE_URL that is not an http(s) URL cannot work: main() says so and how to
    write it, and exits with status 2, before any request (the SDK would only say "Connection
    error.")."""
    user_env.setenv("ANTHROPIC_API_KEY", "test-key")
    user_env.setenv("ANTHROPIC_BASE_URL", url)
    assert s01_loop.main() == 2
    said = f"ANTHROPIC_BASE_URL={url!r} is not a URL: write it as http://host:port"
    assert said in capsys.readouterr().err


def test_the_no_key_message_comes_before_the_sdk_is_imported():
    """Importing the SDK takes seconds; without a key there is nothing to import it for, so the
    message is printed without it, at once."""
    code = ("import sys, s01_loop, s02_tools, s03_safety, s04_subagent; "
            "codes = [stage.main() for stage in (s01_loop, s02_tools, s03_safety, s04_subagent)]; "
            "print(codes, 'anthropic' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.stdout.strip() == "[2, 2, 2, 2] False", done.stderr
    assert done.stderr.count("No API key") == 4


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_settings_for_slow_servers_and_small_models_come_from_the_environment(stage, user_env,
                                                                              capsys):
    """API_TIMEOUT, API_RETRIES, MAX_TOKENS and MAX_MODEL_CALLS may be set in the environment (or
    .env): a CPU server may need minutes before its first word."""
    with FakeAPI([reply("fine")]) as api:
        user_env.setenv("ANTHROPIC_API_KEY", "test-key")
        user_env.setenv("ANTHROPIC_BASE_URL", api.url)
        for name, value in {"API_TIMEOUT": "300", "API_RETRIES": "0", "MAX_TOKENS": "123",
                            "MAX_MODEL_CALLS": "7"}.items():
            user_env.setenv(name, value)
        user_env.setattr("sys.stdin", io.StringIO("hi\nq\n"))
        assert stage.main() == 0
    assert api.requests[0]["max_tokens"] == 123 and stage.MAX_MODEL_CALLS == 7
    assert stage.client.timeout == 300 and stage.client.max_retries == 0
    assert "fine" in capsys.readouterr().out


def refused_at_start_up(stage, user_env, capsys, **settings) -> str:
    """main() with `settings` and a server that answers nothing: it must stop, before any request,
    with status 2; returns what it said on stderr."""
    with FakeAPI([]) as api:
        user_env.setenv("ANTHROPIC_API_KEY", "test-key")
        user_env.setenv("ANTHROPIC_BASE_URL", api.url)
        for name, value in settings.items():
            user_env.setenv(name, value)
        user_env.setattr("sys.stdin", io.StringIO("hi\nq\n"))
        assert stage.main() == 2
    assert api.requests == []
    return capsys.readouterr().err


@pytest.mark.parametrize("stage", ALL_STAGES)
@pytest.mark.parametrize(("name", "value"), [("API_TIMEOUT", "0"), ("API_TIMEOUT", "-5"),
                                             ("API_RETRIES", "-1"), ("MAX_TOKENS", "lots"),
                                             ("MAX_MODEL_CALLS", "0"), ("MAX_MODEL_CALLS", "2.5")])
def test_a_number_setting_that_cannot_work_is_refused_at_start_up(stage, name, value, user_env,
                                                                  capsys):
    """API_TIMEOUT=0 would fail every call (`Operation now in progress`); MAX_MODEL_CALLS=0 would
    end every turn before it began. A setting that cannot work stops the stage at start-up with
    one line, naming it, its value and what would work, and status 2, as a bad ANTHROPIC_BASE_URL
    does."""
    said = refused_at_start_up(stage, user_env, capsys, **{name: value})
    [line] = said.splitlines()
    assert line.startswith(f"{name}={value!r}") and "whole number" in line


@pytest.mark.parametrize("stage", stages_from("s03_safety"))
@pytest.mark.parametrize("name", ["SANDBOX", "NETWORK"])
def test_a_wall_setting_that_is_neither_off_nor_on_is_refused_at_start_up(stage, name, user_env,
                                                                          capsys):
    """SANDBOX=of (a typo) once kept the wall up silently, and NETWORK=yes kept the network off:
    a value other than off or on (any case; empty means the default) stops the stage at start-up
    with one line saying what would work."""
    said = refused_at_start_up(stage, user_env, capsys, **{name: "of"})
    [line] = said.splitlines()
    assert line.startswith(f"{name}='of'") and "off" in line and "on" in line


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_transcript_that_cannot_be_written_is_said_at_start_up_and_no_turn_is_dropped(
        stage, user_env, tmp_path, capsys):
    """TRANSCRIPT names a file in a folder that does not exist: one line at start-up says so and
    that recording is off; every turn is answered as if TRANSCRIPT were not set."""
    with FakeAPI([reply("first answer"), reply("second answer")]) as api:
        user_env.setenv("ANTHROPIC_API_KEY", "test-key")
        user_env.setenv("ANTHROPIC_BASE_URL", api.url)
        user_env.setenv("TRANSCRIPT", str(tmp_path / "no-such-folder" / "wire.jsonl"))
        user_env.setattr("sys.stdin", io.StringIO("one\ntwo\n"))
        assert stage.main() == 0
    out = capsys.readouterr().out
    assert out.count("cannot write TRANSCRIPT=") == 1 and "recording is off" in out
    assert out.index("recording is off") < out.index("first answer") < out.index("second answer")
    assert "dropped" not in out


def test_a_character_the_terminal_cannot_show_does_not_end_the_session(user_env):
    """On a terminal that cannot show an emoji, it is printed as "?" and the session goes on."""
    terminal = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    with FakeAPI([reply("Done \u2705"), reply("second turn")]) as api:
        user_env.setenv("ANTHROPIC_API_KEY", "test-key")
        user_env.setenv("ANTHROPIC_BASE_URL", api.url)
        user_env.setattr("sys.stdin", io.StringIO("hi\nagain\n"))
        user_env.setattr("sys.stdout", terminal)
        assert s01_loop.main() == 0
    terminal.flush()
    shown = terminal.buffer.getvalue().decode("ascii")
    assert "Done ?" in shown and "second turn" in shown


def test_settings_are_read_from_a_dotenv_file(tmp_path):
    """A .env file beside the script supplies the settings (the environment wins over it)."""
    script = tmp_path / "s01_loop.py"
    script.write_text((ROOT / "s01_loop.py").read_text())
    with FakeAPI([reply("configured by .env")]) as api:
        (tmp_path / ".env").write_text(f"ANTHROPIC_API_KEY=from-dotenv\nANTHROPIC_BASE_URL={api.url}\nMODEL_ID=dotenv-model\n")
        env = clean_env()
        del env["PYTHON_DOTENV_DISABLED"]
        done = run_stage(script, "hi\n", env, tmp_path)
    assert "configured by .env" in done.stdout, done.stderr
    assert api.requests[0]["model"] == "dotenv-model"


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_the_user_sees_each_call_its_first_result_line_and_the_models_narration(stage, scripted, capsys):
    """The terminal shows what the agent does: what the model says while it works, each tool
    call, and the first line of each result (the model gets the whole result)."""
    scripted(stage, [reply("Let me look.", tool("bash", command="printf 'one\\ntwo\\nthree\\n'")), reply("done")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    assert "Let me look." in out and "> bash: printf" in out and "  one\n  (3 lines in all)" in out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_tool_call_is_shown_on_one_line(stage, scripted, capsys):
    """A call's input may span many lines (a script, a file's content): the screen shows it on one
    line, cut to a width, so the conversation stays readable."""
    scripted(stage, [reply(tool("bash", command="echo one\necho two")), reply("done")])
    stage.run_turn([], "go")
    assert "> bash: echo one echo two\n" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_failed_command_shows_its_last_lines_where_the_error_is(stage, scripted, capsys):
    """A traceback starts with "Traceback (most recent call last):" and ends with the error: for a
    command that failed, the user sees the last lines (the model still gets all of them)."""
    failing = ("printf 'Traceback (most recent call last):\\n  one\\n  two\\n  three\\n"
               "ValueError: boom\\n'; exit 1")
    scripted(stage, [reply(tool("bash", command=failing)), reply("done")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    assert "    three\n  ValueError: boom\n  (exit code 1)\n  (6 lines in all)\n" in out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_the_notes_a_tool_adds_after_a_failure_always_show(stage, scripted, capsys):
    """A tool may add notes in brackets after a command's output: s03 adds "(not kept: ...)"
    after "(exit code 1)". The user sees every note and, as the exit code says it failed, the
    last lines of the output, where the error is. (The command prints the notes itself here, so
    that the test runs on every stage.)"""
    failing = ("printf 'Traceback (most recent call last):\\n  File \"hello.py\", line 1\\n"
               "    print(hi)\\nNameError: name hi is not defined\\n(exit code 1)\\n"
               "(not kept: .bashrc: a start-up file)\\n'")
    scripted(stage, [reply(tool("bash", command=failing)), reply("done")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    shown = ("    print(hi)\n  NameError: name hi is not defined\n  (exit code 1)\n"
             "  (not kept: .bashrc: a start-up file)\n  (6 lines in all)\n")
    assert shown in out and "\n  Traceback" not in out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_note_after_a_command_that_worked_shows_with_its_first_line(stage, scripted, capsys):
    """A command that worked shows its first line only, but a note the tool adds at the end (what
    was not kept, a limit met) is news the user must see too."""
    command = "printf 'wrote it\\nsecond line\\n(not kept: .bashrc: a start-up file)\\n'"
    scripted(stage, [reply(tool("bash", command=command)), reply("done")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    assert "  wrote it\n  (not kept: .bashrc: a start-up file)\n  (3 lines in all)\n" in out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_cut_line_ends_with_an_ellipsis(stage, scripted, capsys):
    """A line too long to show is cut and ends with "…", so it does not look complete."""
    command = "echo " + "word " * 40 + "; echo second"
    scripted(stage, [reply(tool("bash", command=command)), reply("done")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    assert "word word…\n" in out


@pytest.mark.parametrize("stage", stages_from("s03_safety"))
def test_a_refused_command_shows_its_reason_and_the_model_gets_is_error(stage, scripted, capsys):
    """A refusal is shown with its reason on the screen, and the model's tool_result is an error
    it can act on."""
    model = scripted(stage, [reply(tool("bash", command="sudo ls")), reply("ok")])
    stage.run_turn([], "go")
    assert "refused, not run: sudo" in capsys.readouterr().out
    assert tool_results(model.requests[1])[0]["is_error"]


# -- whatever arrives, the session goes on -------------------------------------------


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_workspace_whose_name_is_not_utf8_still_works(stage, scripted, tmp_path, monkeypatch):
    """The system prompt holds the workspace's path. A folder named with bytes that are not UTF-8
    (common on disks from other systems) reaches the API as replacement characters, not a crash."""
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    folder.mkdir()
    monkeypatch.setattr(stage, "WORKDIR", folder)
    with FakeAPI([reply("fine")]) as api:  # the real SDK: it cannot send a lone surrogate
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "hi")
    assert "caf\ufffd" in api.requests[0]["system"] and len(messages) == 2


@pytest.mark.parametrize("stage", ALL_STAGES)
@pytest.mark.parametrize("tool_input", ["ls", None, ["ls"]], ids=["string", "null", "list"])
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the SDK notices the odd input too
def test_a_tool_input_that_is_not_an_object_gets_an_error_result(stage, tool_input, scripted):
    """A compatible server may send a tool call whose input is not an object: it is answered with
    an is_error result saying what was expected, and the loop goes on."""
    call = {"type": "tool_use", "id": "toolu_odd", "name": "bash", "input": tool_input}
    with FakeAPI([reply(call), reply("understood")]) as api:
        scripted(stage, None, client=api.client())
        stage.run_turn([], "go")
    [result] = tool_results(api.requests[1])
    assert result["is_error"] and "object" in result["content"]


def raise_a_bug(request: dict) -> dict:
    """A script item: something fails inside the turn in a way nobody planned for."""
    raise ValueError("an unplanned failure")


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_any_exception_inside_a_turn_drops_the_turn_and_the_session_goes_on(stage, scripted, capsys):
    """Not only API errors: whatever goes wrong inside a turn is one line, the turn is dropped, and
    the conversation before it is kept."""
    model = scripted(stage, [reply("first"), raise_a_bug, reply("still here")])
    messages = []
    stage.run_turn(messages, "one")
    stage.run_turn(messages, "two")
    assert "an unplanned failure" in capsys.readouterr().out and len(messages) == 2
    stage.run_turn(messages, "three")
    assert history_problem(model.requests[-1]["messages"]) is None and "still here" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_control_characters_in_output_are_shown_escaped_never_sent_to_the_terminal(stage, scripted, capsys):
    """A tool's output (or the model's text) may hold escape sequences that set the terminal's
    title or clipboard: what the user sees shows them escaped; the model still gets the output."""
    title = "printf 'before \\033]0;taken over\\007 after'"
    model = scripted(stage, [reply(tool("bash", command=title)), reply("Done \x1b[2J.")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;taken over\\x07" in out and "Done \\x1b[2J." in out
    assert "\x1b]0;taken over" in tool_results(model.requests[1])[0]["content"]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_tool_name_with_an_escape_sequence_is_shown_escaped(stage, scripted, capsys):
    """The model names its tools too: a made-up name holding an escape sequence (here one that
    sets the terminal's title) reaches the screen escaped, in the call's line and in its error."""
    scripted(stage, [reply(tool("\x1b]0;taken over\x07")), reply("Sorry.")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;taken over\\x07" in out


@pytest.mark.parametrize("stage_name", STAGE_NAMES)
def test_every_line_a_stage_prints_goes_through_show(stage_name):
    """One place where text reaches the screen: only show() calls print(), so no line of output,
    today's or one added later, can skip the escaping of control characters."""
    tree = ast.parse((ROOT / f"{stage_name}.py").read_text())
    printing = {function.name for function in ast.walk(tree) if isinstance(function, ast.FunctionDef)
                for node in ast.walk(function)
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"}
    assert printing == {"show"}
    written = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)
               and node.attr == "write" and ast.unparse(node.value) in ("sys.stdout", "sys.stderr")]
    assert not written, "the screen is written to past show()"


def test_a_stage_started_without_its_packages_says_to_activate_the_virtual_environment(tmp_path):
    """Started with a Python that lacks the requirements (here: python -S, without site-packages),
    a stage says to activate the virtual environment, in one line, not with a traceback."""
    done = subprocess.run([sys.executable, "-S", str(ROOT / "s01_loop.py")], input="q\n", cwd=tmp_path,
                          env=clean_env(ANTHROPIC_API_KEY="test-key"), capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "is not installed" in done.stderr and ".venv/bin/activate" in done.stderr


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_colour_only_on_a_terminal_and_never_with_no_color(stage, scripted, monkeypatch, capsys):
    """The dim grey of tool calls and usage lines is an escape code: sent to a terminal, but not into a
    pipe or a file (where it would be junk), and never when NO_COLOR is set."""
    scripted(stage, [reply("a"), reply("b"), reply("c")])
    stage.run_turn([], "into a pipe")
    assert "\033[" not in capsys.readouterr().out
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    stage.run_turn([], "onto a terminal")
    assert "\033[2m[context" in terminal.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    stage.run_turn([], "with NO_COLOR")
    assert terminal.getvalue().count("\033[2m") == 2  # only the earlier turn's grey lines


def test_the_prompt_has_line_editing_and_history_on_a_terminal(tmp_path):
    """On a terminal, input() gets readline: the Up arrow brings back the last request. Run in a
    pseudo-terminal, the way a user types."""
    pty = pytest.importorskip("pty")
    with FakeAPI([reply("first answer"), reply("second answer")]) as api:
        env = clean_env(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url, TERM="xterm")
        terminal, stage_side = pty.openpty()
        process = subprocess.Popen([sys.executable, str(ROOT / "s01_loop.py")], stdin=stage_side, stdout=stage_side,
                                   stderr=stage_side, env=env, cwd=tmp_path)
        os.close(stage_side)
        try:
            for keys in ("count the files\r", "\x1b[A\r", "q\r"):  # a request; Up and Enter; quit
                read_until(terminal, "s01 >> ")
                os.write(terminal, keys.encode())
            assert process.wait(timeout=10) == 0
        finally:
            process.kill()
            os.close(terminal)
    assert [r["messages"][-1]["content"] for r in api.requests] == ["count the files"] * 2


def as_a_user(script) -> list:
    """The command that runs `script` as a user's shell does, however pytest was started: Ctrl-C
    raises KeyboardInterrupt (a suite run as a background job starts with SIGINT ignored, and Python
    then never raises it), and a pseudo-terminal on stdin is the controlling terminal, so Ctrl-C
    typed there is a SIGINT. Run with start_new_session=True (a new session may take a terminal)."""
    code = ("import fcntl, runpy, signal, sys, termios\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "if sys.stdin.isatty():\n"
            "    fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
            f"sys.argv = [{str(script)!r}]\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    return [sys.executable, "-c", code]


def start_in_a_terminal(script, env: dict, cwd) -> tuple:
    """Start a stage in a pseudo-terminal; return the process and the terminal's side."""
    pty = pytest.importorskip("pty")
    terminal, stage_side = pty.openpty()
    process = subprocess.Popen(as_a_user(script), stdin=stage_side, stdout=stage_side,
                               stderr=stage_side, env=env, cwd=cwd, start_new_session=True)
    os.close(stage_side)
    return process, terminal


class Screen:
    """What a stage has shown on a pseudo-terminal. `wait_for(text)` reads on until `text` appears
    after what was waited for before (one read may bring an answer and the next prompt at once)."""

    def __init__(self, terminal: int):
        self.terminal, self.shown, self.waited_up_to = terminal, "", 0

    def wait_for(self, text: str, seconds: float = 10) -> None:
        before, after = self.shown[:self.waited_up_to], self.shown[self.waited_up_to:]
        assert self.shows(text, seconds), f"no {text!r} on the terminal: {before!r}, then {after!r}"

    def shows(self, text: str, seconds: float) -> bool:
        """Whether `text` appears within `seconds` (and if so, the next wait starts after it)."""
        deadline = time.monotonic() + seconds
        while text not in self.shown[self.waited_up_to:]:
            left = max(deadline - time.monotonic(), 0)
            ready, _, _ = select.select([self.terminal], [], [], left)
            if not ready:
                return False
            self.shown += os.read(self.terminal, 4096).decode(errors="replace")
        self.waited_up_to = self.shown.index(text, self.waited_up_to) + len(text)
        return True


def press_ctrl_c(terminal: int, until) -> None:
    """Type Ctrl-C until `until()` is true. CPython's readline misses a SIGINT that comes in the
    instant before it waits for a key (a test types that fast; a person hardly); typed again, it is
    seen, and the two count as one."""
    for _ in range(5):
        os.write(terminal, b"\x03")
        if until():
            return
    raise AssertionError("Ctrl-C had no effect")


def exits(process, seconds: float) -> bool:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=seconds)
    return process.poll() is not None


@pytest.mark.parametrize("stage", stages_from("s01_loop", quick_run_checks_the_last_only=True))
def test_ctrl_c_at_the_prompt_clears_a_typed_line_and_asks_once_on_an_empty_one(stage, tmp_path):
    """At the prompt, Ctrl-C throws away what is typed and the prompt comes back, as in bash. On an
    empty prompt it asks once; a second Ctrl-C leaves. The conversation is never lost by
    accident."""
    with FakeAPI([reply("the answer")]) as api:
        env = clean_env(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url, TERM="xterm")
        process, terminal = start_in_a_terminal(ROOT / f"{stage.__name__}.py", env, tmp_path)
        prompt, screen = f"{stage.STAGE} >> ", Screen(terminal)
        try:
            hint = "(press Ctrl-C again or type q to leave)"
            screen.wait_for(prompt)
            os.write(terminal, b"half a request")
            screen.wait_for("half a request")
            press_ctrl_c(terminal, until=lambda: screen.shows(prompt, 2))
            assert hint not in screen.shown  # the line was cleared; nothing was asked
            os.write(terminal, b"the real request\r")
            screen.wait_for("the answer")
            screen.wait_for(prompt)
            press_ctrl_c(terminal, until=lambda: screen.shows(hint, 2))
            screen.wait_for(prompt)
            press_ctrl_c(terminal, until=lambda: exits(process, 2))
            assert process.returncode == 0
        finally:
            process.kill()
            os.close(terminal)
    assert [r["messages"][-1]["content"] for r in api.requests] == ["the real request"]


def test_ctrl_c_during_start_up_exits_quietly_with_status_130(tmp_path):
    """Loading the SDK takes seconds, and a user may press Ctrl-C meanwhile: the stage leaves with
    status 130 (as shells do for Ctrl-C) and no traceback. The SIGINT is sent while the SDK is
    imported: a stand-in `anthropic` module, first on the path, sends it to its own process."""
    stand_in = "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nwhile True:\n    pass\n"
    (tmp_path / "anthropic.py").write_text(stand_in)
    env = clean_env(ANTHROPIC_API_KEY="test-key", PYTHONPATH=str(tmp_path))
    done = subprocess.run(as_a_user(ROOT / "s01_loop.py"), input="hi\n", env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 130 and done.stderr == "" and "Traceback" not in done.stdout


def read_until(terminal: int, text: str, seconds: float = 10) -> str:
    """Read a pseudo-terminal until `text` has appeared (the next prompt, say)."""
    seen, deadline = "", time.monotonic() + seconds
    while text not in seen:
        ready, _, _ = select.select([terminal], [], [], max(deadline - time.monotonic(), 0))
        assert ready, f"no {text!r} on the terminal; it showed {seen!r}"
        seen += os.read(terminal, 4096).decode(errors="replace")
    return seen


# -- live: text as it is written, waits that end, the wire ---------------------------


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_text_is_shown_while_the_model_is_still_writing(stage, scripted, monkeypatch):
    """The reply streams: its first words are on screen while the server still holds back the rest.
    (The server waits for the test to see them; a stage that waited for the whole reply never shows them.)"""
    gate = Gate()
    shown_early = []

    def watch(shown: str) -> None:
        if "The first words" in shown and not gate.opened.is_set():
            shown_early.append(not gate.rest_sent.is_set())
            gate.opened.set()

    with FakeAPI([reply("The first words arrive first; the rest follows later.", gate=gate)]) as api:
        scripted(stage, None, client=api.client())
        monkeypatch.setattr("sys.stdout", Terminal(watch))
        stage.run_turn([], "write a lot")
        shown = sys.stdout.getvalue()
    assert shown_early == [True]
    assert shown.count("the rest follows later.") == 1


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_each_piece_of_text_is_printed_once(stage, scripted, capsys):
    """What the model says while it works, and its answer, appear once each, as they streamed."""
    scripted(stage, [reply("Let me look.", tool("bash", command="echo hi")), reply("It says hi.")])
    stage.run_turn([], "go")
    out = capsys.readouterr().out
    assert out.count("Let me look.") == 1 and out.count("It says hi.") == 1


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_tools_are_offered_with_tool_choice_auto(stage, scripted):
    """tool_choice "auto" is the API's default, but some compatible servers offer the model no tools
    unless it is sent; so every request that sends tools says it."""
    model = scripted(stage, [reply("hi")])
    stage.run_turn([], "hi")
    assert model.requests[0]["tool_choice"] == {"type": "auto"} and model.requests[0]["tools"]


def client_with_short_waits(stage, api, monkeypatch, retries: int = 1):
    """The client main() builds (its own timeout and retries), pointed at `api`, with waits made short."""
    monkeypatch.setattr(stage, "API_TIMEOUT", 0.3)
    monkeypatch.setattr(stage, "API_RETRIES", retries)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    return stage.make_client()


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_silent_server_is_an_api_error_within_the_timeout(stage, scripted, monkeypatch, capsys):
    """A server that takes the request and never answers is given up after API_TIMEOUT seconds on
    each of 1 + API_RETRIES tries: an API error, the turn dropped, the session still there."""
    with FakeAPI([SILENCE, SILENCE, reply("back again")]) as api:
        scripted(stage, None, client=client_with_short_waits(stage, api, monkeypatch))
        messages = []
        stage.run_turn(messages, "hello?")
        out = capsys.readouterr().out
        assert "timed out" in out and messages == []
        assert "ANTHROPIC_BASE_URL" in out and "API_TIMEOUT" in out
        stage.run_turn(messages, "and now?")
    assert "back again" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_server_that_goes_silent_mid_answer_drops_the_turn(stage, scripted, monkeypatch, capsys):
    """With streaming the timeout is the longest gap between two pieces of the answer, not the whole
    answer: a server that stops half-way is given up after API_TIMEOUT, and the turn is dropped.
    The SDK says only "timed out"; the stage says the reply broke off, naming the setting."""
    gate = Gate()  # never opened: after its first words the server says nothing more
    with FakeAPI([reply("I will now say noth", "ing more.", gate=gate)]) as api:
        scripted(stage, None, client=client_with_short_waits(stage, api, monkeypatch))
        messages = []
        stage.run_turn(messages, "talk")
        gate.opened.set()
    out = capsys.readouterr().out
    assert "I will now say" in out and "broke off" in out
    assert "API_TIMEOUT" in out and messages == []


SETTINGS_OF_A_SERVER = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "MODEL_ID")


@pytest.mark.parametrize("stage", ALL_STAGES)
@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_rejected_request_names_the_settings_to_check(stage, status, scripted, capsys):
    """From a proxy or a compatible provider, 401/403/404 usually mean a wrong key, endpoint or
    model: the line shows the server's own words and names the three settings."""
    with FakeAPI([api_error(status, "the proxy says no")]) as api:
        scripted(stage, None, client=api.client())
        stage.run_turn([], "hi")
    out = capsys.readouterr().out
    assert "the proxy says no" in out
    assert all(setting in out for setting in SETTINGS_OF_A_SERVER)


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_400_about_the_request_itself_sends_nobody_to_the_settings(stage, scripted, capsys):
    """A 400 says what is wrong with the request itself (here: a tool_use left unanswered, what
    the scripted model's history check answers too). The line gives the server's reason; the key,
    the endpoint and the model are not the problem, so it names none of them."""
    unanswered = "messages.1: tool_use ids were found without tool_result blocks"
    with FakeAPI([api_error(400, unanswered, "invalid_request_error")]) as api:
        scripted(stage, None, client=api.client())
        stage.run_turn([], "hi")
    out = capsys.readouterr().out
    assert f"API error 400 (invalid_request_error: {unanswered})" in out
    assert not any(setting in out for setting in SETTINGS_OF_A_SERVER)


def test_the_scripted_model_rejects_an_invalid_history_as_the_api_does(scripted, capsys):
    """The in-process scripted model answers a history the API would reject with the SDK's own
    400 error, as the real API does, so a broken loop shows the same line in both."""
    scripted(s01_loop, [reply("never sent")])
    asked = {"role": "assistant", "content": [tool("bash", command="ls")]}  # never answered
    s01_loop.run_turn([{"role": "user", "content": "hi"}, asked], "and now?")
    assert "API error 400 (invalid_request_error: invalid conversation history" in \
        capsys.readouterr().out


def read_transcript(path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_the_transcript_holds_each_call_as_sent_and_answered_without_the_key(stage, scripted, tmp_path,
                                                                              monkeypatch):
    """TRANSCRIPT=file.jsonl appends one JSON line per model call: the request as sent, the reply as
    received. The key travels in a header, so it is not in the file."""
    transcript = tmp_path / "wire.jsonl"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    with FakeAPI([reply("Looking.", tool("bash", command="echo hi")), reply("done")]) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-very-secret")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        scripted(stage, None, client=stage.make_client())
        stage.run_turn([], "go")
    first, second = read_transcript(transcript)
    assert first["agent"] == second["agent"] == "parent"
    assert first["request"]["messages"] == [{"role": "user", "content": "go"}]
    assert first["request"]["tools"][0]["name"] == "bash"
    assert first["response"]["stop_reason"] == "tool_use" and first["response"]["content"][0]["text"] == "Looking."
    assert second["request"]["messages"][-1]["content"][0]["type"] == "tool_result"
    assert second["response"]["content"] == [{"type": "text", "text": "done"}]
    assert "sk-very-secret" not in transcript.read_text()


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_failed_call_is_in_the_transcript_with_its_error(stage, scripted, tmp_path, monkeypatch):
    """A call that fails is recorded too, with "response": null and "error": what went wrong, as
    the user was told it."""
    transcript = tmp_path / "wire.jsonl"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    with FakeAPI([api_error(400, "bad request")]) as api:
        scripted(stage, None, client=api.client())
        stage.run_turn([], "go")
    [line] = read_transcript(transcript)
    assert line["request"]["messages"][0]["content"] == "go" and line["response"] is None
    assert line["error"].startswith("API error 400 (api_error: bad request)")


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_dropped_turn_keeps_its_number_and_the_next_turn_gets_the_next(stage, scripted, tmp_path,
                                                                          monkeypatch):
    """Your turns are counted by the calls that open them (a call whose history ends with what you
    typed), not by the history: a turn that was dropped from it still had its number."""
    transcript = tmp_path / "wire.jsonl"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    monkeypatch.setattr(stage, "turn_number", 0)
    with FakeAPI([api_error(500, "try later"), reply("here")]) as api:
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "one")
        stage.run_turn(messages, "two")
    assert [line["turn"] for line in read_transcript(transcript)] == [1, 2]
    assert len(messages) == 2, "turn one was dropped from the history"


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_each_transcript_line_says_when_how_long_which_session_turn_and_agent(
        stage, scripted, tmp_path, monkeypatch):
    """Each line also carries "time" (when the call started, ISO 8601 UTC), "seconds" (how long it
    took), "session" (one random id per run), "turn" (your turn, from 1) and "agent", so that a
    viewer can group and time the calls. A successful call has no "error"."""
    transcript = tmp_path / "wire.jsonl"
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    monkeypatch.setattr(stage, "turn_number", 0)
    scripted(stage, [reply(tool("bash", command="echo hi")), reply("done"), reply("again")])
    stage.run_turn([], "one")
    stage.run_turn([], "two")
    lines = read_transcript(transcript)
    assert [line["turn"] for line in lines] == [1, 1, 2]
    assert {line["session"] for line in lines} == {stage.SESSION}
    assert re.fullmatch(r"[0-9a-f]{8}", stage.SESSION)
    for line in lines:
        assert list(line)[:5] == ["time", "seconds", "session", "turn", "agent"]
        assert line["agent"] == "parent"
        assert datetime.fromisoformat(line["time"]).utcoffset().total_seconds() == 0
        assert isinstance(line["seconds"], float) and line["seconds"] >= 0
        assert "error" not in line and "task" not in line


BASHRC = "alias ll='ls -l'\n"  # what a file the transcript must never reach holds


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_transcript_that_is_a_link_is_not_written_through_and_the_session_goes_on(
        stage, scripted, tmp_path, monkeypatch, capsys):
    """A command can replace wire.jsonl by a link to ~/.bashrc: JSON appended there would run in
    the user's next shell. The agent never writes through a link: the file it points to stays as
    it was, the user is told once that recording is off, and every turn is still answered."""
    bashrc = tmp_path / "bashrc"
    bashrc.write_text(BASHRC)
    (tmp_path / "wire.jsonl").symlink_to(bashrc)
    monkeypatch.setenv("TRANSCRIPT", str(tmp_path / "wire.jsonl"))
    scripted(stage, [reply("first answer"), reply("second answer")])
    messages = []
    stage.run_turn(messages, "one")
    stage.run_turn(messages, "two")
    out = capsys.readouterr().out
    assert bashrc.read_text() == BASHRC
    assert out.count("recording is off") == 1 and "second answer" in out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_transcript_whose_folder_is_a_link_is_not_written_through(
        stage, scripted, tmp_path, monkeypatch, capsys):
    """O_NOFOLLOW refuses a link only as the last part of a path. A command can make the folder a
    link instead (logs -> the home folder), and TRANSCRIPT=logs/.bashrc would then append JSON to
    ~/.bashrc. The agent refuses a link anywhere on the way: the file stays as it was, the user
    is told once that recording is off and which folder to name, and every turn is answered."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(BASHRC)
    (tmp_path / "logs").symlink_to(home)
    monkeypatch.setenv("TRANSCRIPT", str(tmp_path / "logs" / ".bashrc"))
    scripted(stage, [reply("first answer"), reply("second answer")])
    messages = []
    stage.run_turn(messages, "one")
    stage.run_turn(messages, "two")
    out = capsys.readouterr().out
    assert (home / ".bashrc").read_text() == BASHRC
    assert out.count("recording is off") == 1 and str(home) in out and "second answer" in out


@pytest.mark.parametrize("stage", stages_from("s01_loop", quick_run_checks_the_last_only=True))
def test_a_fifo_in_place_of_the_transcript_does_not_hang_the_agent(stage, tmp_path):
    """A FIFO (a named pipe, `mkfifo wire.jsonl`) blocks whoever opens it to write until someone
    reads. The agent opens its transcript without waiting and only if it is a regular file: it
    says recording is off and answers as usual. (Run as a process of its own: before the fix, the
    test's time-out ends it.)"""
    os.mkfifo(tmp_path / "wire.jsonl")
    with FakeAPI([reply("answered anyway")]) as api:
        env = clean_env(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url,
                        TRANSCRIPT=str(tmp_path / "wire.jsonl"))
        done = run_stage(ROOT / f"{stage.__name__}.py", "hi\nq\n", env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "recording is off" in done.stdout and "answered anyway" in done.stdout


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_link_put_in_place_of_the_transcript_later_changes_nothing(
        stage, scripted, tmp_path, monkeypatch):
    """The transcript is opened once, at its first line, and kept open: a command that then
    renames it and puts a link to ~/.bashrc under its name redirects nothing. Later lines go to
    the file first opened, and the link's target is unchanged."""
    transcript = tmp_path / "wire.jsonl"
    bashrc = tmp_path / "bashrc"
    bashrc.write_text(BASHRC)
    monkeypatch.setenv("TRANSCRIPT", str(transcript))
    scripted(stage, [reply("first answer"), reply("second answer")])
    messages = []
    stage.run_turn(messages, "one")
    transcript.rename(tmp_path / "moved.jsonl")
    transcript.symlink_to(bashrc)
    stage.run_turn(messages, "two")
    assert bashrc.read_text() == BASHRC
    assert len(read_transcript(tmp_path / "moved.jsonl")) == 2


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_ctrl_c_while_text_streams_cancels_only_that_turn(stage, scripted, monkeypatch, capsys):
    """Ctrl-C while the answer is being written: the turn is dropped, the history is valid, the
    session goes on."""
    gate = Gate()

    def press_ctrl_c_on_first_words(shown: str) -> None:
        if "Half an" in shown and not gate.opened.is_set():
            gate.opened.set()
            raise KeyboardInterrupt

    with FakeAPI([reply("first"), reply("Half an answer, then", " more.", gate=gate), reply("after")]) as api:
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "one")
        terminal, real_stdout = Terminal(press_ctrl_c_on_first_words), sys.stdout
        monkeypatch.setattr("sys.stdout", terminal)
        stage.run_turn(messages, "two")
        monkeypatch.setattr("sys.stdout", real_stdout)
        assert "interrupted" in terminal.getvalue() and len(messages) == 2
        stage.run_turn(messages, "three")
    assert history_problem(messages) is None and "after" in capsys.readouterr().out


# -- servers and models people run: what compatible servers send, what newcomers meet -------


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_tool_calls_that_come_with_end_turn_are_answered_and_the_session_goes_on(stage, scripted):
    """Anthropic's API ends a reply that calls tools with stop_reason tool_use; some compatible
    servers say end_turn. The calls are run and answered all the same: a tool_use kept in the
    history without its tool_result would make every later request fail."""
    call = tool("bash", command="echo ran")
    model = scripted(stage, [reply(call, stop_reason="end_turn"), reply("done"), reply("next")])
    messages = []
    stage.run_turn(messages, "go")
    [result] = tool_results(model.requests[1])
    assert result["tool_use_id"] == call["id"] and "ran" in result["content"]
    stage.run_turn(messages, "and then?")
    assert history_problem(messages) is None and len(model.requests) == 3


def lines_besides(out: str, *expected: str) -> list:
    """The lines of a turn's output other than the model's text and the usage line."""
    return [line for line in out.splitlines()
            if line.strip() and line not in expected and not line.startswith("[context")]


WRITTEN_CALL = '```json\n{"name": "bash", "arguments": {"command": "touch ran"}}\n```'


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_tool_call_written_as_text_gets_one_line_and_is_not_run(stage, scripted, capsys):
    """A small local model writes its call as JSON text and its server sends no tool_use (measured
    with llama-server and a 1.5B model, 5 times in 5). The agent does not run it (the protocol is
    tool_use blocks), but says in one line what happened, naming the tool, so it is not a mystery."""
    scripted(stage, [reply(WRITTEN_CALL)])
    stage.run_turn([], "list the files")
    [line] = lines_besides(capsys.readouterr().out, *WRITTEN_CALL.splitlines())
    assert "bash" in line
    assert not (stage.WORKDIR / "ran").exists()


@pytest.mark.parametrize("stage", ALL_STAGES)
@pytest.mark.parametrize("text", ['Here it is: {"name": "Alice", "age": 30}',
                                  '{"name": "bash"}',
                                  '{"name": "no_such_tool", "arguments": {"x": 1}}',
                                  'a brace { and {"unclosed": '])
def test_ordinary_json_in_an_answer_gets_no_such_line(stage, text, scripted, capsys):
    """JSON that is not a call of an offered tool (data, a name alone, a tool not offered, JSON cut
    short) is just text: nothing is added to the answer."""
    scripted(stage, [reply(text)])
    stage.run_turn([], "show me")
    assert lines_besides(capsys.readouterr().out, text) == []


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_base_url_ending_in_v1_shows_the_url_tried_and_says_to_drop_it(stage, scripted, capsys):
    """OpenAI-style servers are set up with a base URL ending in /v1; the SDK adds /v1/messages
    itself, so the request goes to .../v1/v1/messages and gets a 404. The line shows that URL and
    names the setting to change."""
    with FakeAPI([]) as api:
        client = anthropic.Anthropic(api_key="test-key", base_url=api.url + "/v1", max_retries=0)
        scripted(stage, None, client=client)
        stage.run_turn([], "hi")
    [said] = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert f"{api.url}/v1/v1/messages" in said
    assert said.count("ANTHROPIC_BASE_URL") == 2  # among the settings to check, and the one to fix


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_web_server_that_is_no_api_is_named_once_with_the_setting(stage, scripted, tmp_path,
                                                                    capsys):
    """Python's own http.server (not an API) answers a POST with 501 and a page whose title and
    heading say the same: the line says it once, and names ANTHROPIC_BASE_URL and the URL tried."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *args: None
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = anthropic.Anthropic(api_key="test-key", base_url=url, max_retries=0)
        scripted(stage, None, client=client)
        stage.run_turn([], "hi")
    finally:
        server.shutdown()
        server.server_close()
    [said] = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert said.startswith("API error 501") and said.count("Error response") == 1
    assert "ANTHROPIC_BASE_URL" in said and f"{url}/v1/messages" in said


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_mistyped_setting_is_named_at_start_up_and_the_stage_starts(stage, user_env, capsys):
    """A typo (ANTHROPIC_BASE_ULR, in .env or the shell: main() loads .env into the environment)
    would be ignored without a word, and the agent would go to Anthropic's API. At start-up one line
    names it and the setting it is close to; the stage starts all the same. Other settings-like keys
    are named too; unrelated variables are not."""
    with FakeAPI([reply("hello")]) as api:
        user_env.setenv("ANTHROPIC_API_KEY", "test-key")
        user_env.setenv("ANTHROPIC_BASE_URL", api.url)
        user_env.setenv("ANTHROPIC_BASE_ULR", "http://127.0.0.1:8080")
        user_env.setenv("MAX_TOKEN", "100")
        user_env.setenv("SOME_TOOL_HOME", "/opt/tool")
        user_env.setattr("sys.stdin", io.StringIO("hi\n"))
        assert stage.main() == 0
    out = capsys.readouterr().out
    [typo] = [line for line in out.splitlines() if "ANTHROPIC_BASE_ULR" in line]
    [short] = [line for line in out.splitlines() if "MAX_TOKEN " in line]
    assert "ANTHROPIC_BASE_URL" in typo and "MAX_TOKENS" in short
    assert "SOME_TOOL_HOME" not in out and "hello" in out
    assert out.index("ANTHROPIC_BASE_ULR") < out.index(f"at {api.url}")


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_terminal_shows_the_wait_for_the_model_until_its_first_word(stage, scripted,
                                                                       monkeypatch, capsys):
    """A slow local server may think for minutes before its first word: on a terminal a line says
    the agent waits for the model, and the first word takes its place (a carriage return, then the
    line is cleared). In a pipe (the tests' output, a file) nothing of it is written."""
    scripted(stage, [reply("piped"), reply("First words.")])
    stage.run_turn([], "into a pipe")
    assert capsys.readouterr().out.startswith("piped\n")
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    stage.run_turn([], "onto a terminal")
    waiting, rest = terminal.getvalue().split("\r", 1)
    assert "model" in waiting and "First words." not in waiting
    assert rest.startswith("\033[KFirst words.")


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_dropped_turn_says_what_its_tools_did_is_not_undone_only_after_a_tool_call(stage, scripted,
                                                                                    capsys):
    """Dropping a turn takes it out of the history, not off the disk. A turn that fails before
    any tool call did nothing: its line says only that it was dropped. After a tool call, the line
    says that what the tools did is not undone."""
    refused = reply("no", stop_reason="refusal")
    scripted(stage, [refused, reply(tool("bash", command="touch made")), refused])
    stage.run_turn([], "one")
    assert "not undone" not in capsys.readouterr().out
    stage.run_turn([], "two")
    assert "not undone" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_the_transcript_keeps_what_streamed_of_a_reply_cut_off_and_names_the_stage(
        stage, scripted, tmp_path, monkeypatch, capsys):
    """The server goes silent halfway: the user saw the first words, and the transcript keeps them
    with the error (the viewer shows both). Each line names the stage that ran the session."""
    monkeypatch.setenv("TRANSCRIPT", str(tmp_path / "wire.jsonl"))
    gate = Gate()  # never opened: after its first words the server says nothing more
    with FakeAPI([reply("I will now say noth", "ing more.", gate=gate)]) as api:
        scripted(stage, None, client=client_with_short_waits(stage, api, monkeypatch))
        stage.run_turn([], "talk")
        gate.opened.set()
    [line] = read_transcript(tmp_path / "wire.jsonl")
    assert "I will now say" in json.dumps(line["response"]) and "broke off" in line["error"]
    assert line["stage"] == stage.STAGE
