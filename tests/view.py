"""See a recorded run as one web page:  python tests/view.py wire.jsonl [-o run.html]

A transcript (TRANSCRIPT=wire.jsonl) holds one JSON line per model call: what was sent and what
came back. This script turns it into one self-contained HTML file (no scripts, no network, no
fonts) and prints its path. The page shows:
- a bar chart of each call's context size, the part read from the cache shaded, every agent on
  one axis, so a subagent's saving is seen rather than computed;
- totals per agent: calls, tokens in and out, time;
- a timeline with one column (lane) per agent: the parent, and each child beside it, tied to the
  `task` call that started it and to the result that went back. Each call shows only what is
  new in its request since that agent's previous call, then the reply's blocks;
- each turn cut short (Ctrl-C, an API error, a refusal) marked as such, and the next call saying
  how many of its messages were dropped: a stage drops a failed turn from its history.

A transcript is untrusted: a tool result may hold anything, `<script>` included. Every piece of
text is escaped, and the page forbids scripts anyway (its Content-Security-Policy).
Lines without the newer fields (time, seconds, session, stage, turn, task) still work: a line without
"agent" is the parent's, and a child without "task" is tied to a task call by its prompt.
Stdlib only.
"""

import argparse
import html
import json
import os
import sys
import tempfile
from pathlib import Path

MAX_SHOWN = 2000  # characters of one piece of text shown on the page; the rest is cut, with a note
BAR_HEIGHT = 180  # pixels of the tallest bar in the chart
REFUSED_BY_FILTER = "refused, not run:"  # how the stages' command filter starts its refusals
BLOCKED_BY_WALL = "Read-only file system"  # what a command meets when the wall stops a write
TURN_ENDERS = ("refusal", "model_context_window_exceeded", None)  # stop reasons that end a turn
DROPPED_UNSAID = "dropped from the history, though no call failed (Ctrl-C while a tool ran?)"


# -- reading a transcript ----------------------------------------------------------


def read_calls(lines: list) -> list:
    """One dict per model call, with every field present (None when the line lacks it).
    A line that is not a JSON object becomes a call with an error: one bad line spoils nothing."""
    calls = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            record = {"error": f"line {number} is not JSON ({error})"}
        if not isinstance(record, dict):
            record = {"error": f"line {number} is not a JSON object"}
        request = record.get("request") if isinstance(record.get("request"), dict) else {}
        response = record.get("response") if isinstance(record.get("response"), dict) else None
        calls.append(
            {
                "number": len(calls) + 1,
                "agent": "child" if record.get("agent") == "child" else "parent",
                "request": request,
                "response": response,
                "error": record.get("error"),
                "time": record.get("time"),
                "seconds": record.get("seconds"),
                "session": record.get("session"),
                "stage": record.get("stage"),
                "turn": record.get("turn"),
                "task": record.get("task"),
            }
        )
    return calls


def messages_of(call: dict) -> list:
    """The messages a call sent (anything that is not a message is left out)."""
    messages = call["request"].get("messages")
    if not isinstance(messages, list):
        return []
    return [message for message in messages if isinstance(message, dict)]


def arguments_of(block: dict) -> dict:
    """A tool call's arguments; none when its input is not an object."""
    arguments = block.get("input")
    return arguments if isinstance(arguments, dict) else {}


def blocks_of(content) -> list:
    """A message's content as a list of blocks: a plain string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [
            block if isinstance(block, dict) else {"type": "text", "text": str(block)}
            for block in content
        ]
    return []


def reply_blocks(call: dict) -> list:
    return blocks_of((call["response"] or {}).get("content"))


def usage_of(call: dict) -> dict:
    """The call's token counts; zeros when the call failed or the counts are missing."""
    usage = (call["response"] or {}).get("usage") or {}
    counts = {}
    for name in (
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "output_tokens",
    ):
        value = usage.get(name)
        counts[name] = value if isinstance(value, int) else 0
    return counts


def context_size(call: dict) -> int:
    """All the model read for the call: new input, plus what it read from or wrote to the cache."""
    usage = usage_of(call)
    return (
        usage["input_tokens"]
        + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    )


