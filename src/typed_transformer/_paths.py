"""Temporary file names for atomic writes (write beside the target, then rename onto it).

One naming rule for every file the package writes this way (checkpoints, the loss plot), so that
:func:`typed_transformer.run_files.remove_temporaries` recognises what a killed run left behind.
"""

import os
import secrets
from pathlib import Path

__all__ = ["temporary_path"]


def temporary_path(final: Path) -> Path:
    """A unique temporary name next to ``final`` (``.NAME.tmp-PID-RANDOM.SUFFIX``), removed by
    :func:`~typed_transformer.run_files.remove_temporaries` when a run was killed before it could rename or
    delete it."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}{final.suffix}")
