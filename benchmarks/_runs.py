"""Helpers of the wall-time benchmarks (contention, time to quality): timed command runs, a busy core, data."""

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["REPO", "Run", "busy_core", "data_file", "main_job", "reference", "run_timed", "write_between",
           "write_readme_line"]

REPO = Path(__file__).resolve().parents[1]
#: The benchmark corpus, beside the checkout when present (never committed).
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class Run:
    """A finished command: its wall time (launch to exit) and its output lines, each with the seconds since
    launch at which it was read."""

    argv: list[str]
    seconds: float
    lines: list[tuple[float, str]] = field(default_factory=list)

    def last(self, prefix: str) -> str | None:
        return next((line for _, line in reversed(self.lines) if line.startswith(prefix)), None)


def _environment() -> dict[str, str]:
    """The caller's environment without a fixed thread count: each run picks its own, as a new user's would."""
    return {k: v for k, v in os.environ.items() if k not in _THREAD_VARIABLES}


def run_timed(argv: Sequence[str]) -> Run:
    """Run ``argv`` (stdout and stderr merged), stamping each line; raise on a non-zero exit."""
    started = time.perf_counter()
    process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=_environment(), cwd=REPO)
    run = Run(list(argv), 0.0)
    assert process.stdout is not None
    for line in process.stdout:
        run.lines.append((time.perf_counter() - started, line.rstrip("\n")))
    code = process.wait()
    run.seconds = time.perf_counter() - started
    if code != 0:
        tail = "\n".join(line for _, line in run.lines[-20:])
        raise RuntimeError(f"{' '.join(argv)} exited with {code}:\n{tail}")
    return run


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """A busy-loop process holding one core for the duration (another program on the user's machine)."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # running before the measured command starts
        yield
    finally:
        process.kill()
        process.wait()


@contextlib.contextmanager
def data_file(path: Path | None) -> Iterator[Path]:
    """``path``, else Tiny Shakespeare beside the checkout, else the main job's default corpus written to a
    temporary file (so that the reference loop reads the same text)."""
    if path is not None:
        yield path
        return
    if SHAKESPEARE.is_file():
        yield SHAKESPEARE
        return
    from typed_transformer.data import default_corpus

    text, _ = default_corpus()
    with tempfile.TemporaryDirectory() as directory:
        target = Path(directory) / "corpus.txt"
        target.write_text(text, encoding="utf-8")
        yield target


def main_job(data: Path, out: Path, *extra: str) -> list[str]:
    """The README's main job (``typed-transformer train``, the baby preset) on ``data``."""
    return [sys.executable, "-m", "typed_transformer", "train", "--data", str(data), "--out", str(out),
            "--overwrite", "--no-progress", *extra]


def reference(data: Path, *extra: str) -> list[str]:
    """nanoGPT's CPU baby run as a plain PyTorch loop (``nanogpt_reference.py``)."""
    return [sys.executable, str(REPO / "benchmarks" / "nanogpt_reference.py"), "--data", str(data), *extra]


def write_between(page: Path, begin: str, end: str, block: str) -> None:
    """Replace what stands between the markers ``begin`` and ``end`` of ``page`` with ``block``."""
    text = page.read_text(encoding="utf-8")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    page.write_text(f"{head}{begin}\n{block}\n{end}{tail}", encoding="utf-8")


def write_readme_line(page: Path, name: str, line: str) -> None:
    """Replace the line between ``page``'s two ``<!-- name -->`` markers (README.md's summary of a target)."""
    marker = f"<!-- {name} -->"
    write_between(page, marker, marker, line)


def torchrun_workers(launcher: int) -> dict[int, int]:
    """rank -> pid of the processes that the launcher ``launcher`` started (from /proc)."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != launcher:
                continue
            environ = dict(v.split("=", 1) for v in (entry / "environ").read_text().split("\0") if "=" in v)
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if "RANK" in environ:
            found[int(environ["RANK"])] = int(entry.name)
    return found
