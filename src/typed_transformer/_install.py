"""How to install an extra, in one spelling for every message that names one, right for how this copy was
installed: an editable install from a source checkout, or a package from an index. Standard library only."""

from pathlib import Path

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """The command that installs the extra ``extra``: ``pip install -e 'CHECKOUT[extra]'`` when this package
    runs from a source checkout (``pip install -e .``), else ``pip install 'typed-transformer[extra]'``."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "src" / "typed_transformer").is_dir():
        return f"pip install -e '{checkout}[{extra}]'"
    return f"pip install 'typed-transformer[{extra}]'"
