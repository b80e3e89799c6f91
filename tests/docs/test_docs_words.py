"""No internal words in what a user reads: the project's founding documents by number ("seed 003"), issue
numbers, "the issue measured", or paths a clone does not have (the team's notes, ``../shared/data``)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = re.compile(r"\bseeds? 0\d\d\b|\bissue \d+\b|the issue measured|shared/notes", re.IGNORECASE)
#: Pages and the package must not name the benchmark text's place on the team's machine; a benchmark may read it.
DATA_PATH = re.compile(r"\.\./shared/data")


def test_no_internal_words_in_docs_source_or_benchmarks() -> None:
    read = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted((ROOT / "src" / "typed_transformer").rglob("*.py"))]
    files: list[tuple[Path, tuple[re.Pattern[str], ...]]] = [(path, (INTERNAL, DATA_PATH)) for path in read]
    files += [(path, (INTERNAL,)) for path in sorted((ROOT / "benchmarks").rglob("*.py"))]
    found = [f"{path.relative_to(ROOT)}:{number}: {match.group(0)}" for path, patterns in files
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for pattern in patterns for match in pattern.finditer(line)]
    assert found == []


def test_the_internal_words_are_found_in_any_case() -> None:
    for line in ("Seed 000 spelled it trg", "as seeds 003 said", "Issue 12 asked", "see ../shared/notes/x.md"):
        assert INTERNAL.search(line) is not None, line
    assert INTERNAL.search("seed 0, 10 examples per check") is None


TINY_SHAKESPEARE = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


@pytest.mark.parametrize("page", ["README.md", "docs/training.md", "docs/lab/lr-sweep.md"])
def test_a_page_that_trains_on_tiny_shakespeare_says_where_to_get_it(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    assert "shakespeare" in text.lower()
    assert TINY_SHAKESPEARE in text
