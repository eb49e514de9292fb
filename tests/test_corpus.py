"""The reference corpus (tests/corpus/): cases collected from other projects' test suites, so the
filter is measured on cases it was not written from. Core cases must all be judged as expected; the
evasion, obfuscated and debatable tiers show the limits, and their scores are pinned here, so a change to
the filter that moves one shows."""

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import stages_from

CORPUS = Path(__file__).parent / "corpus"
COMMANDS = json.loads((CORPUS / "commands.json").read_text())
PATHS = json.loads((CORPUS / "paths.json").read_text())
SAFE_STAGES = stages_from("s03_safety")
# The filter's scores on the tiers no filter can get fully right: (judged as expected, cases).
HARD_TIER_SCORES = {"evasion": (30, 37), "obfuscated": (0, 5), "debatable": (9, 11)}


def verdict(stage, command: str) -> str:
    return "block" if stage.check_command(command) else "allow"


def scores(stage) -> dict:
    """tier -> (cases judged as expected, cases)."""
    right, total = Counter(), Counter()
    for case in COMMANDS:
        right[case["tier"]] += verdict(stage, case["cmd"]) == case["expect"]
        total[case["tier"]] += 1
    return {tier: (right[tier], total[tier]) for tier in total}


@pytest.mark.parametrize("stage", SAFE_STAGES)
@pytest.mark.parametrize("case", [c for c in COMMANDS if c["tier"] == "core"],
                         ids=lambda case: f"{case['tier']}-{case['expect']}: {case['cmd']!r}")
def test_corpus_core_commands_are_all_judged_as_expected(stage, case, project):
    """Every dangerous command of the core tier is refused; every harmless one runs."""
    assert verdict(stage, case["cmd"]) == case["expect"], case["source"]


@pytest.mark.parametrize("stage", SAFE_STAGES)
def test_corpus_scores_on_the_hard_tiers_are_pinned(stage, project, monkeypatch):
    """The evasion, obfuscated and debatable tiers are reported, not chased (the wall stops them): if
    the filter changes what it catches there, update HARD_TIER_SCORES.
    The scores are those of the filter in front of the wall, on a machine without bubblewrap too."""
    monkeypatch.setenv("SANDBOX", "")
    assert {tier: scores(stage)[tier] for tier in HARD_TIER_SCORES} == HARD_TIER_SCORES


@pytest.mark.parametrize("stage", SAFE_STAGES)
@pytest.mark.parametrize("case", PATHS, ids=lambda case: f"{case['expect']}: {case['path']!r}")
def test_corpus_paths_never_escape_the_workspace(stage, case, workspace):
    """safe_path refuses every escaping path and keeps the harmless ones; either is fine for `either_ok`."""
    try:
        inside = stage.safe_path(case["path"]).is_relative_to(workspace.resolve())
    except ValueError:
        inside = None  # refused
    assert inside is not False
    assert case.get("either_ok") or (inside is None) == (case["expect"] == "block")

