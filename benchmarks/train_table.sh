#!/bin/bash
# The training throughput table of docs/training.md: tokens/s for 1 and 2 processes (one thread each), with
# and without --compile, at the baby and seed presets, one run each, in the table's order.
#   bash benchmarks/train_table.sh path/to/tinyshakespeare.txt
# Runs from the checkout's .venv; writes its runs under a temporary directory and removes them.
set -euo pipefail
data=${1:?usage: bash benchmarks/train_table.sh DATA.txt}
cd "$(dirname "$0")/.."
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
for preset in baby seed; do
  if [ "$preset" = baby ]; then iters=200; else iters=8; fi
  for procs in 1 2; do
    for compile in --no-compile --compile; do
      args=(train --data "$data" --preset "$preset" --max-iters "$iters" --eval-interval 1000 --eval-iters 1
            --sample-tokens 0 --no-progress --batch-size 12 "$compile" --out "$runs/$preset-$procs$compile")
      if [ "$procs" = 1 ]; then
        line=$(OMP_NUM_THREADS=1 .venv/bin/typed-transformer "${args[@]}" 2>&1 | grep '^throughput')
      else
        line=$(.venv/bin/torchrun --standalone --nproc-per-node 2 -m typed_transformer "${args[@]}" 2>&1 \
               | grep '^throughput')
      fi
      echo "$preset $procs process(es) $compile | $line"
    done
  done
done