def common_start(old: list, new: list) -> int:
    """How many messages at the start of `new` are the same as at the start of `old`."""
    count = 0
    while count < min(len(old), len(new)) and old[count] == new[count]:
        count += 1
    return count


def starts_with(messages: list, start: list) -> bool:
    return common_start(start, messages) == len(start)


def ends_turn(call: dict) -> bool:
    """The call failed, or its reply stopped the turn (a refusal, say): the stage drops the turn."""
    return call["response"] is None or call["response"].get("stop_reason") in TURN_ENDERS


def reply_message(call: dict) -> dict | None:
    """The message a stage adds to its history for the call's reply: the reply's blocks without
    empty text. None when the call ended the turn or the reply was empty (nothing is added)."""
    if ends_turn(call):
        return None
    content = [
        block
        for block in (call["response"].get("content") or [])
        if not isinstance(block, dict) or block.get("type") != "text" or block.get("text")
    ]
    return {"role": "assistant", "content": content} if content else None


def first_text(messages: list) -> str:
    """The text of the first message: for a child, the prompt the parent wrote."""
    if not messages:
        return ""
    texts = [
        block.get("text", "")
        for block in blocks_of(messages[0].get("content"))
        if block.get("type") == "text"
    ]
    return "\n".join(texts)


# -- lanes: the parent, and one per child --------------------------------------------


def new_lane(lanes: list, agent: str, task_use=None) -> dict:
    children = sum(1 for lane in lanes if lane["agent"] == "child")
    lane = {
        "index": len(lanes),
        "agent": agent,
        "calls": [],
        "task": None,
        "task_call": None,
        "result_call": None,
        "name": "parent" if agent == "parent" else f"child {children + 1}",
    }
    if task_use:
        lane["task"] = task_use["block"].get("id")
        lane["task_call"] = task_use["call"]
        description = arguments_of(task_use["block"]).get("description")
        if isinstance(description, str) and description:
            lane["name"] += f": {description}"
    lanes.append(lane)
    return lane


def find_task_use(open_tasks: list, call: dict) -> dict | None:
    """The parent's task call that started this child: by its id when the line names it, else
    the first task call not yet taken whose prompt is the child's first message."""
    waiting = [use for use in open_tasks if not use["taken"]]
    if call["task"]:
        matches = [use for use in open_tasks if use["block"].get("id") == call["task"]]
    else:
        prompt = first_text(messages_of(call))
        matches = [use for use in waiting if arguments_of(use["block"]).get("prompt") == prompt]
        matches = matches or waiting[:1]  # no prompt matches: the first task call still waiting
    if matches:
        matches[0]["taken"] = True
        return matches[0]
    return None


def child_lane_for(call: dict, lanes: list, open_tasks: list, previous: dict | None) -> dict:
    """The child lane a child call belongs to, opening a new one for a new child."""
    if call["task"]:
        for lane in lanes:
            if lane["task"] == call["task"] and lane["calls"][-1]["session"] == call["session"]:
                return lane
    elif previous and previous["lane"]["agent"] == "child" and len(messages_of(call)) > 1:
        return previous["lane"]  # a child's calls follow each other until it ends
    return new_lane(lanes, "child", find_task_use(open_tasks, call))


def compare_with_previous(call: dict, lane: dict) -> None:
    """What the call's request adds to the history its lane's previous call left: that call's
    messages and its reply. After a turn that was cut short, the stage went back to the history
    from before that turn: the request is that history and the newly typed message.
    Adds to the call: lane, new (the new messages), repeats_reply (the first new one is the
    previous reply, sent back: shown already), dropped (how many messages of the history left are
    no longer sent), dropped_turn (the first call of the turn dropped whole, if one was),
    system_shown and tools_shown (new or changed)."""
    before = lane["calls"][-1] if lane["calls"] else None
    if before and before["session"] != call["session"]:
        before = None  # a new session starts a new conversation
    sent = messages_of(call)
    call.update(lane=lane, new=sent, repeats_reply=False, dropped=0, dropped_turn=None)
    if before:
        reply = reply_message(before)
        left = messages_of(before) + ([reply] if reply else [])
        turn_start = before["turn_start"]
        at_start = messages_of(turn_start)[:-1]  # the history before that turn's typed message
        if not ends_turn(before) and starts_with(sent, left):
            kept = len(left)  # the same turn goes on, or the next one follows it
        elif len(sent) == len(at_start) + 1 and starts_with(sent, at_start):
            kept, call["dropped_turn"] = len(at_start), turn_start  # that turn was dropped
        else:
            kept = common_start(left, sent)
        call["repeats_reply"] = bool(reply) and kept > len(messages_of(before))
        call["new"] = sent[kept - 1 if call["repeats_reply"] else kept :]
        call["dropped"] = len(left) - kept
    request, request_before = call["request"], (before or {}).get("request", {})
    call["system_shown"] = not before or request.get("system") != request_before.get("system")
    call["tools_shown"] = not before or request.get("tools") != request_before.get("tools")


