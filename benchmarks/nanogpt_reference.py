"""nanoGPT's CPU "baby GPT" run as a plain PyTorch loop: the reference the contention and time-to-quality
benchmarks compare the main job against (a script, not library code).

It follows nanoGPT's ``train.py`` with ``config/train_shakespeare_char.py`` and the README's CPU settings
(``--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4
--n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0``): the model of
``benchmarks/baseline.py``'s ``BaselineGPT`` (pre-LN, fused qkv, ``scaled_dot_product_attention``, no biases, tied
head) with nanoGPT's initialisation, character vocabulary of the whole text, first 90 % train / last 10 % val,
``torch.randint`` batches from the global generator, AdamW (betas 0.9/0.99, weight decay 0.1 on matrices only),
learning rate 1e-3 with 100 warm-up iterations and a cosine decay to 1e-4 at 2000, gradient clipping at 1.0,
an evaluation of ``eval_iters`` batches per split at iteration 0 and every 250, and the last step at
``max_iters`` after its evaluation, as nanoGPT's loop does. It leaves torch's thread count alone (one
intra-op thread per core, nanoGPT's default) unless ``--threads N``. It does not write checkpoints.

    python benchmarks/nanogpt_reference.py --data tinyshakespeare.txt [--max-iters 2000] [--threads N]

prints ``iter N: train loss X, val loss Y`` at each evaluation (flushed, so a parent can time the lines) and
``done: iteration N`` at the end.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script
from benchmarks.baseline import BaselineGPT


def nanogpt_init(model: BaselineGPT, n_layer: int) -> None:
    """nanoGPT's ``_init_weights`` and its scaled residual projections (``c_proj.weight``)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                torch.nn.init.zeros_(module.bias)
    for name, parameter in model.named_parameters():  # attn.c_proj and mlp.c_proj (mlp.2 here)
        if name.endswith(("c_proj.weight", "mlp.2.weight")):
            torch.nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))


def learning_rate(iteration: int, *, peak: float = 1e-3, low: float = 1e-4, warmup: int = 100,
                  decay: int = 2000) -> float:
    """nanoGPT's ``get_lr``: linear warm-up, cosine decay to ``low`` at ``decay``, then ``low``."""
    if iteration < warmup:
        return peak * (iteration + 1) / (warmup + 1)
    if iteration > decay:
        return low
    ratio = (iteration - warmup) / (decay - warmup)
    return low + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - low)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--max-iters", type=int, default=2000)
    parser.add_argument("--lr-decay-iters", type=int, default=2000)
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument("--eval-iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    block_size, batch_size, n_layer, n_head, n_embd = 64, 12, 4, 4, 128

    text = args.data.read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(ids))
    splits = {"train": ids[:split], "val": ids[split:]}

    torch.manual_seed(1337)

    def get_batch(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = splits[name]
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([data[i:i + block_size] for i in ix.tolist()])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix.tolist()])
        return x, y

    model = BaselineGPT(len(chars), block_size, n_layer, n_head, n_embd, 0.0)
    nanogpt_init(model, n_layer)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.99))

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        out = {name: sum(float(model(*get_batch(name))) for _ in range(args.eval_iters)) / args.eval_iters
               for name in ("train", "val")}
        model.train()
        return out

    started = time.perf_counter()
    iteration = 0
    x, y = get_batch("train")
    while True:
        lr = learning_rate(iteration, decay=args.lr_decay_iters)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if iteration % args.eval_interval == 0:
            losses = estimate_loss()
            print(f"iter {iteration:5d}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
        loss = model(x, y)
        x, y = get_batch("train")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss)  # nanoGPT's log_interval=1: loss.item() every step
        iteration += 1
        if iteration > args.max_iters:
            break
    print(f"done: iteration {args.max_iters}, {torch.get_num_threads()} threads, "
          f"{time.perf_counter() - started:.1f} s in the loop", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
