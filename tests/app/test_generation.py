"""The generation module: the end-of-run sample, several prompts in one batch, the old import path."""

import pytest
import torch

from typed_transformer.data import CharTokenizer
from typed_transformer.generation import compile_for_generation, continue_prompts, default_prompt, sample_text
from typed_transformer.gpt import GPT, GPTConfig

TOKENIZER = CharTokenizer.from_text("abc de\nfg")


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=TOKENIZER.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8))


def test_default_prompt_is_a_newline_when_the_vocabulary_has_one() -> None:
    assert default_prompt(TOKENIZER) == "\n"
    assert default_prompt(CharTokenizer.from_text("xyz")) == "x"


def test_sample_text_is_generate_with_its_own_generator_and_restores_the_mode() -> None:
    model = _model().train()
    state = torch.get_rng_state()
    text = sample_text(model, TOKENIZER, 12, seed=3)
    assert model.training
    assert torch.equal(torch.get_rng_state(), state)  # the global stream is untouched
    want = model.eval().generate(torch.tensor([TOKENIZER.encode("\n")]), 12,
                                 generator=torch.Generator().manual_seed(3))
    assert text == TOKENIZER.decode(want[0, 1:])
    assert len(text) == 12


def test_continue_prompts_continues_each_prompt_as_it_would_alone() -> None:
    model = _model().eval()
    prompts = ["a", "fg de", "\nb"]
    together = continue_prompts(model, TOKENIZER, prompts, 10, seed=5, temperature=0.8, top_k=4)
    for prompt, text in zip(prompts, together, strict=True):
        alone = model.generate(torch.tensor([TOKENIZER.encode(prompt)]), 10, temperature=0.8, top_k=4,
                               generator=torch.Generator().manual_seed(5))
        assert text == TOKENIZER.decode(alone[0])
        assert text.startswith(prompt)
        assert len(text) == len(prompt) + 10


def test_the_old_import_path_warns_and_gives_the_same_function() -> None:
    import typed_transformer.training as training

    with pytest.warns(DeprecationWarning, match="typed_transformer.generation.compile_for_generation"):
        old = training.compile_for_generation
    assert old is compile_for_generation
