"""The suite's one wall-clock limit on a subprocess or a wait: there only to stop a test whose process hangs,
never to time it. It holds at a load of 20 on 2 cores (steps 10x slower than on an idle machine: the slowest
subprocess of the suite, a few minutes idle, stays well inside it); tests/structure/test_timeouts.py keeps every
limit in tests/ on it."""

#: Seconds before a subprocess, or a wait for one, counts as hung.
HANG_SECONDS = 3600.0
