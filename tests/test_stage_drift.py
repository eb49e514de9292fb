"""The stages are copies of each other plus one lesson each. This keeps the copies honest:
whatever consecutive stages share is identical, except what the later stage's lesson changes."""

import ast
import functools
import itertools

import pytest
from conftest import ROOT, STAGE_NAMES

# What each stage changes in code it shares with the stage before it. New definitions are
# not listed: they are the lesson itself. Keep this exact: the tests fail on a missing or extra name.
CHANGED = {
    "s02_tools": {"STAGE", "TOOLS", "dispatch"},
    # every file tool now goes through safe_path and the wall's doors; bash is checked, walled and hardened;
    # the system prompt says whether the network is on; main says what the wall holds and reads
    # two more SETTINGS
    "s03_safety": {"STAGE", "system_prompt", "run_bash", "read_file", "write_file", "edit_file", "list_dir",
                   "main", "SETTINGS"},
    # the loop's pieces take the tools, the system prompt and the cap as arguments, so parent and
    # child share them (agent_loop's defaults are the parent's: run_turn is s03's); dispatch hands
    # a task call's id to run_subagent (its transcript lines name it)
    "s04_subagent": {"STAGE", "system_prompt", "dispatch", "run_tool", "call_model", "take_reply",
                     "agent_loop"},
}

PAIRS = list(itertools.pairwise(STAGE_NAMES))


@functools.cache
def definitions(stage: str) -> dict:
    """Top-level functions, classes and simple assignments of a stage: name -> source text."""
    source = (ROOT / f"{stage}.py").read_text()
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body:
        text = "\n".join(lines[node.lineno - 1:node.end_lineno])  # top-level: whole lines
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = text
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = text
    return found


def drifted(earlier: str, later: str) -> set:
    before, after = definitions(earlier), definitions(later)
    return {name for name in before.keys() & after.keys() if before[name] != after[name]}


@pytest.mark.parametrize(("earlier", "later"), PAIRS)
def test_shared_code_is_copied_verbatim(earlier, later):
    """Code a stage shares with the previous one is identical, unless the stage's lesson changes it.
    If this fails, either carry your fix into every later stage, or list the change in CHANGED."""
    unexplained = drifted(earlier, later) - CHANGED.get(later, set())
    assert not unexplained, f"{later} changes {sorted(unexplained)} from {earlier} without saying so"


@pytest.mark.parametrize(("earlier", "later"), PAIRS)
def test_changes_listed_for_a_stage_are_real(earlier, later):
    """Every name listed in CHANGED really differs, so the list is a true summary of the lesson."""
    stale = CHANGED.get(later, set()) - drifted(earlier, later)
    assert not stale, f"CHANGED lists {sorted(stale)} for {later}, but they are the same as in {earlier}"


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_no_stage_imports_another(stage):
    """Each stage runs alone: it may import the standard library and the requirements, never a stage."""
    tree = ast.parse((ROOT / f"{stage}.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & set(STAGE_NAMES)


FIRST_FUNCTION = {"s01_loop": "agent_loop", "s02_tools": "dispatch", "s03_safety": "safe_path",
                  "s04_subagent": "run_subagent"}


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_each_stage_opens_with_its_new_idea(stage):
    """Read top to bottom, a stage shows its own lesson first: its first function is the new idea,
    and it starts within the first third of the file (what earlier stages built comes after)."""
    source = (ROOT / f"{stage}.py").read_text()
    functions = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]
    assert functions[0].name == FIRST_FUNCTION[stage]
    assert functions[0].lineno < len(source.splitlines()) / 3
