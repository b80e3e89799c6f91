"""Helpers shared by the command-line tests: the training text, a trained run, exit codes, one-line errors,
re-signed checkpoints."""

from collections.abc import Callable
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from typed_transformer.cli import main
from typed_transformer.run_files import content_digest

#: The training text of the command-line tests: 648 characters, 26 distinct.
TEXT = "first citizen:\nbefore we proceed any further, hear me speak.\n\nall:\nspeak, speak.\n" * 8


def train_run(root: Path, max_iters: int, flags: list[str]) -> tuple[Path, Path]:
    """(text file, run directory) of ``train`` on :data:`TEXT` for ``max_iters`` iterations under ``root``."""
    text = root / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = root / "run"
    assert main(["train", "--data", str(text), "--max-iters", str(max_iters), *flags, "--out", str(out)]) == 0
    return text, out


def run(argv: list[str]) -> int:
    """``main(argv)``'s exit code, whether it returns it or argparse raises SystemExit."""
    try:
        return main(argv)
    except SystemExit as exit_:
        code = exit_.code
    if not isinstance(code, int):
        raise AssertionError(f"SystemExit({code!r}) is not an exit code")
    return code


def one_line(err: str) -> str:
    """The only line of ``err``, which must not hold a traceback."""
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err
    return lines[0]


def read(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """A checkpoint's tensors and metadata, as stored."""
    with safe_open(str(path), framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, dict(handle.metadata())  # noqa: SIM118


def rewrite(source: Path, target: Path, change: Callable[[dict[str, Tensor], dict[str, str]], object],
            *, sign: bool = True) -> Path:
    """``source`` changed in place by ``change`` and written to ``target``, re-signed unless ``sign=False``."""
    tensors, metadata = read(source)
    change(tensors, metadata)
    if sign:
        metadata["sha256"] = content_digest(tensors, metadata)
    save_file(tensors, str(target), metadata=metadata)
    return target
