"""The Hugging Face sweep pages state their counts in the line the script prints (``COUNTS`` of
benchmarks/audit_hf_sweep.py): classes found, dot-product attention, audited with zero spec and its share, FAILs,
false alarms, set aside, not dot-product attention, not buildable."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

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
    aside = {**audited, "cls": "CAttention", "unmodelled": ["attention sinks"], "unmodelled_checks": ["reference"]}
    deformable = {"model": "d", "cls": "DMultiscaleDeformableAttention", "skipped": "TypeError: missing n_points"}
    broken = {"model": "e", "cls": "EAttention", "skipped": "TypeError: missing window_size"}
    # a block named like attention around a module of another kind (BigBirdAttention around block-sparse attention)
    block = {"model": "f", "cls": "FAttention", "skipped": "not dot-product attention: block-sparse attention"}
    return [audited, failing, aside, deformable, broken, block]


def test_the_counts_line_classifies_every_class() -> None:
    sweep = _sweep()
    line = sweep.counts_line(_rows(), "9.9.9")
    match = sweep.COUNTS.fullmatch(line)
    assert match is not None, line
    assert {k: match.group(k) for k in ("found", "dot", "audited", "share", "fails", "false", "aside", "other",
                                        "skipped")} == {
        "found": "6", "dot": "4", "audited": "2", "share": "50", "fails": "1", "false": "0", "aside": "1",
        "other": "2", "skipped": "1"}



#: the sweep pages in docs/ (the oldest release's exists once benchmarks/hf_oldest_env.sh and ``--oldest`` ran)
_PAGES = sorted((ROOT / "docs").glob("audit-hf-sweep*.md"))


def _table_rows(text: str) -> int:
    return sum(line.startswith("| ") and "| `" in line for line in text.splitlines())


def _section(text: str, heading: str) -> str:
    """The text under the ``## heading`` of a page, up to the next ``## `` heading."""
    _, found, rest = text.partition(f"\n## {heading}")
    return rest.split("\n## ")[0] if found else ""


def _page_problems(text: str) -> list[str]:
    """What does not add up on a sweep page: its counts line (the script's format) against itself and its tables."""
    match = _sweep().COUNTS.search(text)
    if match is None:
        return ["no counts line in the format of audit_hf_sweep.COUNTS"]
    n = {k: int(v) for k, v in match.groupdict().items() if k != "version"}
    tables = {"audited": _table_rows(text.split("\n## ")[0]),
              "aside": _table_rows(_section(text, "Not audited: the reference does not model")),
              "other": _table_rows(_section(text, "Not dot-product attention")),
              "skipped": _table_rows(_section(text, "Not audited: of no known layout")),
              "failing": text.count("\n### ")}
    facts = {"audited + set aside + not dot-product + not buildable = found":
             n["audited"] + n["aside"] + n["other"] + n["skipped"] == n["found"],
             "dot-product = found - not dot-product": n["dot"] == n["found"] - n["other"],
             "the share printed is audited / dot-product": n["share"] == 100 * n["audited"] // max(n["dot"], 1),
             "0 false alarms": n["false"] == 0,
             "passing + failing = audited": n["passing"] + n["failing"] == n["audited"],
             "FAILs only in failing classes, at least one each": (n["fails"] == 0) == (n["failing"] == 0)
             and n["fails"] >= n["failing"],
             **{f"{k}: {v} table rows, {n[k]} in the counts line": v == n[k] for k, v in tables.items()}}
    return [fact for fact, holds in facts.items() if not holds]


@pytest.mark.parametrize("page", _PAGES, ids=[p.name for p in _PAGES])
def test_each_page_states_counts_that_add_up(page: Path) -> None:
    assert _page_problems(page.read_text(encoding="utf-8")) == []


def test_the_scripts_page_adds_up_and_a_changed_count_is_found() -> None:
    sweep = _sweep()
    rows = _rows()
    for row in rows:
        row.update(fingerprint=row["cls"], conventions="self", causes=[], notes=[])
    rows[1]["fails"] = [{"check": "reference", "message": "ratio 3", "repro": "print(1)"}]
    text = sweep.page(rows, [], 1.0, "9.9.9", 5, 5, 1)
    assert _page_problems(text) == []
    assert _page_problems(text.replace("; 1 not buildable", "; 2 not buildable")) == [
        "audited + set aside + not dot-product + not buildable = found", "skipped: 1 table rows, 2 in the counts line"]
    assert _page_problems(text.replace("(50% of", "(60% of")) == ["the share printed is audited / dot-product"]
    assert _page_problems(text.replace("counts: ", "")) == ["no counts line in the format of audit_hf_sweep.COUNTS"]


def test_a_class_that_does_not_build_is_listed_with_its_own_error() -> None:
    """The sweep retries a failing class with as many key/value heads as query heads; when the retry fails too, the
    reason listed is the first error, not the retry's (which said only that the module had no config)."""
    row = _sweep().audit_class(("pegasus_x", "PegasusXGlobalLocalAttention"))
    assert row["skipped"].startswith("AuditUsageError: PegasusXGlobalLocalAttention: forward needs "
                                     "global_hidden_states"), row


def test_the_page_states_the_budget_the_sweep_ran_with() -> None:
    sweep = _sweep()
    for budget in ("quick", "default"):
        rows = [{**row, "fingerprint": row["cls"], "causes": [], "conventions": "self", "notes": [],
                 "unmodelled_checks": ["reference"],
                 "fails": [{**fail, "message": "m", "repro": "r"} for fail in row.get("fails", [])]}
                for row in _rows()]
        text = sweep.page(rows, [], 1.0, "9.9.9", 5, 5, 2, budget)
        assert f"(float32, 5 examples per check, budget {budget!r}, seed 0)" in text