def typed_messages(call: dict) -> list:
    """The new messages the user typed (a tool result is a user message too, but made of blocks)."""
    return [
        message
        for message in call["new"]
        if message.get("role") == "user" and isinstance(message.get("content"), str)
    ]


def note_answers(call: dict, lanes: list) -> None:
    """Mark the child lanes whose answer this parent call carries, as the result of their task."""
    for message in call["new"]:
        for block in blocks_of(message.get("content")):
            for child in lanes[1:]:
                if child["task"] and block.get("tool_use_id") == child["task"]:
                    child["result_call"] = child["result_call"] or call


def build_lanes(calls: list) -> list:
    """Put each call in its lane (the parent's is the first), and work out what each call adds
    (see compare_with_previous), its turn, and which turns were cut short (see mark_cut_short).
    Each child lane learns its task call and the parent call that carried its answer back."""
    lanes = [new_lane([], "parent")]
    open_tasks, previous, turn, session = [], None, 0, None
    for call in calls:
        if call["agent"] == "parent":
            lane = lanes[0]
        else:
            lane = child_lane_for(call, lanes, open_tasks, previous)
        before = lane["calls"][-1] if lane["calls"] else None
        compare_with_previous(call, lane)
        call["opens_turn"] = not before or before["session"] != call["session"]
        if call["agent"] == "parent":
            if call["session"] != session:
                session, turn = call["session"], 0
            if typed_messages(call):
                turn += 1
            call["turn"] = call["turn"] or turn
            call["opens_turn"] = call["opens_turn"] or call["turn"] != before["turn"]
            for block in reply_blocks(call):
                if block.get("type") == "tool_use" and block.get("name") == "task":
                    open_tasks.append({"block": block, "call": call, "taken": False})
            note_answers(call, lanes)
        else:
            started_by = lane["task_call"]
            call["turn"] = call["turn"] or (started_by["turn"] if started_by else None)
        call["turn_start"] = call if call["opens_turn"] else before["turn_start"]
        lane["calls"].append(call)
        previous = call
    mark_cut_short(calls)
    return lanes


def mark_cut_short(calls: list) -> None:
    """Mark each turn that was cut short, on its first call ("cut_short": why): its last call
    failed (Ctrl-C, an API error) or ended it (a refusal, say), or, though no call failed, the
    next request no longer carries its messages (Ctrl-C while a tool ran). A child's calls belong
    to the turn of the parent's call before them. A stage drops such a turn from its history."""
    last_of, opening = {}, None
    for call in calls:
        if call["agent"] == "parent" and call["opens_turn"]:
            opening = call
        if opening:
            last_of[opening["number"]] = (opening, call)
    for opening, last in last_of.values():
        if last["response"] is None or last["error"]:  # a reply cut off midway has both
            opening["cut_short"] = str(last["error"] or "the call failed, with no reply")
        elif ends_turn(last):
            opening["cut_short"] = f"stop_reason: {last['response'].get('stop_reason')}"
    for call in calls:
        if call["dropped_turn"] and not call["dropped_turn"].get("cut_short"):
            call["dropped_turn"]["cut_short"] = DROPPED_UNSAID


# -- the page ----------------------------------------------------------------------


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def shown(text: str, limit: int = MAX_SHOWN) -> str:
    """Escaped text, cut to `limit` characters with a note of how much was cut."""
    if len(text) <= limit:
        return esc(text)
    cut = len(text) - limit
    return f'{esc(text[:limit])}<span class="cut">[{cut:,} more characters cut here]</span>'


