#!/bin/bash
# Every generated block of README.md and docs/, rewritten from a fresh run of the script that owns it, one after
# the other (the wall times and speeds are part of the figures: run it on an idle machine; about 45 minutes).
#   bash benchmarks/regenerate_docs.sh path/to/tinyshakespeare.txt
# tests/docs/test_docs_generated.py and `benchmarks/audit_infer_docs.py --check` say when a block is out of date.
set -euo pipefail
data=${1:?usage: bash benchmarks/regenerate_docs.sh TINYSHAKESPEARE.txt}
cd "$(dirname "$0")/.."
py=.venv/bin/python
$py benchmarks/readme_main_job.py --write             # README.md, docs/training.md: the main job, its sample, maps
$py benchmarks/seq2seq_runs.py --write                # docs/training.md: train-seq2seq and translate
$py benchmarks/pasted_outputs.py --data "$data" --write   # every other pasted output: DDP, bench, training table
$py benchmarks/audit_infer_docs.py                    # docs/audit.md: the --infer example and its timing
$py benchmarks/audit_docs_tables.py                   # docs/audit.md: every other printed report
$py benchmarks/audit_findings.py                      # docs/audit-findings.md: every finding re-checked
$py benchmarks/audit_kernel_gallery.py                # docs/audit-kernels.md: each planted kernel and its report
$py benchmarks/audit_cost.py                          # docs/audit.md: the default audit's cost against budget='quick'
$py benchmarks/audit_torch_kernels.py --jobs 2        # docs/audit-torch-kernels.md: SDPA's backends, FlexAttention's mods
$py benchmarks/audit_gpu.py || [ $? -eq 2 ]           # docs/audit-gpu.md, on a CUDA machine (exit 2 elsewhere: the page says so)
$py benchmarks/time_to_quality.py --data "$data" --rounds 3 --optimizer muon --optimizer adamw --write docs/lab/time-to-quality.md --readme README.md
# docs/lab/time-to-quality.md: quality per token of each optimizer, 3 seeds (one thread a run: load-independent)
$py benchmarks/quality_per_token.py --data "$data" --seeds 1337 1338 1339 --write docs/lab/time-to-quality.md optimizer=adamw
$py benchmarks/quality_per_token.py --data "$data" --seeds 1337 1338 1339 --write docs/lab/time-to-quality.md optimizer=muon
$py benchmarks/main_job_profile.py --data "$data" --write docs/lab/time-to-quality.md   # where its time goes
$py benchmarks/contention.py --data "$data" --rounds 3 --write docs/training.md --readme README.md  # busy machine
$py benchmarks/bench.py attention --write docs/lab/benchmarks.md --readme README.md          # MHA vs torch's
$py benchmarks/audit_hf_sweep.py --jobs 2             # docs/audit-hf-sweep.md
bash benchmarks/library_envs.sh                       # .venv-litgpt; timm and open_clip without torchvision
for lib in diffusers open_clip timm x_transformers; do   # docs/audit-<library>-sweep.md
    $py benchmarks/audit_library_sweep.py $lib --dtypes float32
done
$py benchmarks/audit_library_sweep.py torchtune      # float64 too: its page shows finding 2 (rope tables in float32)
.venv-litgpt/bin/python benchmarks/audit_library_sweep.py litgpt --dtypes float32
$py benchmarks/audit_library_docs.py                  # docs/audit.md: each library's zero-line audit
.venv-litgpt/bin/python benchmarks/audit_library_docs.py litgpt
$py benchmarks/audit_findings.py --library open_clip_torch   # docs/audit-findings.md: findings outside the extras
$py benchmarks/audit_findings.py --library timm
.venv-litgpt/bin/python benchmarks/audit_findings.py --library litgpt
bash benchmarks/hf_oldest_env.sh && .venv-hf-oldest/bin/python benchmarks/audit_hf_sweep.py --jobs 2 --oldest --models bert,codegen,gpt2,gpt_neo,gptj,llama,vit  # docs/audit-hf-sweep-oldest.md
$py benchmarks/reliability_cases.py --write          # docs/reliability.md: every case tried (as root: all rows)
$py benchmarks/lr_sweep.py --data "$data" --jobs 2 --write    # docs/lab/lr-sweep.md: the learning-rate sweep (one thread a run: load-independent)
