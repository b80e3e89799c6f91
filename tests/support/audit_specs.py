"""A user's own module spec for the audit tests and the CLI (``--spec tests.support.audit_specs:NEOX_AS_BLOCKS``):
GPT-NeoX read with its fused qkv as ``[q; k; v]`` blocks,
which its per-head layout is not (the reference check fails)."""

import dataclasses

from typed_transformer.audit import SPECS

NEOX_AS_BLOCKS = dataclasses.replace(SPECS["gpt_neox"], name="neox_as_blocks", qkv_layout="blocks")