def result_text(block: dict) -> str:
    """A tool_result's content as text (it may be a string or a list of blocks)."""
    content = block.get("content")
    if isinstance(content, str):
        return content
    parts = []
    for part in blocks_of(content):
        parts.append(
            part.get("text", "") if part.get("type") == "text" else f"[{part.get('type')}]"
        )
    return "\n".join(parts)


def call_link(call: dict | None, words: str) -> str:
    if not call:
        return ""
    return f'<a href="#call-{call["number"]}">{esc(words)}</a>'


def lane_of_task(lanes: list, use_id) -> dict | None:
    return next((lane for lane in lanes[1:] if use_id and lane["task"] == use_id), None)


def render_block(block: dict, lanes: list, tool_names: dict) -> str:
    kind = block.get("type")
    if kind == "text":
        return f'<div class="block text"><pre>{shown(str(block.get("text", "")))}</pre></div>'
    if kind == "tool_use":
        use_id = block.get("id")
        child = lane_of_task(lanes, use_id)
        tie = (
            f' <a class="tie" href="#lane-{child["index"]}">starts {esc(child["name"])} &rarr;</a>'
            if child
            else ""
        )
        arguments = json.dumps(block.get("input"), ensure_ascii=False)
        if len(arguments) > 60:  # one argument a line when they do not fit on one
            arguments = json.dumps(block.get("input"), indent=1, ensure_ascii=False)
        return (
            f'<div class="block tool-use" id="use-{esc(use_id)}" data-tool-use="{esc(use_id)}">'
            f'<div class="label">tool call <b>{esc(block.get("name"))}</b>{tie}</div>'
            f"<pre>{shown(arguments)}</pre></div>"
        )
    if kind == "tool_result":
        use_id = block.get("tool_use_id")
        text = result_text(block)
        marks, classes = [], ["block", "tool-result"]
        if block.get("is_error"):
            marks.append('<span class="mark error">is_error</span>')
            classes.append("is-error")
        if REFUSED_BY_FILTER in text:
            marks.append('<span class="mark refused">refused by the filter</span>')
            classes.append("refused")
        if BLOCKED_BY_WALL in text:
            marks.append('<span class="mark refused">stopped by the wall</span>')
            classes.append("refused")
        child = lane_of_task(lanes, use_id)
        if child:
            marks.append(
                f'<a class="tie" href="#lane-{child["index"]}">&larr; the answer of '
                f"{esc(child['name'])}</a>"
            )
        name = tool_names.get(str(use_id), "?")
        return (
            f'<div class="{" ".join(classes)}" data-tool-result="{esc(use_id)}">'
            f'<div class="label">result of <b>{esc(name)}</b> {" ".join(marks)}</div>'
            f"<pre>{shown(text)}</pre></div>"
        )
    if kind in ("thinking", "redacted_thinking"):
        thought = str(block.get("thinking", ""))
        label = f'<div class="label">{esc(kind)}</div>'
        return f'<div class="block other">{label}<pre>{shown(thought)}</pre></div>'
    return (
        f'<div class="block other"><div class="label">{esc(kind)} block</div>'
        f"<pre>{shown(json.dumps(block, ensure_ascii=False))}</pre></div>"
    )


def render_message(message: dict, lanes: list, tool_names: dict) -> str:
    role = str(message.get("role"))
    blocks = "".join(
        render_block(block, lanes, tool_names) for block in blocks_of(message.get("content"))
    )
    return (
        f'<div class="message role-{esc(role)}"><div class="role">{esc(role)}</div>{blocks}</div>'
    )


def short_time(call: dict) -> str:
    """HH:MM:SS of an ISO time, or nothing when the line has none."""
    when = call["time"]
    return when[11:19] if isinstance(when, str) and len(when) >= 19 else ""


def seconds_text(call: dict) -> str:
    seconds = call["seconds"]
    return f"{seconds:.1f}s" if isinstance(seconds, (int, float)) else ""


