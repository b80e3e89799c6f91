"""``python -m typed_transformer ...``: the command line, as ``typed-transformer ...`` (what ``torchrun
-m typed_transformer train ...`` runs in each process)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
