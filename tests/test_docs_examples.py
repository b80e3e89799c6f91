"""Every Python example in README.md and docs/ runs, so that no example can drift from the code.

Each Markdown file is parsed with Sybil: a fenced ``python`` block is executed; one that starts with ``>>>`` is a
doctest whose printed output (and traceback, for an expected error) must match. The blocks of one file share a
namespace and run in order, as a reader would type them. A block that cannot run in a test (it needs a trained
checkpoint or a long run) is marked, right above it, with

    <!-- skip: next "why it is not executed" -->

and is listed in ``SKIPPED`` below, so that a skip is a visible decision, not an accident. Shell commands
(``bash``) and printed output (plain or ``text`` fences) are not executed.
"""

import re
from pathlib import Path

import pytest
import torch
from sybil import Document
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

#: (file relative to the root, number of examples marked ``skip: next``): each one is deliberate.
SKIPPED: dict[str, int] = {}

#: Fence languages a page may use. ``python`` runs; the others are shell commands or printed output.
FENCES = {"python", "bash", "text", ""}

_FENCE = re.compile(r"^\s*```(\S*)", re.MULTILINE)
_SKIP = re.compile(r"^\s*<!--\s*skip:\s*next\b", re.MULTILINE)  # a directive on its own line, as Sybil reads it


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_documents_are_found() -> None:
    names = {_relative(p) for p in DOCUMENTS}
    assert {"README.md", "docs/index.md", "docs/conventions.md", "docs/shape-checking.md"} <= names


@pytest.mark.parametrize("path", DOCUMENTS, ids=_relative)
def test_fence_languages_are_known(path: Path) -> None:
    """A ``py`` or ``python3`` fence would silently escape execution: only the known languages are allowed."""
    text = path.read_text(encoding="utf-8")
    opening = _FENCE.findall(text)[::2]  # every other fence line opens a block
    unknown = sorted(set(opening) - FENCES)
    assert not unknown, f"{_relative(path)}: fence languages {unknown}; use one of {sorted(FENCES)}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=_relative)
def test_skips_are_deliberate(path: Path) -> None:
    skips = len(_SKIP.findall(path.read_text(encoding="utf-8")))
    assert skips == SKIPPED.get(_relative(path), 0), (
        f"{_relative(path)} marks {skips} examples as not executed; list them in SKIPPED with a reason on the page")


@pytest.mark.parametrize("path", DOCUMENTS, ids=_relative)
def test_examples_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    torch.manual_seed(0)
    document = Document.parse(str(path), PythonCodeBlockParser(), SkipParser())
    for example in document:
        try:
            example.evaluate()
        except Exception as error:
            raise AssertionError(f"{_relative(path)}, line {example.line}: the example fails:\n{error}") from error
