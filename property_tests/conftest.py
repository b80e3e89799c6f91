"""Hypothesis set-up for the property tests: torch's RNG under Hypothesis's control, and profiles.

Profiles (pick one with ``HYPOTHESIS_PROFILE=<name>``; default ``ci`` when ``CI`` is set, else ``dev``):

* ``ci``: 30 derandomized examples, no database, no deadline and no health check, so that the examples a
  clean clone draws do not depend on the machine's speed or load (a health check that fails under load
  would change what is drawn or fail the run). ``ci``, ``dev`` and ``thorough`` skip the slow "explain"
  phase; shrinking stays on.
* ``dev``: 50 random examples per test, no deadline, example database on.
* ``thorough``: 500 examples per test (nightly or before a release).
* ``mutation``: 15 derandomized examples, no shrinking (fast, reproducible kills for mutation testing).
"""

import os

# Strict shape checks unless the environment says otherwise (see tests/conftest.py); set before the import below.
os.environ.setdefault("TYPED_TRANSFORMER_STRICT", "1")

import torch
from hypothesis import HealthCheck, Phase, settings

from typed_transformer.strategies import TORCH_RANDOM

torch.set_num_threads(1)  # tiny tensors: intra-op threads only add overhead on 2 cores


# Importing the public strategies registers torch's global RNG with Hypothesis (the strong reference
# register_random needs is typed_transformer.strategies.TORCH_RANDOM).
__all__ = ["NO_EXPLAIN", "TORCH_RANDOM"]

# Hypothesis's "explain" phase re-runs a failing example under a line tracer to list the lines only
# failing runs executed; through torch that takes ~40 s per failing test and names torch internals.
NO_EXPLAIN = tuple(phase for phase in Phase if phase is not Phase.explain)

settings.register_profile("ci", derandomize=True, max_examples=30, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), print_blob=True, phases=NO_EXPLAIN)
settings.register_profile("dev", max_examples=50, deadline=None, phases=NO_EXPLAIN)
settings.register_profile("thorough", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          phases=NO_EXPLAIN)
settings.register_profile("mutation", derandomize=True, database=None, deadline=None, max_examples=15,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
