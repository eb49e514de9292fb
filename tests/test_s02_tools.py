"""Stage 2: a tool set dispatched by name. Later stages keep these promises, so tests run on them too."""

import pytest
from conftest import call_tool, stages_from

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
    """`limit` keeps the first N lines and says how many more there are."""
    (workspace / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    content = call_tool(stage, scripted, "read_file", path="long.txt", limit=3)["content"]
    assert content.startswith("line 1\nline 2\nline 3\n") and "line 4" not in content
    assert "7 more lines" in content


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
    assert len(content) < stage.MAX_OUTPUT + 200 and "5000 more characters cut" in content


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