def render_call(call: dict, lanes: list, tool_names: dict, row: int) -> str:
    lane = call["lane"]
    parts = []
    heading = [f"call {call['number']}", short_time(call), seconds_text(call)]
    parts.append(
        f'<div class="call-head">{esc(" · ".join(word for word in heading if word))}</div>'
    )
    if call["dropped_turn"]:
        parts.append(
            f'<div class="note dropped">{call["dropped"]} message(s) of turn '
            f"{esc(call['dropped_turn']['turn'])} are no longer sent: that turn was cut short, "
            "and dropped from the history</div>"
        )
    elif call["dropped"]:
        parts.append(
            f'<div class="note dropped">{call["dropped"]} earlier message(s) of this agent are no '
            "longer sent</div>"
        )
    if call["system_shown"] and lane["calls"][0] is not call:
        parts.append(
            "<details><summary>the system prompt, as sent from this call on</summary><pre>"
            f"{shown(str(call['request'].get('system', '')))}</pre></details>"
        )
    new = call["new"]
    if call["repeats_reply"]:
        parts.append('<div class="note">assistant: the reply above</div>')
        new = new[1:]
    if new:
        messages = "".join(render_message(message, lanes, tool_names) for message in new)
        parts.append(f'<div class="sent"><div class="part">sent (new)</div>{messages}</div>')
    parts.append(render_reply(call, lanes, tool_names))
    number, place = call["number"], f"grid-column: {lane['index'] + 1}; grid-row: {row}"
    return (
        f'<article class="call lane-{lane["agent"]}" id="call-{number}" data-call="{number}" '
        f'data-lane="{lane["index"]}" style="{place}">{"".join(parts)}</article>'
    )


def render_reply(call: dict, lanes: list, tool_names: dict) -> str:
    response = call["response"]
    if response is None:
        error = call["error"] or "no reply was recorded: the call failed"
        return (
            f'<div class="reply failed"><div class="part">no reply</div>'
            f"<pre>{shown(str(error))}</pre></div>"
        )
    stop = str(response.get("stop_reason"))
    usage = usage_of(call)
    stop_class = "stop" if stop in ("tool_use", "end_turn") else "stop unusual"
    if stop == "refusal":
        stop_class += " refusal"
    summary = (
        f'<span class="{stop_class}">stop_reason: {esc(stop)}</span> '
        f'<span class="usage">context {context_size(call):,} tokens, '
        f"{usage['cache_read_input_tokens']:,} from cache; output {usage['output_tokens']:,}</span>"
    )
    blocks = "".join(render_block(block, lanes, tool_names) for block in reply_blocks(call))
    if call["error"]:  # the reply came, then the call failed (the stream was cut off)
        blocks += (
            f'<div class="reply failed"><div class="part">then the call failed</div>'
            f"<pre>{shown(str(call['error']))}</pre></div>"
        )
    return f'<div class="reply"><div class="part">reply {summary}</div>{blocks}</div>'


def render_lane_head(lane: dict) -> str:
    first = lane["calls"][0]
    request = first["request"]
    tools = request.get("tools") if isinstance(request.get("tools"), list) else []
    names = ", ".join(str(tool.get("name")) for tool in tools if isinstance(tool, dict))
    tie = ""
    if lane["agent"] == "child":
        start = lane["task_call"]
        started = (
            f"started by the task call in {call_link(start, 'call ' + str(start['number']))}"
            if start
            else "its task call is not in this transcript"
        )
        result = lane["result_call"]
        back = (
            f"its answer went back in {call_link(result, 'call ' + str(result['number']))}"
            if result
            else "its answer never reached the parent"
        )
        tie = f'<p class="tie-line">{started}; {back}. Its messages are thrown away.</p>'
    settings = {
        key: value for key, value in request.items() if key not in ("system", "messages", "tools")
    }
    index, system = lane["index"], str(request.get("system", ""))
    schemas = json.dumps(tools, indent=1, ensure_ascii=False)
    return (
        f'<div class="lane-head lane-{lane["agent"]}" id="lane-{index}" data-lane="{index}" '
        f'data-agent="{lane["agent"]}" data-task="{esc(lane["task"] or "")}" '
        f'style="grid-column: {index + 1}; grid-row: 1">'
        f"<h3>{esc(lane['name'])}</h3>{tie}"
        f"<details><summary>system prompt</summary><pre>{shown(system)}</pre></details>"
        f"<details><summary>tools: {esc(names or 'none')}</summary>"
        f"<pre>{shown(schemas, 6 * MAX_SHOWN)}</pre></details>"
        "<details><summary>other settings</summary>"
        f"<pre>{shown(json.dumps(settings, indent=1))}</pre></details></div>"
    )


