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
import unittest
from pathlib import Path

import pytest
import torch
from sybil import Document
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

#: (file relative to the root, number of examples marked ``skip: next``): each one is deliberate.
SKIPPED: dict[str, int] = {
    # the zero-line audits, findings and repros of libraries not in the main venv (diffusers, litgpt, open_clip,
    # timm: installed by benchmarks/library_envs.sh, where their blocks are regenerated and re-checked)
    "docs/audit.md": 4, "docs/audit-findings.md": 8, "docs/audit-open-clip-sweep.md": 1,
    "docs/audit-diffusers-sweep.md": 2, "docs/audit-litgpt-sweep.md": 3,
    # an excerpt of a trait's source (run again, it would register the trait twice)
    "docs/audit-design.md": 1}

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
        except unittest.SkipTest:
            continue  # a block marked `skip: next "why"`: Sybil raises the reason instead of running it
        except Exception as error:
            raise AssertionError(f"{_relative(path)}, line {example.line}: the example fails:\n{error}") from error


API_PAGES = ROOT / "docs" / "api"


def test_every_public_module_has_an_api_page() -> None:
    """mkdocstrings renders each module's ``__all__`` (``filters: public``); every module needs its page."""
    package = ROOT / "src" / "typed_transformer"
    modules = sorted(p.stem for p in package.glob("*.py") if not p.stem.startswith("_") and p.stem != "cli")
    pages = {m: API_PAGES / f"{m}.md" for m in modules}
    missing = [m for m, page in pages.items()
               if not page.exists() or f"::: typed_transformer.{m}\n" not in page.read_text(encoding="utf-8")]
    assert not missing, f"no API page docs/api/<module>.md with '::: typed_transformer.<module>' for {missing}"


def test_every_top_level_name_is_in_its_modules_public_names() -> None:
    import importlib
    import inspect

    import typed_transformer

    for name in typed_transformer.__all__:
        obj = getattr(typed_transformer, name)
        if inspect.ismodule(obj):
            assert (API_PAGES / f"{name}.md").exists(), name
            continue
        module_name = getattr(obj, "__module__", "")
        if not module_name.startswith("typed_transformer."):
            continue  # re-exported from a dependency (jaxtyping's TypeCheckError)
        module = importlib.import_module(module_name)
        assert name in module.__all__, f"{name} is public in typed_transformer but not in {module_name}.__all__"


def test_the_testing_page_shows_how_to_test_your_own_attention_with_the_strategies() -> None:
    """A newcomer wrote a working test only after reading strategies.py: the page shows one, executed above."""
    page = (ROOT / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.DOTALL)
    (example,) = [block for block in blocks if "from typed_transformer.strategies import" in block]
    for part in ("def my_attention(", "attention_inputs(", "keep_masks(", "causal_mask(",
                 "scaled_dot_product_attention(", "test_a_wrong_attention_is_caught()"):
        assert part in example, part


def test_the_tutorial_mistakes_page_checks_each_mistake_against_the_reference() -> None:
    """docs/tutorial-mistakes.md: one section per mistake of the founding tutorials (issue 31), each with an
    executed check (none skipped) that asserts the difference; test_examples_run runs them."""
    page = (ROOT / "docs" / "tutorial-mistakes.md").read_text(encoding="utf-8")
    assert "docs/tutorial-mistakes.md" not in SKIPPED
    sections = re.split(r"^## ", page, flags=re.MULTILINE)[1:]
    titles = [section.splitlines()[0] for section in sections]
    for number, words in enumerate(("Heads merged without moving them back", "misprinted permute",
                                    "Concatenation \"along the sequence\"", "missing `1 / sqrt(d_k)`",
                                    "mask below the diagonal and the softmax over queries", "`eps` outside the root"),
                                   1):
        (title,) = [t for t in titles if t.startswith(f"{number}. ")]
        assert words in title, title
        section = sections[titles.index(title)]
        checks = [block for block in re.findall(r"```python\n(.*?)```", section, re.DOTALL)
                  if "assert" in block or block.startswith(">>>")]  # an assertion, or a doctest's printed output
        assert checks, f"section {title!r} has no executed check"
        assert not _SKIP.search(section), f"section {title!r} skips an example"
