"""The nanoGPT-equivalent model the benchmarks compare against, in plain torch (a script module, not library code).

It imports torch alone, so that the reference loop (``nanogpt_reference.py``) pays for no import of this package
in its wall time, as nanoGPT's own ``train.py`` does not.
"""

import torch
from torch import Tensor, nn

__all__ = ["BaselineGPT"]


class _BaselineBlock(nn.Module):
    """nanoGPT's block in plain torch: fused qkv Linear + F.scaled_dot_product_attention, pre-LN, GELU MLP."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln_1 = nn.LayerNorm(n_embd, bias=False)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.ln_2 = nn.LayerNorm(n_embd, bias=False)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd, bias=False), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd, bias=False), nn.Dropout(dropout))
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        x = x + self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))
        out: Tensor = x + self.mlp(self.ln_2(x))
        return out


class BaselineGPT(nn.Module):
    """The nanoGPT-equivalent model the GPT benchmark compares against (same sizes, same torch)."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(_BaselineBlock(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=False)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: Tensor, targets: Tensor) -> Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss: Tensor = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return loss