def render_chart(calls: list) -> str:
    """One bar per call, every agent on one axis; the part read from the cache is shaded."""
    tallest = max([context_size(call) for call in calls] + [1])
    bars = []
    for call in calls:
        size, cached = context_size(call), usage_of(call)["cache_read_input_tokens"]
        height, cached_height = BAR_HEIGHT * size / tallest, BAR_HEIGHT * cached / tallest
        lane = call["lane"]
        title = f"call {call['number']}, {lane['name']}: {size:,} tokens, {cached:,} from cache"
        value = f"{size:,}"
        if call["response"] is None:
            title, value = f"call {call['number']}, {lane['name']}: failed, no reply", "failed"
        bars.append(
            f'<a class="bar-slot" href="#call-{call["number"]}" title="{esc(title)}">'
            f'<span class="bar-value">{value}</span>'
            f'<span class="bar lane-{lane["agent"]}" data-bar="{call["number"]}" '
            f'data-tokens="{size}" data-cached="{cached}" style="height: {height:.2f}px">'
            f'<span class="cached" style="height: {cached_height:.2f}px"></span></span>'
            f'<span class="bar-label">{call["number"]}</span></a>'
        )
    return (
        f'<div class="chart"><div class="axis"><span>{tallest:,} tokens</span><span>0</span></div>'
        f'<div class="bars" style="height: {BAR_HEIGHT}px">{"".join(bars)}</div></div>'
        '<p class="legend"><span class="swatch lane-parent"></span> parent '
        '<span class="swatch lane-child"></span> child '
        '<span class="swatch cached-swatch"></span> read from the cache. '
        "Bar height: the tokens the model read for that call (input, cached or not). "
        "The numbers are the calls, in order; click one to see it.</p>"
    )


