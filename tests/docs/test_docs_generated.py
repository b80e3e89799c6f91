"""Blocks of README.md and docs/ written by scripts stay in the format the commands print today.

The main job's output (``benchmarks/readme_main_job.py --write``) is pasted in README.md and docs/training.md; the
values are the script's run (stdout and stderr together, as a terminal shows them), but the kinds of lines
(``data:``, ``model:``, ``train:``, ``batch:``, ``peak:``, ``iter``, ``done:``, ``throughput:``, ``sample:``) must
be the ones ``train`` prints now, in that order, or the page shows output this version would not give. ``threads:``
lines are left out of the comparison: how many the automatic thread count prints depends on the load at the time.
"""

import contextlib
import io
import re
from pathlib import Path

import pytest

from tests.support.cli import TEXT
from typed_transformer.cli import main

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- main-job:begin -->", "<!-- main-job:end -->"
LABEL = re.compile(r"^(iter|[a-z]+:)")


def kinds(output: str) -> list[str]:
    """The ordered kinds of line of a ``train`` output up to ``sample:`` (repeats and ``threads:`` dropped)."""
    found: list[str] = []
    for line in output.splitlines():
        match = LABEL.match(line)
        if match is None or match.group(1) == "threads:":
            continue
        if not found or found[-1] != match.group(1):
            found.append(match.group(1))
        if match.group(1) == "sample:":
            break
    return found


def pasted(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1, f"{page}: one generated main-job block expected"
    assert text.count(END) == 1, f"{page}: one generated main-job block expected"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert "$ .venv/bin/typed-transformer train\n" in block, f"{page}: the block does not show the command"
    assert "made by `benchmarks/readme_main_job.py`" in block, f"{page}: the block does not name its script"
    return block.split("$ .venv/bin/typed-transformer train\n", 1)[1]


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("main-job")
    text = root / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["train", "--data", str(text), "--max-iters", "2", "--eval-interval", "1", "--eval-iters", "1",
                     "--sample-tokens", "5", "--no-progress", "--out", str(root / "run")])
    assert code == 0
    return kinds(out.getvalue())


@pytest.mark.parametrize("page", ["README.md", "docs/training.md"])
def test_the_pasted_main_job_has_the_lines_train_prints_today(page: str, printed: list[str]) -> None:
    assert printed[0] == "data:"
    assert printed[-1] == "sample:"
    assert "iter" in printed
    assert kinds(pasted(ROOT / page)) == printed


def test_kinds_sees_a_missing_line() -> None:
    full = "data: x\nmodel: y\nthreads: 2\niter 0: a\niter 1: b\ndone: z\nsample:\nclass\n"
    assert kinds(full) == ["data:", "model:", "iter", "done:", "sample:"]
    assert kinds(full.replace("model: y\n", "")) != kinds(full)
