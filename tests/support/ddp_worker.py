"""A ``torch.multiprocessing.spawn`` target for tests/app/test_scale.py: one gloo rank training tiny models."""

import io
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from typed_transformer.data import TextData
from typed_transformer.gpt import GPT, GPTConfig
from typed_transformer.training import TrainConfig, train


def tiny_model(vocab_size: int) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab_size, block_size=8, n_layer=2, n_head=2, n_embd=16))


def run_rank(rank: int, world: int, init_file: str, root: str, text: str, runs: dict[str, dict[str, Any]]) -> None:
    """Train one tiny model per entry of ``runs`` (name -> TrainConfig fields) in the gloo group; rank 0
    saves ``{"losses", "state"}`` to ``root/name/result.pt``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for name, fields in runs.items():
            data = TextData.from_text(text, 8)
            model = tiny_model(data.tokenizer.vocab_size)
            out = Path(root) / name
            result = train(model, data, TrainConfig(**fields), out, progress=False, log=io.StringIO(),
                           peak_flops=1e9)
            if rank == 0:
                torch.save({"losses": result.losses, "state": model.state_dict()}, out / "result.pt")
            torch.save(model.state_dict(), out / f"state.rank{rank}.pt")  # each rank's weights, to compare
    finally:
        dist.destroy_process_group()
