"""Test set-up: strict shape checks (every nested call checked) unless TYPED_TRANSFORMER_STRICT says otherwise."""

import os

# Before typed_transformer is imported (here and in the CLI subprocesses the tests start): the suite runs in
# strict mode, so an internal shape bug of the library is caught too. `TYPED_TRANSFORMER_STRICT=0 pytest ...`
# runs it in the default mode users get (CI runs the shape-error tests that way as well).
os.environ.setdefault("TYPED_TRANSFORMER_STRICT", "1")
# One intra-op thread, fixed by the user's variable: tiny tensors gain nothing from threads on 2 cores, and a
# fixed count keeps the losses the tests compare bit for bit (`--threads auto` leaves a user's count alone).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

torch.set_num_threads(1)  # tiny tensors: intra-op threads only add overhead on 2 cores
