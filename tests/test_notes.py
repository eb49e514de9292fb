"""The notes are part of the course: what they name must exist, so a reader never follows a dead end."""

import ast
import functools
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT, STAGE_NAMES, clean_env

NOTES = sorted((ROOT / "notes").glob("*.md"))
DOCUMENTS = [*NOTES, ROOT / "README.md"]
STAGE_NOTES = [ROOT / "notes" / f"{stage}.md" for stage in STAGE_NAMES]
REFERENCE = ROOT / "notes" / "reference.md"  # the machinery, the messages, the settings: not required


def document_id(path) -> str:
    return path.name if path.parent == ROOT else f"notes/{path.name}"


# A ```sh block holding one `python tests/...` command, then a ```text block: what that command prints.
SHOWN_OUTPUT = re.compile(r"^```sh\n(python tests/[^\n]+)\n```\n\n```text\n(.*?)^```", re.MULTILINE | re.DOTALL)


def defined_tests(path) -> set:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


ALL_TESTS = set().union(*(defined_tests(path) for path in (ROOT / "tests").glob("test_*.py")))


def top_level_names(stage: str) -> set:
    tree = ast.parse((ROOT / f"{stage}.py").read_text())
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return names | {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Name)}


def test_there_is_a_note_per_stage_and_a_course_map():
    """notes/README.md plus one note for each stage, named after its script, and one reference note."""
    expected = {"README.md", REFERENCE.name, *(f"{stage}.md" for stage in STAGE_NAMES)}
    assert {path.name for path in NOTES} == expected


def heading_anchor(heading: str) -> str:
    """The anchor a Markdown viewer such as GitHub gives a heading: lower case, spaces to hyphens,
    punctuation dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("document", DOCUMENTS, ids=document_id)
def test_every_link_a_document_makes_leads_somewhere(document):
    """A relative link names a file that exists, and its #anchor, a heading of that file."""
    without_blocks = re.sub(r"^```.*?^```", "", document.read_text(), flags=re.MULTILINE | re.DOTALL)
    prose = re.sub(r"`[^`\n]*`", "", without_blocks)  # code is not a link: TOOL_HANDLERS[name](**input)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+:", target):
            continue  # a web address: not checked here
        path, _, anchor = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        assert file.exists(), f"{target}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", file.read_text(), re.MULTILINE)
            assert anchor in {heading_anchor(h) for h in headings}, f"{target}: no such heading"


@pytest.mark.parametrize("document", DOCUMENTS, ids=document_id)
def test_every_test_and_test_file_a_document_names_exists(document):
    """A note that says "run test_x" or "add to tests/test_y.py" points at something real."""
    text = document.read_text()
    files = set(re.findall(r"tests/[a-z0-9_]+\.py", text))
    assert not [f for f in files if not (ROOT / f).exists()]
    stems = {f.removeprefix("tests/").removesuffix(".py") for f in files}
    named_tests = set(re.findall(r"\btest_[a-z0-9_]+\b", text)) - stems
    assert not named_tests - ALL_TESTS, f"no such tests: {sorted(named_tests - ALL_TESTS)}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=document_id)
def test_every_pytest_selection_a_document_shows_selects_tests(document):
    """`pytest tests/test_x.py -k words` in a note selects at least one test for each word."""
    for file, expression in re.findall(r"pytest (tests/[a-z0-9_]+\.py) -k (\"[^\"]+\"|\S+)", document.read_text()):
        names = defined_tests(ROOT / file)
        for word in expression.strip('"').split(" or "):
            assert any(word in name for name in names), f"-k {word} selects nothing in {file}"


