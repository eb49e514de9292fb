"""Stage 2: a tool set dispatched by name. Later stages keep these promises, so tests run on them too."""

import os
import signal
import stat
import tracemalloc

import pytest
from conftest import call_tool, stages_from
from fake_api import FakeAPI, reply, tool

TOOL_STAGES = stages_from("s02_tools")



# -- dispatch --------------------------------------------------------------------


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_unknown_tool_is_an_error_that_lists_the_real_tools(stage, scripted):
    """A made-up tool name gets an error naming the tools that exist, so the model can recover."""
    result = call_tool(stage, scripted, "delete_everything")
    assert result["is_error"]
    assert all(name in result["content"] for name in ("bash", "read_file", "write_file", "edit_file", "list_dir"))


@pytest.mark.parametrize("stage", TOOL_STAGES)
@pytest.mark.parametrize(("tool_input", "said"), [
    ({}, "missing required argument 'path'"),
    ({"path": 7}, "'path' must be of type string"),
    ({"path": "a.txt", "limit": "10"}, "'limit' must be of type integer"),
    ({"path": "a.txt", "limit": True}, "'limit' must be of type integer"),
    ({"path": "a.txt", "colour": "red"}, "unexpected argument 'colour'"),
])
def test_arguments_are_checked_against_the_schema(stage, tool_input, said, scripted):
    """A missing, wrong-typed or unknown argument is an is_error result saying which, not a crash."""
    result = call_tool(stage, scripted, "read_file", **tool_input)
    assert result["is_error"] and said in result["content"]


SETTINGS_TOOL = {  # a tool such as an exercise adds, with every type JSON Schema has
    "name": "settings",
    "description": "Show the settings it is given.",
    "input_schema": {"type": "object", "required": [], "properties": {
        "verbose": {"type": "boolean"}, "ratio": {"type": "number"}, "names": {"type": "array"},
        "options": {"type": "object"}, "nothing": {"type": "null"},
        "either": {"type": ["string", "null"]}, "untyped": {"enum": ["a", "b"]}}},
}


@pytest.fixture
def settings_tool(monkeypatch):
    """Adds SETTINGS_TOOL to a stage's tools (s04: the parent's), handled by a function that
    returns its arguments sorted, as text."""
    def offer(stage):
        tools = getattr(stage, "PARENT_TOOLS", None) or stage.TOOLS  # the list the loop offers
        tools.append(SETTINGS_TOOL)
        added.append(tools)
        monkeypatch.setitem(stage.TOOL_HANDLERS, "settings", lambda **args: repr(sorted(args)))
    added = []
    yield offer
    for tools in added:
        tools.remove(SETTINGS_TOOL)


@pytest.mark.parametrize("stage", TOOL_STAGES)
@pytest.mark.parametrize(("tool_input", "said"), [
    ({"verbose": True, "ratio": 0.5, "names": ["a"], "options": {"a": 1}, "nothing": None,
      "either": None, "untyped": "a"}, None),
    ({"ratio": 2, "either": "text", "untyped": 7}, None),
    ({"verbose": 1}, "'verbose' must be of type boolean"),
    ({"ratio": "0.5"}, "'ratio' must be of type number"),
    ({"ratio": False}, "'ratio' must be of type number"),
    ({"names": "a"}, "'names' must be of type array"),
    ({"options": ["a"]}, "'options' must be of type object"),
    ({"nothing": 0}, "'nothing' must be of type null"),
])
def test_every_json_schema_type_is_checked_or_passed_on(stage, tool_input, said, settings_tool,
                                                        scripted):
    """A tool may declare any JSON Schema type (s02's exercises add such tools): boolean, number,
    array, object and null are checked (True is no number; 0 is no null), and what the check does
    not know (a list of types, no type at all) is passed on to the tool. Nothing raises: the model
    always gets a tool_result."""
    settings_tool(stage)
    result = call_tool(stage, scripted, "settings", **tool_input)
    if said is None:
        assert not result["is_error"] and "ratio" in result["content"]
    else:
        assert result["is_error"] and said in result["content"]


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_a_null_optional_argument_counts_as_not_given(stage, scripted, workspace):
    """Models sometimes send null for an optional argument; that means "use the default"."""
    (workspace / "a.txt").write_text("one\ntwo\n")
    assert call_tool(stage, scripted, "read_file", path="a.txt", limit=None)["content"] == "one\ntwo\n"


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_a_tool_that_raises_becomes_an_error_result(stage, scripted):
    """An exception inside a tool (here: a missing file) is reported to the model, not raised."""
    result = call_tool(stage, scripted, "read_file", path="no/such/file.txt")
    assert result["is_error"] and "FileNotFoundError" in result["content"]


