"""GPT-2 interop: a small randomly initialised Hugging Face GPT2LMHeadModel (no download) loads into GPT."""

import pytest
import torch

from typed_transformer.gpt import GPT

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_model() -> object:
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=0, eos_token_id=1)
    return transformers.GPT2LMHeadModel(config).eval()


def test_logits_equal_within_1e_5(hf_model: object) -> None:
    ours = GPT.from_hf_gpt2(hf_model).eval()
    assert ours.config.activation == "gelu_tanh"
    assert ours.lm_head.weight is ours.tok_emb.weight
    idx = torch.randint(0, 50, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_model(idx).logits  # type: ignore[operator]
        got, _ = ours(idx, all_positions=True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_greedy_generations_equal(hf_model: object) -> None:
    ours = GPT.from_hf_gpt2(hf_model).eval()
    prompt = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    want = hf_model.generate(prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False,  # type: ignore[attr-defined]
                             pad_token_id=1, eos_token_id=None)
    got = ours.generate(prompt, 20, greedy=True)
    assert torch.equal(got, want)


def test_state_dict_needs_the_head_count(hf_model: object) -> None:
    state = hf_model.state_dict()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="n_head"):
        GPT.from_hf_gpt2(state)
    from_state = GPT.from_hf_gpt2(state, n_head=4).eval()
    from_model = GPT.from_hf_gpt2(hf_model).eval()
    idx = torch.randint(0, 50, (1, 7))
    assert torch.equal(from_state(idx)[0], from_model(idx)[0])
    with pytest.raises(ValueError, match="not a GPT-2 state dict"):
        GPT.from_hf_gpt2({"x": torch.zeros(1)}, n_head=4)