def test_every_name_the_reference_note_shows_in_bold_code_exists_in_a_stage():
    """The reference note walks through the machinery of every stage: each name it puts in bold
    code is defined in one of them."""
    mentioned = set(re.findall(r"\*\*`([A-Za-z_][A-Za-z0-9_]*)[^`]*`\*\*", REFERENCE.read_text()))
    defined = set().union(*(top_level_names(stage) for stage in STAGE_NAMES))
    assert mentioned, "the reference note names no code"
    assert not mentioned - defined, f"in no stage: {sorted(mentioned - defined)}"


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_every_function_a_note_walks_through_exists_in_its_stage(stage):
    """The code walk-through names functions and constants in bold code: each is in the script."""
    text = (ROOT / "notes" / f"{stage}.md").read_text()
    mentioned = set(re.findall(r"\*\*`([A-Za-z_][A-Za-z0-9_]*)[^`]*`\*\*", text))  # **`name(args)`**
    assert mentioned, "the walk-through names no code"
    assert not mentioned - top_level_names(stage), f"not in {stage}.py: {sorted(mentioned - top_level_names(stage))}"


@pytest.mark.parametrize("note", STAGE_NOTES, ids=lambda path: path.name)
def test_each_note_has_three_to_five_exercises_that_name_a_test_file(note):
    """Exercises are "break it" or "extend it", and each says which test file to run or add to. A
    line before them names the pair for a first pass: one break-it, then one extend-it."""
    exercises = note.read_text().split("## Exercises")[1].split("\n## ")[0]
    lead, *items = re.split(r"\n(?=\d\. )", exercises.strip())
    assert 3 <= len(items) <= 5
    for item in items:
        assert re.match(r"\d\. \*\*(Break|Extend) it", item), item[:60]
        assert "tests/" in item, item[:60]
    pair = re.fullmatch(r"On a first pass, do (\d) and (\d); the others are for later\.", lead.strip())
    assert pair, lead
    kinds = [re.match(r"\d\. \*\*(\w+)", items[int(number) - 1])[1] for number in pair.groups()]
    assert kinds == ["Break", "Extend"]


@pytest.mark.parametrize("note", STAGE_NOTES, ids=lambda path: path.name)
def test_each_note_has_the_sections_a_reader_expects(note):
    """The lesson first: problem, idea (with a diagram), code, then the exercises; then what changed (with
    the diff command), try it, limits."""
    text = note.read_text()
    lesson = ("## The problem", "## The idea", "## The code", "## Exercises")
    for heading in (*lesson, "## What changed", "## Try it", "## Known limits"):
        assert heading in text
    assert [text.index(heading) for heading in lesson] == sorted(text.index(heading) for heading in lesson)
    assert text.index("## Exercises") < min(text.index(h) for h in ("## What changed", "## Try it", "## Known limits"))
    assert "```" in text.split("## The idea")[1].split("## The code")[0]
    if note.stem != STAGE_NAMES[0]:
        previous = STAGE_NAMES[STAGE_NAMES.index(note.stem) - 1]
        assert f"diff -u {previous}.py {note.stem}.py" in text


def as_compared(line: str) -> str:
    """A line of output without colours, trailing spaces or timings (those change from run to run)."""
    return re.sub(r"\b\d+\.\d+s\b", "N.Ns", re.sub(r"\x1b\[[0-9;]*m", "", line)).rstrip()


@functools.cache
def printed(command: str) -> list:
    """The lines a documented command prints, run once. The scripted model's token estimates include
    the workspace's path, so the temporary folder is the default one, as on a learner's machine."""
    env = {name: value for name, value in clean_env().items() if name not in ("TMPDIR", "TEMP", "TMP")}
    done = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, f"`{command}` failed: {done.stderr[-2000:]}"
    return [as_compared(line) for line in done.stdout.splitlines()]


@pytest.mark.slow  # runs each documented command as a process: seconds each (-m "" runs it)
@pytest.mark.parametrize("document", DOCUMENTS, ids=document_id)
def test_the_output_a_document_shows_is_what_its_command_prints(document):
    """A ```text block right after a ```sh command shows that command's output, figures included: each of its
    lines is printed, in that order. Lines may be left out; a line ending in `...` is cut short there."""
    for command, shown in SHOWN_OUTPUT.findall(document.read_text()):
        output = iter(printed(command))
        for line in map(as_compared, shown.splitlines()):
            if line.strip() != "...":
                start = line.removesuffix("...")
                assert any(out == line or (line.endswith("...") and out.startswith(start)) for out in output), (
                    f"`{command}` no longer prints this line, or not in this order:\n{line}")
