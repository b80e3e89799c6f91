"""The Hugging Face sweep pages state their counts in the line the script prints (``COUNTS`` of
benchmarks/audit_hf_sweep.py): classes found, dot-product attention, audited with zero spec and its share, FAILs,
false alarms, set aside, not dot-product attention, not buildable."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("audit_hf_sweep", ROOT / "benchmarks" / "audit_hf_sweep.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("audit_hf_sweep", module)
    spec.loader.exec_module(module)
    return module


def _rows() -> list[dict[str, Any]]:
    audited = {"model": "a", "cls": "AAttention", "statuses": {"reference": "PASS"}, "fails": []}
    failing = {"model": "b", "cls": "BAttention", "statuses": {"reference": "FAIL"}, "fails": [{"check": "x"}]}
    aside = {**audited, "cls": "CAttention", "unmodelled": ["attention sinks"]}
    deformable = {"model": "d", "cls": "DMultiscaleDeformableAttention", "skipped": "TypeError: missing n_points"}
    broken = {"model": "e", "cls": "EAttention", "skipped": "TypeError: missing window_size"}
    return [audited, failing, aside, deformable, broken]


def test_the_counts_line_classifies_every_class() -> None:
    sweep = _sweep()
    line = sweep.counts_line(_rows(), "9.9.9")
    match = sweep.COUNTS.fullmatch(line)
    assert match is not None, line
    assert {k: match.group(k) for k in ("found", "dot", "audited", "share", "fails", "false", "aside", "other",
                                        "skipped")} == {
        "found": "5", "dot": "4", "audited": "2", "share": "50", "fails": "1", "false": "0", "aside": "1",
        "other": "1", "skipped": "1"}


def test_the_page_states_the_budget_the_sweep_ran_with() -> None:
    sweep = _sweep()
    for budget in ("quick", "default"):
        rows = [{**row, "fingerprint": row["cls"], "causes": [], "conventions": "self", "notes": [],
                 "unmodelled_checks": ["reference"],
                 "fails": [{**fail, "message": "m", "repro": "r"} for fail in row.get("fails", [])]}
                for row in _rows()]
        text = sweep.page(rows, [], 1.0, "9.9.9", 5, 5, 2, budget)
        assert f"(float32, 5 examples per check, budget {budget!r}, seed 0)" in text