def render_totals(lanes: list) -> str:
    rows = []
    for lane in lanes:
        if not lane["calls"]:
            continue
        usages = [usage_of(call) for call in lane["calls"]]
        seconds = [
            call["seconds"] for call in lane["calls"] if isinstance(call["seconds"], (int, float))
        ]
        time_text = f"{sum(seconds):.1f}s" if seconds else "not recorded"
        rows.append(
            f'<tr data-totals="{lane["index"]}"><td>{esc(lane["name"])}</td>'
            f"<td>{len(lane['calls'])}</td>"
            f"<td>{sum(context_size(call) for call in lane['calls']):,}</td>"
            f"<td>{sum(usage['cache_read_input_tokens'] for usage in usages):,}</td>"
            f"<td>{sum(usage['output_tokens'] for usage in usages):,}</td><td>{time_text}</td></tr>"
        )
    return (
        '<table class="totals"><tr><th>agent</th><th>calls</th><th>input tokens (all)</th>'
        "<th>of which from cache</th><th>output tokens</th><th>time</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def render_timeline(calls: list, lanes: list) -> str:
    tool_names = {  # a tool_result names only the id of its call: this gives the tool's name
        str(block.get("id")): block.get("name")
        for call in calls
        for block in reply_blocks(call)
        if block.get("type") == "tool_use"
    }
    cells = [render_lane_head(lane) for lane in lanes if lane["calls"]]
    row, last_session, rows = 2, None, {}
    for call in calls:
        if call["agent"] == "parent" and call["opens_turn"]:
            if call["session"] != last_session and call["session"]:
                cells.append(
                    f'<div class="divider session" style="grid-row: {row}">session '
                    f"{esc(call['session'])} {esc(call['stage'] or '')} {esc(call['time'] or '')}</div>"
                )
                row += 1
            typed = typed_messages(call)
            words = f": {typed[-1]['content']}" if typed else ""
            cut = call.get("cut_short")
            mark = f' <span class="mark error">cut short: {shown(cut, 300)}</span>' if cut else ""
            cells.append(
                f'<div class="divider turn{" cut-short" if cut else ""}" style="grid-row: {row}">'
                f"turn {esc(call['turn'])}{shown(words, 200)}{mark}</div>"
            )
            row += 1
            last_session = call["session"]
        cells.append(render_call(call, lanes, tool_names, row))
        rows[call["number"]] = row
        row += 1
    for child in lanes[1:]:  # the parent waits while its child works
        first, last = rows[child["calls"][0]["number"]], rows[child["calls"][-1]["number"]]
        cells.append(
            f'<div class="waiting" style="grid-column: 1; grid-row: {first} / {last + 1}">'
            f"waiting for {esc(child['name'])}: the task call blocks until it is done</div>"
        )
    columns = len([lane for lane in lanes if lane["calls"]])
    lanes_style = f"grid-template-columns: repeat({columns}, minmax(22rem, 1fr))"
    return f'<div class="timeline" style="{lanes_style}">{"".join(cells)}</div>'


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1rem; color: #1a202c; background: #f7fafc; }
h1 { font-size: 1.3rem; margin: 0 0 .3rem; } h2 { font-size: 1.1rem; margin: 1.2rem 0 .4rem; }
h3 { font-size: 1rem; margin: 0 0 .3rem; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: .2rem 0; font: 12px/1.35 monospace; }
.chart { display: flex; gap: .4rem; align-items: stretch; }
.axis { display: flex; flex-direction: column; justify-content: space-between; font-size: 11px;
        text-align: right; height: 180px; color: #4a5568; padding-top: 16px; margin-top: -6px; }
.bars { display: flex; align-items: flex-end; gap: 6px; border-left: 1px solid #718096;
        border-bottom: 1px solid #718096; padding: 16px 6px 0; }
.bar-value { font-size: 10px; color: #4a5568; }
.bar-slot { display: flex; flex-direction: column; align-items: center; justify-content: flex-end;
            height: 100%; text-decoration: none; color: #4a5568; font-size: 11px; }
.bar { display: flex; flex-direction: column; justify-content: flex-end; width: 34px;
       flex-shrink: 0; }
.bar.lane-parent, .swatch.lane-parent { background: #2b6cb0; }
.bar.lane-child, .swatch.lane-child { background: #dd6b20; }
.cached, .cached-swatch { background: repeating-linear-gradient(45deg, rgba(255,255,255,.75) 0 3px,
                           rgba(255,255,255,.35) 3px 6px); }
.cached-swatch { background-color: #718096; }
.bar-label { position: relative; top: 14px; height: 0; }
.legend { font-size: 12px; color: #4a5568; margin-top: 1.6rem; }
.swatch { display: inline-block; width: 12px; height: 12px; vertical-align: middle; }
.totals { border-collapse: collapse; font-size: 13px; }
.totals td, .totals th { border: 1px solid #cbd5e0; padding: .2rem .6rem; text-align: right; }
.totals td:first-child, .totals th:first-child { text-align: left; }
.timeline { display: grid; gap: .5rem 1rem; align-items: start; }
.lane-head { border-top: 4px solid; padding: .3rem .5rem; background: #fff; }
.lane-head.lane-parent { border-color: #2b6cb0; } .lane-head.lane-child { border-color: #dd6b20; }
.divider { grid-column: 1 / -1; background: #e2e8f0; padding: .2rem .5rem; font-weight: 600; }
.divider.session { background: #cbd5e0; } .divider.cut-short { background: #fed7d7; }
.call { background: #fff; border-left: 4px solid; padding: .3rem .5rem; }
.call.lane-parent { border-color: #2b6cb0; } .call.lane-child { border-color: #dd6b20; }
.call-head { font-size: 12px; color: #4a5568; font-weight: 600; }
.part { font-size: 12px; font-weight: 600; color: #2d3748; margin-top: .3rem; }
.message { display: grid; grid-template-columns: 4.2rem 1fr; margin: .2rem 0; }
.role { font-size: 11px; color: #718096; padding-top: .3rem; }
.message > .block { grid-column: 2; }
.waiting { border: 2px dashed #a0aec0; color: #718096; font-size: 12px; padding: .5rem;
           align-self: stretch; display: flex; align-items: center; justify-content: center; }
.block { border: 1px solid #e2e8f0; border-radius: 3px; padding: .1rem .3rem; margin: .15rem 0; }
.tool-use { background: #ebf8ff; } .tool-result { background: #f0fff4; }
.tool-result.is-error { background: #fff5f5; border-color: #fc8181; }
.tool-result.refused { background: #fffaf0; border-color: #dd6b20; }
.label { font-size: 12px; }
.mark { font-size: 11px; padding: 0 .3rem; border-radius: 3px; color: #fff; }
.mark.error { background: #c53030; } .mark.refused { background: #c05621; }
.reply { border-top: 1px dashed #cbd5e0; margin-top: .3rem; }
.reply.failed { background: #fff5f5; color: #9b2c2c; }
.stop { font-weight: 400; } .stop.unusual { color: #c53030; font-weight: 700; }
.usage { font-weight: 400; color: #4a5568; }
.note { font-size: 12px; color: #718096; font-style: italic; }
.cut { display: block; color: #c05621; font-style: italic; }
.tie { font-size: 12px; margin-left: .4rem; } .tie-line { font-size: 12px; margin: .2rem 0; }
details summary { cursor: pointer; font-size: 12px; color: #2d3748; }
"""

# No script may run, whatever the transcript holds; nothing may be fetched from anywhere.
POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def render_page(calls: list, title: str) -> str:
    lanes = build_lanes(calls)
    children = len(lanes) - 1
    sessions = len({call["session"] for call in calls if call["session"]})
    facts = [f"{len(calls)} model calls", f"{children} child agent(s)"]
    if sessions:
        facts.append(f"{sessions} session(s)")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
        '<link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{esc(title)}</h1><p>{esc(', '.join(facts))}. Each call shows what its request added "
        "since that agent's previous call, then the reply.</p>"
        f"<h2>Context size per call</h2>{render_chart(calls)}"
        f"<h2>Totals per agent</h2>{render_totals(lanes)}"
        f"<h2>Timeline: one lane per agent</h2>{render_timeline(calls, lanes)}"
        "</body></html>\n"
    )


def not_a_transcript(transcript: Path, calls: list) -> str | None:
    """Why the file is no transcript, or None. One bad line spoils nothing; but a file in which
    no line holds a request (a README, an empty file) would only make a page of bad lines."""
    if any(call["request"] for call in calls):
        return None
    return (f"{transcript} holds no model call, so there is no page to draw: none of its lines "
            'is a JSON object with a "request" (a TRANSCRIPT file has one per call)')


def write_page(transcript: Path, page: Path) -> Path:
    """Read a transcript and write its page; return the page's path. A file that is not a
    transcript raises ValueError, saying why."""
    calls = read_calls(transcript.read_text(encoding="utf-8", errors="replace").splitlines())
    problem = not_a_transcript(transcript, calls)
    if problem:
        raise ValueError(problem)
    write_new(page, render_page(calls, f"The run recorded in {transcript.name}"))
    return page


def write_new(page: Path, text: str) -> None:
    """Write `page` as a new file renamed into place, so that a link the model left at its name
    (wire.html -> ~/.bashrc) is replaced, never written through. A folder reached through a link
    is refused (ValueError): the model can make a folder of the workspace a link too."""
    folder = os.path.abspath(page.parent)
    if os.path.realpath(folder) != folder:
        raise ValueError(f"a link leads to the folder of {page}; name the folder itself: "
                         f"{os.path.realpath(folder)}")
    descriptor, temp = tempfile.mkstemp(dir=folder, prefix=f".{page.name}.")  # new, not a link
    try:
        with open(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temp, page)
    except BaseException:
        os.unlink(temp)
        raise


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(
        prog="python tests/view.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "transcript", type=Path, help="a TRANSCRIPT file: one JSON line per model call"
    )
    parser.add_argument(
        "-o", "--output", type=Path, help="the page to write (default: beside it, .html)"
    )
    options = parser.parse_args(argv)
    if not options.transcript.is_file():
        print(f"no such file: {options.transcript}", file=sys.stderr)
        return 2
    try:
        page = write_page(options.transcript, options.output or options.transcript.with_suffix(".html"))
    except ValueError as problem:
        print(problem, file=sys.stderr)
        return 2
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
