"""Every "break it" exercise in the notes works as the note says: on a copy of the project, its test
command passes; with the note's change applied, the same command fails with a test failure (not an
error) and, when the note says what the failure shows (`It fails with: ...`), shows that text.
The format is described in notes/README.md, "How a break-it exercise is written"."""

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
COPIED = ["s0*.py", "pyproject.toml", "README.md"]  # plus the folders tests/ and notes/


def exercise_items(note) -> dict:
    """The numbered items of a note's Exercises section: number -> text."""
    section = note.read_text().split("## Exercises", 1)[-1]
    items = re.split(r"\n(?=\d+\. )", "\n" + section)
    return {int(item.split(".", 1)[0]): item for item in items if re.match(r"\d+\. ", item)}


def parse_break_it(item: str) -> dict:
    """A break-it item's change and command, or {"problem": why it does not follow the format}."""
    blocks = [(language, "".join(line.removeprefix(indent) for line in body.splitlines(keepends=True)))
              for indent, language, body in FENCE.findall(item)]
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
    return {"file": diff[0][4:].strip(), "removed": removed, "added": added, "command": command,
            "fails_with": fails_with and fails_with.group(1)}


def break_it_exercises() -> list:
    params = []
    for stage, note in NOTES.items():
        for number, item in exercise_items(note).items():
            if "**Break it" in item.split("\n", 1)[0] and "```diff" in item:
                params.append(pytest.param(note.name, number, parse_break_it(item), id=f"{stage[:3]}-{number}"))
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


def apply_change(folder, where: str, exercise: dict) -> None:
    """Replace the `-` lines, which must occur exactly once and together, by the `+` lines."""
    stage_file = folder / exercise["file"]
    assert stage_file.is_file(), f"{where}: no stage file {exercise['file']}"
    text = "\n" + stage_file.read_text()
    old, new = ("".join(f"\n{line}" for line in exercise[key]) for key in ("removed", "added"))
    found = text.count(old + "\n")
    assert found == 1, f"{where}: the `-` lines occur {found} times in {exercise['file']}, not once:{old}"
    stage_file.write_text(text.replace(old + "\n", new + "\n")[1:])


def start_command(folder, command: str) -> subprocess.Popen:
    """Start the note's pytest command in a copy: quietly, no cache, no plugins from elsewhere, no key."""
    argv = [sys.executable, *shlex.split(command)[1:], "-q", "-p", "no:cacheprovider"]
    return subprocess.Popen(argv, cwd=folder, env=clean_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(run: subprocess.Popen) -> tuple:
    """Wait for a started command; return its exit code, its last line (pytest's summary) and its output."""
    try:
        output = run.communicate(timeout=120)[0]
    finally:
        run.kill()
    lines = output.strip().splitlines() or [""]
    return run.returncode, lines[-1], output


@pytest.mark.parametrize(("note", "number", "exercise"), break_it_exercises())
def test_break_it_exercise_passes_as_written_and_fails_once_broken(note, number, exercise, tmp_path):
    """The exercise's command passes on the project; with the change applied it fails for the reason given."""
    where = f"notes/{note}, exercise {number}"
    assert "problem" not in exercise, f"{where}: {exercise.get('problem')}"
    broken = copy_project(tmp_path / "broken")
    apply_change(broken, where, exercise)
    as_is = start_command(copy_project(tmp_path / "as_is"), exercise["command"])
    code, result, output = finish(start_command(broken, exercise["command"]))  # the two runs overlap
    before, before_result, _ = finish(as_is)
    assert before == 0, f"{where}: `{exercise['command']}` fails before the change: {before_result}"
    assert code == 1 and " failed" in result and " error" not in result, (
        f"{where}: after the change, `{exercise['command']}` must fail with test failures, "
        f"not errors (exit code {code}): {result}\n{output[-3000:]}")
    if exercise["fails_with"]:
        assert exercise["fails_with"] in output, f"{where}: the failure does not show `{exercise['fails_with']}`:\n{output[-3000:]}"


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_each_note_has_at_least_three_break_it_exercises_in_the_checked_format(stage):
    """A break-it exercise that is not in the format would never be checked; each note has three or more."""
    items = {number: item for number, item in exercise_items(NOTES[stage]).items()
             if "**Break it" in item.split("\n", 1)[0]}
    problems = {number: parse_break_it(item).get("problem") for number, item in items.items()}
    assert not any(problems.values()), f"notes/{stage}.md: {problems}"
    assert len(items) >= 3, f"notes/{stage}.md has {len(items)} break-it exercises"
