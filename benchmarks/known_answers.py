"""Write (``--write``) or check the reference's known answers: ``src/typed_transformer/audit/core/known_answers.json``,
the float64 values the audit's self-test compares the reference with before every audit
(``typed_transformer.audit.core.known_answers``). Run it after a deliberate change of the reference; a test checks
the stored values against torch's own attention.

    python benchmarks/known_answers.py           # prints each case that differs; exit 1 if any
    python benchmarks/known_answers.py --write   # stores what the reference computes now
"""

import argparse
import sys

from typed_transformer.audit.core import known_answers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the values computed now")
    args = parser.parse_args()
    if args.write:
        values = known_answers.write()
        print(f"{known_answers.STORED_PATH}: {len(values)} cases, {sum(map(len, values.values()))} values")
        return 0
    differ = known_answers.self_test()
    for line in differ:
        print(line)
    print(f"{len(differ)} of {len(known_answers.compute())} cases differ from the stored values")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
