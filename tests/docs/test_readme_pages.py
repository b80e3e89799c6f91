"""Every guide of docs/ is in the README's documentation table, and every audit page is linked from docs/audit.md: a
new page is found from the front door."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: pages a guide links to in place of the README: the audit's sweep and findings pages, from docs/audit.md
AUDIT_PAGES = sorted(p.name for p in (ROOT / "docs").glob("audit-*.md") if p.name != "audit-design.md")
GUIDES = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name not in AUDIT_PAGES and p.name != "index.md")


def _table() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Documentation")
    end = readme.find("\n## ", start + 1)
    return readme[start:] if end < 0 else readme[start:end]


@pytest.mark.parametrize("page", GUIDES)
def test_each_guide_is_in_the_readme_table(page: str) -> None:
    assert re.search(rf"\]\(docs/{re.escape(page)}[)#]", _table()), f"add docs/{page} to the README's table"


@pytest.mark.parametrize("page", AUDIT_PAGES)
def test_each_audit_page_is_linked_from_the_audit_guide(page: str) -> None:
    assert f"({page}" in (ROOT / "docs" / "audit.md").read_text(), f"link docs/{page} from docs/audit.md"


def test_the_lists_are_not_empty() -> None:
    assert "testing.md" in GUIDES
    assert "tutorial-mistakes.md" in GUIDES
    assert "audit-hf-sweep.md" in AUDIT_PAGES


def test_a_block_of_tuned_threads_does_not_say_torchs_default() -> None:
    """docs/training.md's seq2seq block (benchmarks/seq2seq_runs.py) prints the thread tuner's choice: its header
    names the command's --threads auto, not torch's default count (issue 43)."""
    page = (ROOT / "docs" / "training.md").read_text()
    block = page[page.index("<!-- seq2seq-runs:begin -->"):page.index("<!-- seq2seq-runs:end -->")]
    assert "threads: " in block
    assert "median step time" in block
    assert "torch's default thread count" not in block
    assert "--threads auto" in block.splitlines()[2]


def test_the_founding_tutorials_are_named_by_their_titles() -> None:
    page = (ROOT / "docs" / "tutorial-mistakes.md").read_text()
    for number in ("000", "001", "002", "003", "004"):
        row = next((line for line in page.splitlines() if line.startswith(f"| {number} | *")), None)
        assert row is not None, f"tutorial {number} has no title row"
