"""Every exercise in the notes does what its note says, on a copy of the project.

A "break it" exercise: with the note's change applied, its test command fails with a test failure
(not an error) that shows the text after `It fails with:`. (That the command passes on the project
as it is, the normal run of those same tests proves, so it is not run again here.)
An "extend it" exercise: with its reference solution from tests/solutions/ applied, the commands
under "Check it" pass, and they run the new test the learner is asked to write.
The formats are described in notes/reference.md; tests/solutions/README.md describes the solutions.
These checks start pytest again for each exercise, so they are marked slow: CI runs them."""

import re
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, STAGE_NAMES, clean_env

NOTES = {stage: ROOT / "notes" / f"{stage}.md" for stage in STAGE_NAMES}
FENCE = re.compile(r"^([ \t]*)```(\w+)\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
FAILS_WITH = re.compile(r"^[ \t]*It fails with: `([^`]+)`", re.MULTILINE)
SOLUTION = re.compile(r"`(tests/solutions/[a-z0-9_]+\.diff)`")
COPIED = ["s0*.py", "pyproject.toml", "README.md"]  # plus the folders tests/ and notes/


def exercise_items(note) -> dict:
    """The numbered items of a note's Exercises section (up to the next heading): number -> text."""
    section = note.read_text().split("## Exercises", 1)[-1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d+\. )", "\n" + section)
    return {int(item.split(".", 1)[0]): item for item in items if re.match(r"\d+\. ", item)}


def kind_of(item: str) -> str:
    """"break" or "extend", from the item's first line (**Break it: ...**, **Extend it: ...**)."""
    first_line = item.split("\n", 1)[0]
    return "break" if "**Break it" in first_line else "extend" if "**Extend it" in first_line else ""


def code_blocks(item: str) -> list:
    """The fenced blocks of an item, as (language, text) with the item's indentation taken off."""
    return [(language, "".join(line.removeprefix(indent) for line in body.splitlines(keepends=True)))
            for indent, language, body in FENCE.findall(item)]


def parse_break_it(item: str) -> dict:
    """A break-it item's change, command and failure text, or {"problem": why it does not follow the format}."""
    blocks = code_blocks(item)
    languages = [language for language, _ in blocks]
    if "diff" not in languages or "sh" not in languages[languages.index("diff"):]:
        return {"problem": "it needs a ```diff block followed by a ```sh block"}
    diff = blocks[languages.index("diff")][1].splitlines()
    command = blocks[languages.index("sh", languages.index("diff"))][1].strip()
    if not diff or not diff[0].startswith("--- ") or any(line[:1] not in "-+" or not line for line in diff[1:]):
        return {"problem": "the diff must start with `--- <stage file>` and hold only `-` and `+` lines"}
    removed = [line[1:] for line in diff[1:] if line.startswith("-")]
    added = [line[1:] for line in diff[1:] if line.startswith("+")]
    if not removed or not command.startswith("python -m pytest ") or "\n" in command:
        return {"problem": "it needs at least one `-` line and one command `python -m pytest ...`"}
    fails_with = FAILS_WITH.search(item)
    if not fails_with:
        return {"problem": "it needs a line `It fails with: `...``, the text the failure shows"}
    return {"file": diff[0][4:].strip(), "removed": removed, "added": added, "command": command,
            "fails_with": fails_with.group(1)}


def parse_extend_it(item: str) -> dict:
    """An extend-it item's reference solution and check commands, or {"problem": ...}."""
    solution = SOLUTION.search(item)
    if "Check it" not in item or not solution:
        return {"problem": "it needs a `Check it` paragraph naming a `tests/solutions/....diff`"}
    checks = [text for language, text in code_blocks(item.split("Check it", 1)[1]) if language == "sh"]
    commands = checks[0].strip().splitlines() if checks else []
    if not commands or not all(command.startswith("python -m pytest ") for command in commands):
        return {"problem": "after `Check it` it needs a ```sh block of `python -m pytest ...` lines"}
    return {"solution": solution.group(1), "commands": commands}


def exercises(kind: str, parse) -> list:
    params = []
    for stage, note in NOTES.items():
        for number, item in exercise_items(note).items():
            if kind_of(item) == kind:
                params.append(pytest.param(note.name, number, parse(item), id=f"{stage[:3]}-{number}"))
    return params


def copy_project(folder):
    """A copy of the stages, tests, notes and settings, without caches."""
    folder.mkdir()
    for pattern in COPIED:
        for path in ROOT.glob(pattern):
            shutil.copy2(path, folder / path.name)
    for name in ("tests", "notes"):
        shutil.copytree(ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__", ".*cache"))
    return folder


def replace_once(file, where: str, old: list, new: list) -> None:
    """Replace the lines `old`, which must occur exactly once and together in `file`, by `new`."""
    assert file.is_file(), f"{where}: no file {file.name}"
    text = "\n" + file.read_text()
    old_text, new_text = ("".join(f"\n{line}" for line in lines) for lines in (old, new))
    found = text.count(old_text + "\n")
    assert found == 1, f"{where}: these lines occur {found} times in {file.name}, not once:{old_text}"
    file.write_text(text.replace(old_text + "\n", new_text + "\n", 1)[1:])


def hunks(diff: str) -> list:
    """A unified diff (`git diff`) as (file, old lines, new lines), one per hunk. The line numbers
    after `@@` are not used: each hunk is found by its text, so code moved in the file is still found."""
    found, file, in_header = [], None, False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            in_header = True
        elif in_header and line.startswith("+++ "):
            file = line[4:].removeprefix("b/")
        elif line.startswith("@@"):
            in_header = False
            found.append((file, [], []))
        elif found and not in_header and line[:1] in (" ", "-", "+", ""):
            line = line or " "  # an empty line of context whose space an editor took off
            old, new = found[-1][1], found[-1][2]
            if line[:1] in " -":
                old.append(line[1:])
            if line[:1] in " +":
                new.append(line[1:])
    return found


def apply_solution(folder, where: str, solution: str, tests_only: bool = False) -> tuple:
    """Apply a reference solution (or only its changes to test files) to a copy; return the test
    files it changes and the tests it adds."""
    diff = (ROOT / solution).read_text()
    assert "new file mode" not in diff, f"{where}: a solution changes files, it creates none"
    for file, old, new in hunks(diff):
        if file.startswith("tests/test_") or not tests_only:
            replace_once(folder / file, f"{where}, {solution}", old, new)
    test_files = {file for file, _, _ in hunks(diff) if re.fullmatch(r"tests/test_\w+\.py", file)}
    return test_files, re.findall(r"^\+def (test_\w+)\(", diff, re.MULTILINE)


def start_command(folder, command: str, *options: str) -> subprocess.Popen:
    """Start a note's pytest command in a copy: quietly, no cache, no plugins from elsewhere, no key."""
    argv = [sys.executable, *shlex.split(command)[1:], "-q", "-p", "no:cacheprovider", *options]
    return subprocess.Popen(argv, cwd=folder, env=clean_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(run: subprocess.Popen) -> tuple:
    """Wait for a started command; return its exit code, its last line (pytest's summary) and its output."""
    try:
        output = run.communicate(timeout=300)[0]
    finally:
        run.kill()
    lines = output.strip().splitlines() or [""]
    return run.returncode, lines[-1], output


@pytest.mark.slow
@pytest.mark.parametrize(("note", "number", "exercise"), exercises("break", parse_break_it))
def test_break_it_exercise_fails_once_broken_for_the_reason_given(note, number, exercise, tmp_path):
    """With the note's change made, the exercise's command fails with a test failure that shows the
    text after `It fails with:`."""
    where = f"notes/{note}, exercise {number}"
    assert "problem" not in exercise, f"{where}: {exercise.get('problem')}"
    broken = copy_project(tmp_path / "broken")
    replace_once(broken / exercise["file"], where, exercise["removed"], exercise["added"])
    code, result, output = finish(start_command(broken, exercise["command"]))
    assert code == 1 and " failed" in result and " error" not in result, (
        f"{where}: after the change, `{exercise['command']}` must fail with test failures, "
        f"not errors (exit code {code}): {result}\n{output[-3000:]}")
    assert exercise["fails_with"] in output, (
        f"{where}: the failure does not show `{exercise['fails_with']}`:\n{output[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize(("note", "number", "exercise"), exercises("extend", parse_extend_it))
def test_extend_it_exercise_passes_its_checks_with_the_reference_solution(note, number, exercise, tmp_path):
    """With the reference solution applied, every command under "Check it" passes, on every stage
    (slow tests too), and the commands run every test file the solution changes, and the tests it
    adds. Those new tests fail when only the solution's tests are applied, without the feature."""
    where = f"notes/{note}, exercise {number}"
    assert "problem" not in exercise, f"{where}: {exercise.get('problem')}"
    extended = copy_project(tmp_path / "extended")
    test_files, new_tests = apply_solution(extended, where, exercise["solution"])
    assert test_files, f"{where}: {exercise['solution']} adds no test"
    not_checked = [file for file in test_files if not any(file in command for command in exercise["commands"])]
    assert not not_checked, f"{where}: the solution changes {not_checked}, which the checks do not run"
    passed_lines = []
    for command in exercise["commands"]:
        code, result, output = finish(start_command(extended, command, "-m", "", "-rA"))
        assert code == 0, f"{where}: with {exercise['solution']}, `{command}` fails: {result}\n{output[-3000:]}"
        passed_lines += [line for line in output.splitlines() if line.startswith("PASSED ")]
    not_run = [name for name in new_tests if not any(f"::{name}" in line for line in passed_lines)]
    assert not not_run, f"{where}: the checks do not run the solution's new tests {not_run}"
    if new_tests:  # a test must be able to fail: without the feature, each new test fails
        apply_solution(copy_project(tmp_path / "tests_only"), where, exercise["solution"], tests_only=True)
        selection = f"python -m pytest {' '.join(sorted(test_files))} -k '{' or '.join(new_tests)}'"
        code, result, output = finish(start_command(tmp_path / "tests_only", selection, "-m", "", "-rA"))
        passed_lines = [line for line in output.splitlines() if line.startswith("PASSED ")]
        passing = [name for name in new_tests if any(f"::{name}" in line for line in passed_lines)]
        assert code == 1 and not passing, f"{where}: without the feature, {passing or result} passes"


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_each_note_has_at_least_three_break_it_exercises_in_the_checked_format(stage):
    """A break-it exercise that is not in the format would never be checked; each note has three or more."""
    items = {number: item for number, item in exercise_items(NOTES[stage]).items() if kind_of(item) == "break"}
    problems = {number: parse_break_it(item).get("problem") for number, item in items.items()}
    assert not any(problems.values()), f"notes/{stage}.md: {problems}"
    assert len(items) >= 3, f"notes/{stage}.md has {len(items)} break-it exercises"


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_each_extend_it_exercise_has_checks_and_a_reference_solution_that_exists(stage):
    """An extend-it exercise says how to check it and names its solution, so both can be run."""
    items = {number: item for number, item in exercise_items(NOTES[stage]).items() if kind_of(item) == "extend"}
    problems = {number: parse_extend_it(item).get("problem") for number, item in items.items()}
    assert not any(problems.values()), f"notes/{stage}.md: {problems}"
    missing = [parse_extend_it(item)["solution"] for item in items.values()
               if not (ROOT / parse_extend_it(item)["solution"]).is_file()]
    assert not missing, f"notes/{stage}.md names solutions that do not exist: {missing}"
