"""docs/audit-findings.md is what benchmarks/audit_findings.py writes today: every finding re-checked against the
installed (pinned) libraries, so a finding fixed upstream cannot keep reading "reproduced"."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_the_findings_page_is_in_date() -> None:
    for library in ("transformers", "torchtune", "x_transformers", "diffusers"):
        pytest.importorskip(library, reason=f"{library} is not installed (extra audit-test)")
    sys.path.insert(0, str(ROOT))
    from benchmarks import audit_findings

    text = (ROOT / "docs" / "audit-findings.md").read_text(encoding="utf-8")
    shown = text.split(audit_findings._BEGIN, 1)[1].split(audit_findings._END, 1)[0]
    assert shown == "\n" + audit_findings.page_block() + "\n", (
        "docs/audit-findings.md is out of date: python benchmarks/audit_findings.py")


def test_a_finding_that_no_longer_reproduces_reads_fixed() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks import audit_findings

    fixed = audit_findings.Finding("a behaviour", "torch", "what", "reference", "reproduced = False\nprint('ran')\n")
    status, printed = audit_findings.recheck(fixed)
    assert status.startswith("**FIXED upstream**: no longer reproduces with torch 2.13.0")
    assert printed == "ran\n"
    missing = audit_findings.Finding("a behaviour", "no-such-library", "what", "reference", "reproduced = True\n")
    assert audit_findings.recheck(missing) == ("not re-checked: no-such-library is not installed", "")


@pytest.mark.parametrize("library", ["litgpt", "open_clip_torch", "timm"])
def test_each_library_block_is_in_date(library: str) -> None:
    """The blocks of libraries outside the test extras, where the library is installed (benchmarks/library_envs.sh)."""
    import importlib.metadata

    try:
        importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{library} is not installed (benchmarks/library_envs.sh sets it up)")
    sys.path.insert(0, str(ROOT))
    from benchmarks import audit_findings

    begin, end = audit_findings.library_markers(library)
    text = (ROOT / "docs" / "audit-findings.md").read_text(encoding="utf-8")
    assert text.split(begin, 1)[1].split(end, 1)[0] == "\n" + audit_findings.library_block(library) + "\n"
