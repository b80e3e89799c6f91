"""Sampling text from a trained GPT: the prompts a run samples from, and ``torch.compile`` for generation.

:meth:`GPT.generate <typed_transformer.gpt.GPT.generate>` is the sampler itself (temperature, top-k, top-p,
greedy, the KV cache, left-padded prompts); this module holds what the application adds around it:
:func:`sample_text` turns a tokenizer and a seed into text (the end-of-run sample of ``train``),
:func:`continue_prompts` continues several prompts in one padded batch (the ``generate`` command with several
prompts), :func:`stream_prompt` continues one prompt a character at a time (``generate`` with one prompt) and
:func:`compile_for_generation` compiles a model's forward pass for many cached steps (``generate --compile``).
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .data import CharTokenizer, left_pad
from .gpt import GPT

__all__ = ["compile_for_generation", "continue_prompts", "default_prompt", "sample_text", "stream_prompt"]


def default_prompt(tokenizer: CharTokenizer) -> str:
    """The text a run's sample starts from: a newline when the vocabulary has one, else its first character."""
    return "\n" if "\n" in tokenizer.chars else tokenizer.chars[0]


def sample_text(model: GPT, tokenizer: CharTokenizer, tokens: int, *, seed: int, device: str = "cpu",
                prompt: str | None = None,
                autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext) -> str:
    """``tokens`` sampled characters after ``prompt`` (default :func:`default_prompt`), drawn with a generator
    seeded with ``seed`` (the global random state is untouched), in eval mode under ``autocast()`` (default: none);
    the model's training mode is restored. The prompt is not part of the returned text."""
    text = default_prompt(tokenizer) if prompt is None else prompt
    ids = torch.tensor([tokenizer.encode(text)], device=device)
    was_training = model.training
    with autocast():
        generated = model.eval().generate(ids, tokens, generator=torch.Generator(device=device).manual_seed(seed))
    model.train(was_training)
    return tokenizer.decode(generated[0, ids.shape[1]:].cpu())


def continue_prompts(model: GPT, tokenizer: CharTokenizer, prompts: list[str], max_new_tokens: int, *, seed: int,
                     device: str = "cpu", **sampling: Any) -> list[str]:
    """Each prompt followed by ``max_new_tokens`` sampled characters, all prompts in one left-padded batch.

    Each prompt has its own generator seeded with ``seed``, so each continues exactly as it would alone.
    ``sampling`` goes to :meth:`GPT.generate` (``temperature``, ``top_k``, ``top_p``, ``greedy``). The returned
    texts include their prompts.
    """
    ids, lengths = left_pad([tokenizer.encode(p) for p in prompts], device=device)
    generators = [torch.Generator(device=device).manual_seed(seed) for _ in prompts]
    out = model.generate(ids, max_new_tokens, generator=generators, lengths=lengths, **sampling)
    return [tokenizer.decode(out[i, ids.shape[1] - n:].cpu()) for i, n in enumerate(lengths.tolist())]


def stream_prompt(model: GPT, tokenizer: CharTokenizer, prompt: str, max_new_tokens: int, *, seed: int,
                  device: str = "cpu", **sampling: Any) -> Iterator[str]:
    """The characters :func:`continue_prompts` appends to ``prompt`` (the same seed gives the same text), each
    yielded as soon as it is sampled (:meth:`GPT.stream <typed_transformer.gpt.GPT.stream>`)."""
    ids = torch.tensor([tokenizer.encode(prompt)], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for next_id in model.stream(ids, max_new_tokens, generator=generator, **sampling):
        yield tokenizer.decode(next_id[0].cpu())


def compile_for_generation(model: GPT, *, backend: str = "inductor", max_autotune: bool = True) -> GPT:
    """``model`` with its ``forward`` compiled by ``torch.compile`` for :meth:`GPT.generate`; returns the same model.

    :meth:`GPT.generate` stays eager and checks its arguments at the call; the compiled forward passes run without
    checks. Shapes are dynamic where they change (the cache length after the first step, the window length
    without the cache), so a generation compiles a handful of graphs, not one per step.

    With the ``"inductor"`` backend the weights are *frozen* into the compiled code (inductor's ``freezing``,
    applied only around this model's calls; it needs ``no_grad``, which ``generate`` has) and, with
    ``max_autotune``, each matrix-vector product of a cached step is benchmarked against inductor's own C++
    kernel, which on CPU reads the weights several times faster than the BLAS call eager mode makes (the
    cached step is bound by reading every weight once; see ``benchmarks/bench.py gpt`` in the repository). So: compile
    after the weights are final; a compiled model whose weights then change keeps generating with the old ones.
    The first generation pays the compilation (tens of seconds on CPU).
    """
    import torch._inductor.config as inductor_config

    compiled = torch.compile(model.forward, backend=backend)
    if backend != "inductor":
        model.forward = compiled  # type: ignore[method-assign]
        return model
    # Inductor settings for this model's compilations only (they happen during its calls), not process-wide.
    # Autotuning reports each benchmark on stderr by default: quiet here, generation output is the user's.
    settings = {"freezing": True, "max_autotune": max_autotune, "max_autotune_report_choices_stats": False,
                "autotune_num_choices_displayed": 0}

    def forward(*args: Any, **kwargs: Any) -> Any:
        with inductor_config.patch(settings):
            return compiled(*args, **kwargs)

    model.forward = forward  # type: ignore[method-assign]
    return model