# -- read_file -------------------------------------------------------------------


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_read_file_limit_keeps_the_first_lines_and_counts_the_rest(stage, scripted, workspace):
    """`limit` keeps the first N lines and says how much is left, in bytes: the file's size tells
    that without reading the rest, while counting the lines left would mean reading them all."""
    (workspace / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    content = call_tool(stage, scripted, "read_file", path="long.txt", limit=3)["content"]
    assert content == "line 1\nline 2\nline 3\n... [50 more bytes not shown]"  # "line 4\n" ... "line 10\n"


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_read_file_refuses_a_limit_below_one(stage, scripted, workspace):
    """limit=0 is a mistake worth naming, not an empty answer."""
    (workspace / "a.txt").write_text("x\n")
    result = call_tool(stage, scripted, "read_file", path="a.txt", limit=0)
    assert result["is_error"] and "at least 1" in result["content"]


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_read_file_is_capped_with_a_marker(stage, scripted, workspace):
    """A huge file is cut at MAX_OUTPUT, and the cut is said."""
    (workspace / "big.txt").write_text("y" * (stage.MAX_OUTPUT + 5000))
    content = call_tool(stage, scripted, "read_file", path="big.txt")["content"]
    assert len(content) < stage.MAX_OUTPUT + 200 and "5000 more bytes not shown" in content


@pytest.mark.parametrize("stage", TOOL_STAGES)
@pytest.mark.parametrize("data", [b"\x89PNG\r\n\x1a\n\x00\x00", b"caf\xe9"], ids=["binary", "latin-1"])
def test_read_file_reports_binary_or_undecodable_files(stage, data, scripted, workspace):
    """A binary or non-UTF-8 file gets a clear result, not a crash or a page of mojibake."""
    (workspace / "blob").write_bytes(data)
    result = call_tool(stage, scripted, "read_file", path="blob")
    assert result["is_error"] and "binary or non-UTF-8" in result["content"]


# -- write_file, edit_file, list_dir ---------------------------------------------------


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_write_file_creates_missing_folders(stage, scripted, workspace):
    """Writing a/b/c.txt creates a/ and a/b/ first."""
    result = call_tool(stage, scripted, "write_file", path="a/b/c.txt", content="hello\r\n")
    assert not result["is_error"]
    assert (workspace / "a/b/c.txt").read_bytes() == b"hello\r\n"


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_edit_file_replaces_the_one_match(stage, scripted, workspace):
    """The normal edit: old_text occurs once and is replaced; other lines and line ends stay as they were."""
    (workspace / "app.py").write_bytes(b"x = 1\r\ny = 2\r\n")
    result = call_tool(stage, scripted, "edit_file", path="app.py", old_text="y = 2", new_text="y = 3")
    assert not result["is_error"]
    assert (workspace / "app.py").read_bytes() == b"x = 1\r\ny = 3\r\n"


@pytest.mark.parametrize("stage", TOOL_STAGES)
@pytest.mark.parametrize(("old_text", "said"), [
    ("z = 9", "not found"),
    ("= 1", "occurs 2 times"),
    ("", "old_text is empty"),
])
def test_edit_file_refuses_a_missing_ambiguous_or_empty_match(stage, old_text, said, scripted, workspace):
    """old_text must occur exactly once; a refused edit says why and leaves the file untouched."""
    (workspace / "app.py").write_text("x = 1\ny = 1\n")
    result = call_tool(stage, scripted, "edit_file", path="app.py", old_text=old_text, new_text="changed")
    assert result["is_error"] and said in result["content"]
    assert (workspace / "app.py").read_text() == "x = 1\ny = 1\n"


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_edit_file_refuses_a_file_too_big_to_hold_in_memory(stage, scripted, workspace, monkeypatch):
    """edit_file holds the file twice in memory (before and after): one over MAX_EDIT is refused,
    untouched, with a way out, so a huge file cannot exhaust the agent."""
    monkeypatch.setattr(stage, "MAX_EDIT", 1000)
    (workspace / "big.log").write_text("x = 1\n" * 200)
    result = call_tool(stage, scripted, "edit_file", path="big.log", old_text="x = 1\nx", new_text="y")
    assert result["is_error"] and "sed" in result["content"]
    assert (workspace / "big.log").read_text() == "x = 1\n" * 200


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_list_dir_lists_sorted_entries_with_folders_marked(stage, scripted, workspace):
    """list_dir shows a folder's entries in order, folders ending in '/'; no path means the workspace."""
    (workspace / "src").mkdir()
    (workspace / "b.txt").write_text("")
    (workspace / "a.txt").write_text("")
    assert call_tool(stage, scripted, "list_dir")["content"] == "a.txt\nb.txt\nsrc/"


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_list_dir_of_an_empty_folder_says_so(stage, scripted, workspace):
    """An empty folder is "(empty folder)", not an empty string the model may misread."""
    (workspace / "empty").mkdir()
    assert call_tool(stage, scripted, "list_dir", path="empty")["content"] == "(empty folder)"


# -- special files, big files, safe writes ------------------------------------------------


@pytest.fixture
def fails_if_blocked():
    """Opening a FIFO can wait forever. An alarm after 5 seconds interrupts the wait, so a tool
    that blocks makes the test fail (with a TimeoutError result) instead of hanging it."""
    def give_up(signum, frame):
        raise TimeoutError("the tool blocked for 5 seconds")
    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


WRONG_KINDS = {
    "read a FIFO": ("read_file", {"path": "pipe"}, "pipe is a FIFO (named pipe), not a regular file"),
    "write a FIFO": ("write_file", {"path": "pipe", "content": "x"}, "pipe is a FIFO (named pipe), not a regular file"),
    "edit a FIFO": ("edit_file", {"path": "pipe", "old_text": "a", "new_text": "b"}, "pipe is a FIFO"),
    "list a FIFO": ("list_dir", {"path": "pipe"}, "pipe is a FIFO (named pipe), not a folder"),
    "read a folder": ("read_file", {"path": "src"}, "src is a folder, not a regular file"),
    "list a file": ("list_dir", {"path": "a.txt"}, "a.txt is a regular file, not a folder"),
}


@pytest.mark.parametrize("stage", TOOL_STAGES)
@pytest.mark.parametrize(("name", "tool_input", "said"), WRONG_KINDS.values(), ids=WRONG_KINDS.keys())
def test_file_tools_refuse_the_wrong_kind_of_file_before_opening_it(stage, name, tool_input, said, scripted,
                                                                     workspace, fails_if_blocked):
    """A FIFO (`mkfifo pipe`) is not a file: opening it waits for a writer that never comes. Each
    tool looks at what a path is first, and says what it found; the FIFO stays as it was."""
    os.mkfifo(workspace / "pipe")
    (workspace / "src").mkdir()
    (workspace / "a.txt").write_text("a")
    result = call_tool(stage, scripted, name, **tool_input)
    assert result["is_error"] and said in result["content"]
    assert stat.S_ISFIFO(os.stat(workspace / "pipe").st_mode)


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_read_file_refuses_a_device(stage, scripted, workspace):
    """A link to a device is refused: /dev/zero would be read until memory runs out (/dev/null
    stands in for it here). From s03 on, safe_path already refuses it as outside the workspace."""
    (workspace / "zero").symlink_to("/dev/null")
    result = call_tool(stage, scripted, "read_file", path="zero")
    said = "outside the workspace" if hasattr(stage, "safe_path") else "zero is a character device"
    assert result["is_error"] and said in result["content"]


@pytest.mark.parametrize("stage", TOOL_STAGES)
@pytest.mark.parametrize("limit", [5, None])
def test_read_file_reads_only_what_it_can_show(stage, limit, scripted, workspace):
    """A 300 MB log (sparse here: it costs no disk) is not read whole: with or without `limit`,
    memory stays far below the file's size, and the result says how much was not shown."""
    with open(workspace / "big.log", "wb") as log:
        log.write(b"".join(b"line %d\n" % n for n in range(1, 11)))
        log.truncate(300 * 2**20)  # the rest reads as NUL bytes
    tracemalloc.start()
    try:
        content = call_tool(stage, scripted, "read_file", path="big.log", limit=limit)["content"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20
    if limit:
        assert content == "line 1\nline 2\nline 3\nline 4\nline 5\n" f"... [{300 * 2**20 - 35} more bytes not shown]"
    else:  # the first MAX_OUTPUT characters hold NUL bytes: it is binary, and says its full size
        assert "binary or non-UTF-8 file (314,572,800 bytes)" in content


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_read_file_keeps_a_character_split_at_a_read_boundary(stage, scripted, workspace):
    """A file is read in pieces, and a piece can end inside a two-byte character such as é.
    The character is completed by the next piece: the file is still text, not "non-UTF-8"."""
    (workspace / "accents.txt").write_text("a" + "é" * (stage.MAX_OUTPUT + 10), encoding="utf-8")
    content = call_tool(stage, scripted, "read_file", path="accents.txt")["content"]
    assert content == "a" + "é" * (stage.MAX_OUTPUT - 1) + "\n... [22 more bytes not shown]"  # 11 é left


@pytest.mark.parametrize("stage", TOOL_STAGES)
@pytest.mark.parametrize(("name", "tool_input"), [
    ("write_file", {"path": "a.txt", "content": "bad \ud800"}),
    ("edit_file", {"path": "a.txt", "old_text": "old", "new_text": "bad \ud800"}),
])
def test_a_failed_write_leaves_the_old_content(stage, name, tool_input, scripted, workspace):
    """A lone surrogate cannot be written as UTF-8, so the write fails halfway. The new text goes
    to a temporary file first, so the old file is untouched, and the temporary file is removed."""
    (workspace / "a.txt").write_text("old content\n")
    result = call_tool(stage, scripted, name, **tool_input)
    assert result["is_error"] and "UnicodeEncodeError" in result["content"]
    assert (workspace / "a.txt").read_text() == "old content\n"
    assert os.listdir(workspace) == ["a.txt"]


@pytest.mark.parametrize("stage", TOOL_STAGES)
@pytest.mark.parametrize(("name", "tool_input"), [
    ("write_file", {"path": "link.txt", "content": "changed"}),
    ("edit_file", {"path": "link.txt", "old_text": "secret", "new_text": "changed"}),
])
def test_a_write_does_not_go_through_a_hard_link(stage, name, tool_input, scripted, workspace, tmp_path_factory):
    """A hard link is a second name for the same file, here one outside the workspace. A write
    gives the workspace name a new file of its own, so the outside file keeps its content."""
    outside = tmp_path_factory.mktemp("outside") / "victim.txt"
    outside.write_text("secret")
    os.link(outside, workspace / "link.txt")
    assert not call_tool(stage, scripted, name, **tool_input)["is_error"]
    assert (workspace / "link.txt").read_text() == "changed" and outside.read_text() == "secret"


@pytest.mark.parametrize("stage", TOOL_STAGES)
@pytest.mark.parametrize(("name", "tool_input"), [
    ("write_file", {"path": "run.sh", "content": "echo new\n"}),
    ("edit_file", {"path": "run.sh", "old_text": "old", "new_text": "new"}),
])
def test_a_write_keeps_the_permission_bits(stage, name, tool_input, scripted, workspace):
    """The replacing file gets the old one's permissions, so a script stays executable; a new
    file gets the same permissions as any other new file."""
    (workspace / "run.sh").write_text("echo old\n")
    (workspace / "run.sh").chmod(0o750)
    assert not call_tool(stage, scripted, name, **tool_input)["is_error"]
    assert stat.S_IMODE((workspace / "run.sh").stat().st_mode) == 0o750
    (workspace / "usual.txt").touch()
    assert not call_tool(stage, scripted, "write_file", path="new.txt", content="x")["is_error"]
    assert (workspace / "new.txt").stat().st_mode == (workspace / "usual.txt").stat().st_mode


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_write_file_through_a_symlink_changes_the_file_it_points_to(stage, scripted, workspace):
    """Writing to a symlink writes the file it points to, as open() would; the link stays a link."""
    (workspace / "real.txt").write_text("old")
    (workspace / "alias.txt").symlink_to("real.txt")
    assert not call_tool(stage, scripted, "write_file", path="alias.txt", content="new")["is_error"]
    assert (workspace / "alias.txt").is_symlink() and (workspace / "real.txt").read_text() == "new"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any file")
@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_a_write_refuses_a_read_only_file(stage, scripted, workspace):
    """Replacing a file needs only a writable folder, yet a read-only file stays read-only."""
    (workspace / "locked.txt").write_text("old")
    (workspace / "locked.txt").chmod(0o444)
    result = call_tool(stage, scripted, "write_file", path="locked.txt", content="new")
    assert result["is_error"] and "read-only" in result["content"]
    assert (workspace / "locked.txt").read_text() == "old"


@pytest.mark.parametrize("stage", TOOL_STAGES)
def test_a_file_name_that_is_not_utf8_is_listed_with_a_replacement_character(stage, scripted, workspace):
    """A file named with bytes that are not UTF-8 (from another system's disk) is listed with the
    replacement character; the real SDK could not send the name as Python reads it."""
    (workspace / os.fsdecode(b"caf\xe9.txt")).write_text("")
    with FakeAPI([reply(tool("list_dir")), reply("one file")]) as api:
        scripted(stage, None, client=api.client())
        messages = []
        stage.run_turn(messages, "what is here?")
    assert len(api.requests) == 2, "the listing could not be sent back to the model"
    assert api.requests[1]["messages"][-1]["content"][0]["content"] == "caf\ufffd.txt" and len(messages) == 4
