#!/usr/bin/env bash
# The environments the library sweeps (benchmarks/audit_library_sweep.py) run in, beside the main .venv:
# * .venv-litgpt: litgpt pins an older huggingface-hub and pulls transformers down, so it lives apart from .venv
#   (torch pinned to the project's CPU wheel). torchtitan is not set up: its attention runs only through a
#   torch.compiled FlexAttention that cannot take gradients on CPU (docs/audit.md, the libraries section, says why).
# * timm and open_clip go into .venv without their dependencies: both require torchvision, whose registry build is
#   a CUDA wheel that would replace the CPU torch; the sweep imports them through a torchvision shim (see
#   typed_transformer.audit.specs.shared.import_without_torchvision). They add no package .venv already has.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(command -v python3.11 || command -v python3)
if [ ! -x .venv-litgpt/bin/python ]; then
    "$python" -m venv .venv-litgpt
fi
.venv-litgpt/bin/pip install --quiet torch==2.13.0 litgpt==0.5.13 -e '.[audit]'
.venv/bin/pip install --quiet --no-deps timm==1.0.31 open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth
