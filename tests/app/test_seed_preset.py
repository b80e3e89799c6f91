"""The ``seed`` preset is the original tutorial's character model as its training log prints it: the module tree
(``tests.support.tutorial_gpt.TUTORIAL_TREE``, the tutorial's names; six heads of separate key/query/value linears
where this library has one fused projection), compared layer by layer with the tree of
``GPT(GPTConfig.preset("seed", 65))``."""

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.support.cli import TEXT
from tests.support.tutorial_gpt import TUTORIAL_TREE
from typed_transformer.checkpoint import load_checkpoint
from typed_transformer.cli import main
from typed_transformer.gpt import GPT, Block, GPTConfig
from typed_transformer.positions import LearnedPositionalEmbedding

LEAF = re.compile(r"^(?P<indent> *)\((?P<name>[\w-]+)\): (?:(?P<times>\d+) x )?(?P<kind>\w+)\((?P<args>.*)\)$")
OPEN = re.compile(r"^(?P<indent> *)\((?P<name>[\w-]+)\): (?:(?P<times>\d+) x )?(?P<kind>\w+)\($")


def parse_tree(text: str) -> list[dict[str, Any]]:
    """The printed tree's leaves in order, each with the path of its parents and its repeat count (``6 x
    Head``); a repeated module is listed once with ``times``."""
    leaves: list[dict[str, Any]] = []
    stack: list[tuple[int, str, int]] = []  # (indent, name, times)
    for line in text.splitlines()[1:]:
        if not line.strip() or line.strip() == ")":
            if line.strip() == ")" and stack:
                stack.pop()
            continue
        opened, leaf = OPEN.match(line), LEAF.match(line)
        match = opened or leaf
        assert match is not None, line
        times = int(match["times"] or 1)
        if opened:
            stack.append((len(match["indent"]), match["name"], times))
            continue
        repeat = times
        for _, _, outer in stack:
            repeat *= outer
        leaves.append({"path": [name for _, name, _ in stack] + [match["name"]], "kind": match["kind"],
                       "args": match["args"], "times": repeat})
    return leaves


def describe_printout(leaves: list[dict[str, Any]]) -> dict[str, Any]:
    """Sizes, biases, activation and dropouts of the tutorial's model, in this library's vocabulary."""
    def linear(args: str) -> tuple[int, int, bool]:
        m = re.fullmatch(r"in_features=(\d+), out_features=(\d+), bias=(True|False)", args)
        assert m is not None
        return int(m[1]), int(m[2]), m[3] == "True"

    def norm(args: str) -> tuple[int, float, bool]:
        m = re.fullmatch(r"\((\d+),\), eps=([\d.e-]+), elementwise_affine=(True|False)", args)
        assert m is not None
        return int(m[1]), float(m[2]), m[3] == "True"

    top = {leaf["path"][0]: leaf for leaf in leaves if len(leaf["path"]) == 1}
    blocks: dict[str, dict[str, Any]] = {}
    for leaf in leaves:
        if leaf["path"][0] != "blocks":
            continue
        block = blocks.setdefault(leaf["path"][1], {"qkv": [], "norms": [], "feed_forward": []})
        name, kind = leaf["path"][-1], leaf["kind"]
        if name in ("key", "query", "value"):
            fan_in, fan_out, bias = linear(leaf["args"])
            block["qkv"].append((fan_in, fan_out * leaf["times"], bias))
        elif "heads" in leaf["path"] and kind == "Dropout":
            block["attention_weights_dropout"] = float(leaf["args"].removeprefix("p=").split(",")[0])
        elif name == "proj":
            block["out_proj"] = linear(leaf["args"])
        elif leaf["path"][-2:] == ["sa", "dropout"]:
            block["attention_dropout"] = float(leaf["args"].removeprefix("p=").split(",")[0])
        elif "network" in leaf["path"]:
            if kind == "Linear":
                block["feed_forward"].append(linear(leaf["args"]))
            elif kind == "Dropout":
                block["feed_forward_dropout"] = float(leaf["args"].removeprefix("p=").split(",")[0])
            else:
                block["feed_forward"].append(kind.lower())
        elif kind == "LayerNorm":
            block["norms"].append(norm(leaf["args"]))
    for block in blocks.values():  # key, query and value of every head: one (in, 3 * out) projection
        fan_ins = {q[0] for q in block["qkv"]}
        biases = {q[2] for q in block["qkv"]}
        assert len(fan_ins) == len(biases) == 1
        block["qkv"] = (fan_ins.pop(), sum(q[1] for q in block["qkv"]), biases.pop())
    emb = re.fullmatch(r"(\d+), (\d+)", top["token_embedding_table"]["args"])
    pos = re.fullmatch(r"(\d+), (\d+)", top["position_embedding_table"]["args"])
    assert emb is not None
    assert pos is not None
    dropouts = [leaf for leaf in leaves if len(leaf["path"]) == 1 and leaf["kind"] == "Dropout"]
    embedding_dropout = float(dropouts[0]["args"].removeprefix("p=").split(",")[0]) if dropouts else 0.0
    return {"embedding": (int(emb[1]), int(emb[2])), "positions": (int(pos[1]), int(pos[2])),
            "embedding_dropout": embedding_dropout, "blocks": list(blocks.values()),
            "final_norm": norm(top["ln_f"]["args"]), "lm_head": linear(top["lm_head"]["args"])}


def printout_parameters(leaves: list[dict[str, Any]]) -> int:
    """Parameters of the printed model, counted from the printed sizes alone."""
    total = 0
    for leaf in leaves:
        numbers = [int(n) for n in re.findall(r"\d+", leaf["args"].split("eps")[0])]
        if leaf["kind"] == "Embedding":
            total += numbers[0] * numbers[1] * leaf["times"]
        elif leaf["kind"] == "Linear":
            fan_in, fan_out, bias = numbers[0], numbers[1], "bias=True" in leaf["args"]
            total += (fan_in * fan_out + fan_out * bias) * leaf["times"]
        elif leaf["kind"] == "LayerNorm":
            total += 2 * numbers[0] * leaf["times"] if "elementwise_affine=True" in leaf["args"] else 0
    return total


def describe_model(model: GPT) -> dict[str, Any]:
    """The same description, read from this library's module tree."""
    def linear(module: nn.Linear) -> tuple[int, int, bool]:
        return module.in_features, module.out_features, module.bias is not None

    def norm(module: nn.LayerNorm) -> tuple[int, float, bool]:
        affine = module.weight is not None and module.bias is not None  # torch's elementwise_affine with a bias
        return module.normalized_shape[0], module.eps, affine

    activations = {torch.nn.functional.relu: "relu", torch.nn.functional.gelu: "gelu"}
    blocks = []
    for block in model.blocks:
        assert isinstance(block, Block)
        assert block.attn.in_proj is not None
        blocks.append({
            "qkv": linear(block.attn.in_proj),
            "attention_weights_dropout": block.attn.dropout,
            "out_proj": linear(block.attn.out_proj),
            "attention_dropout": block.resid_dropout.p,
            "feed_forward": [linear(block.mlp.linear1), activations.get(block.mlp.activation, "other"),
                             linear(block.mlp.linear2)],
            "feed_forward_dropout": block.mlp_dropout.p,
            "norms": [norm(block.ln_1), norm(block.ln_2)],
        })
        assert block.mlp.dropout.p == 0.0  # dropout sits on the residual branch, after linear2, as printed
    assert isinstance(model.pos, LearnedPositionalEmbedding)
    return {"embedding": tuple(model.tok_emb.weight.shape), "positions": tuple(model.pos.weight.shape),
            "embedding_dropout": model.drop.p, "blocks": blocks, "final_norm": norm(model.ln_f),
            "lm_head": linear(model.lm_head)}


def test_the_printout_parses_into_six_blocks_of_six_heads() -> None:
    leaves = parse_tree(TUTORIAL_TREE)
    described = describe_printout(leaves)
    assert len(described["blocks"]) == 6
    assert described["blocks"][0]["qkv"] == (384, 3 * 6 * 64, False)
    assert described["blocks"][0]["feed_forward"] == [(384, 1536, True), "relu", (1536, 384, True)]
    assert printout_parameters(leaves) == 10_788_929  # the tutorial's "10.788929 M parameters"


def test_seed_preset_has_the_printed_module_tree() -> None:
    model = GPT(GPTConfig.preset("seed", 65))
    assert describe_model(model) == describe_printout(parse_tree(TUTORIAL_TREE))
    assert model.lm_head.weight is not model.tok_emb.weight  # untied, as printed (its own Linear with a bias)


def test_seed_preset_has_the_printed_parameter_count() -> None:
    model = GPT(GPTConfig.preset("seed", 65))
    unique = {id(p): p.numel() for p in model.parameters()}
    assert sum(unique.values()) == model.num_parameters(non_embedding=False) == 10_788_929
    assert printout_parameters(parse_tree(TUTORIAL_TREE)) == 10_788_929
    assert model.num_parameters() == 10_788_929 - 256 * 384  # nanoGPT's count leaves the position table out
    assert f"{model.num_parameters(non_embedding=False) / 1e6} M parameters" == "10.788929 M parameters"


def test_a_changed_model_no_longer_matches_the_printout() -> None:
    """The comparison can fail: each switch of the preset, flipped back, breaks it."""
    printed = describe_printout(parse_tree(TUTORIAL_TREE))
    for change in ({"activation": "gelu"}, {"qkv_bias": True}, {"bias": False}, {"lm_head_bias": False},
                   {"dropout": 0.1}, {"embd_dropout": 0.2}):
        assert describe_model(GPT(GPTConfig.preset("seed", 65, **change))) != printed, change


# ---------------------------------------------------------------------------------------------------
# From the command line and a config file
# ---------------------------------------------------------------------------------------------------

SMALL = ["--max-iters", "1", "--n-layer", "1", "--n-embd", "12", "--n-head", "2", "--block-size", "8",
         "--batch-size", "2", "--eval-iters", "1", "--sample-tokens", "0", "--no-progress", "--peak-flops", "1e9"]


def test_train_seed_preset_builds_the_printed_model_and_verbose_prints_its_tree(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert main(["train", "--preset", "seed", "--data", str(text), *SMALL, "--verbose", "--out",
                 str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "(linear1): Linear(in_features=12, out_features=48, bias=True)" in err
    assert "(in_proj): Linear(in_features=12, out_features=36, bias=False)" in err
    assert "(out_proj): Linear(in_features=12, out_features=12, bias=True)" in err
    assert "activation=relu" in err
    assert "(lm_head): Linear(in_features=12, out_features=26, bias=True)" in err
    model = load_checkpoint(tmp_path / "run").model
    config = model.config
    assert (config.activation, config.bias, config.qkv_bias, config.lm_head_bias, config.tie_weights) == (
        "relu", True, False, True, False)
    assert (config.dropout, config.embd_dropout) == (0.2, 0.0)
    # the tutorial's own count line, `print(sum(p.numel() for p in m.parameters())/1e6, 'M parameters')`
    assert f"\n{model.num_parameters(non_embedding=False) / 1e6} M parameters\n" in err


def test_bias_tie_and_activation_switches_from_flags_and_a_config_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    toml = tmp_path / "run.toml"
    toml.write_text('tie_weights = false\nactivation = "relu"\nlm_head_bias = true\n', encoding="utf-8")
    assert main(["train", "--config", str(toml), "--data", str(text), *SMALL, "--qkv-bias", "--out",
                 str(tmp_path / "a")]) == 0
    config = load_checkpoint(tmp_path / "a").model.config
    assert (config.tie_weights, config.activation, config.lm_head_bias, config.qkv_bias, config.bias) == (
        False, "relu", True, True, False)
    assert main(["train", "--data", str(text), *SMALL, "--tie-weights", "--out", str(tmp_path / "b")]) == 0
    model = load_checkpoint(tmp_path / "b").model
    assert model.lm_head.weight is model.tok_emb.weight
    toml.write_text('tie_weights = "no"\n', encoding="utf-8")
    assert main(["train", "--config", str(toml), "--data", str(text), *SMALL, "--out", str(tmp_path / "c")]) == 2
    assert f"--config {toml}: tie_weights: expected true or false, got 'no'" in capsys.readouterr().err
