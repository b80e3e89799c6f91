#!/usr/bin/env bash
# Builds .venv-hf-oldest: the oldest transformers the project declares (pyproject's audit-test/hf floor), on the
# torch of the main environment, with this checkout installed editable. The Hugging Face sweep then runs there:
#
#     bash benchmarks/hf_oldest_env.sh            # the declared floor
#     bash benchmarks/hf_oldest_env.sh 5.1.0      # another version (to try a floor)
#     .venv-hf-oldest/bin/python benchmarks/audit_hf_sweep.py --jobs 2 --oldest
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-$(sed -n 's/.*"transformers>=\([0-9.]*\)".*/\1/p' pyproject.toml | head -1)}"
python3 -m venv .venv-hf-oldest
.venv-hf-oldest/bin/pip install -q "torch==2.13.0" "transformers==${version}" -e ".[audit]"
.venv-hf-oldest/bin/python -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
