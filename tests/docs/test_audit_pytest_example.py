"""docs/audit.md's pytest example runs as a user's suite would (benchmarks/audit_pytest.py reads it from the page):
the correct candidate is green, the two wrong ones are red with their cause as the first line of the first failure,
and the page's printed block is what the run prints (its timing aside)."""

import re
from pathlib import Path

from benchmarks import audit_pytest as bench

ROOT = Path(__file__).resolve().parents[2]


def _untimed(text: str) -> str:
    return re.sub(r" in \d+ s \(", " in N s (", text)


def test_the_pytest_example_tells_right_from_wrong(tmp_path: Path) -> None:
    (tmp_path / "test_attention_audit.py").write_text(bench.example())
    seconds, output = bench.run(tmp_path)
    found = bench.summary(output)
    assert found["test_correct"]["failed"] == 0, output
    assert str(found["test_wrong_scale"]["first"]).startswith("conventions: scale: logit scale"), output
    assert str(found["test_ignores_mask"]["first"]).startswith("conventions: supports_mask: attn_mask is accepted and "
                                                          "ignored"), output
    page = (ROOT / "docs" / "audit.md").read_text()
    shown = page[page.index(bench.BEGIN):page.index(bench.END)]
    assert _untimed(bench.block(found, seconds)) in _untimed(shown), "rerun benchmarks/audit_pytest.py --write"
