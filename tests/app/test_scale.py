"""Training past one process (issue 11): DDP under torch.distributed equals the one-process loop, gradient
accumulation equals one big batch, any model size and --config, --compile, --dtype, tokens/s and MFU."""

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from jaxtyping import TypeCheckError
from torch.multiprocessing.spawn import spawn

from benchmarks._runs import torchrun_workers
from tests.support.cli import run
from tests.support.ddp_worker import run_rank, tiny_model
from tests.support.limits import HANG_SECONDS
from typed_transformer.checkpoint import CHECKPOINT_NAME, load_checkpoint
from typed_transformer.data import TextData
from typed_transformer.generation import compile_for_generation
from typed_transformer.gpt import GPT, GPTConfig
from typed_transformer.training import TrainConfig, TrainResult, flops_per_token, train

TEXT = "the quick brown fox jumps over the lazy dog.\n" * 12
#: 5 steps of a global batch of 12; evaluations only at the start and the end.
FIVE_STEPS: dict[str, Any] = {"max_iters": 5, "batch_size": 12, "eval_interval": 100, "eval_iters": 1,
                              "checkpoint_interval": 100, "warmup_iters": 1, "sample_tokens": 0,
                              "learning_rate": 3e-3, "min_lr": 3e-4}
RTOL, ATOL = 1e-5, 1e-6  # float32: the same sums in another order
#: Weights after 5 AdamW steps: Adam divides each gradient by its running RMS, so a gradient entry that is
#: nearly zero turns a float32 rounding difference into a visible one (still 100x below one step of 3e-3).
WEIGHTS_RTOL, WEIGHTS_ATOL = 1e-4, 2e-5


def single_process(tmp_path: Path, **overrides: Any) -> tuple[TrainResult, GPT]:
    data = TextData.from_text(TEXT, 8)
    model = tiny_model(data.tokenizer.vocab_size)
    result = train(model, data, TrainConfig(**{**FIVE_STEPS, **overrides}), tmp_path, progress=False,
                   log=io.StringIO(), peak_flops=1e9)
    return result, model


def assert_close_states(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        def describe(message: str, name: str = name) -> str:
            return f"{name}: {message}"

        torch.testing.assert_close(a[name], b[name], rtol=WEIGHTS_RTOL, atol=WEIGHTS_ATOL, msg=describe)


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Two gloo processes (torch.multiprocessing), 5 steps each of: batch 12 (6 per rank), and batch 12 with
    grad_accum 2 (2 micro-batches of 3 per rank)."""
    root = tmp_path_factory.mktemp("ddp")
    runs = {"plain": FIVE_STEPS, "accum": {**FIVE_STEPS, "grad_accum": 2}, "muon": {**FIVE_STEPS, "optimizer": "muon"}}
    spawn(run_rank, args=(2, str(root / "init"), str(root), TEXT, runs), nprocs=2,  # type: ignore[no-untyped-call]
          join=True)
    return {name: {**torch.load(root / name / "result.pt"),
                   "ranks": [torch.load(root / name / f"state.rank{rank}.pt") for rank in range(2)]} for name in runs}


def test_two_ddp_processes_equal_one_process(ddp_results: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    result, model = single_process(tmp_path)
    assert len(result.losses or []) == 5
    torch.testing.assert_close(torch.tensor(ddp_results["plain"]["losses"]), torch.tensor(result.losses),
                               rtol=RTOL, atol=ATOL)
    assert_close_states(ddp_results["plain"]["state"], model.state_dict())


def test_ddp_with_gradient_accumulation_equals_one_process(ddp_results: dict[str, dict[str, Any]],
                                                           tmp_path: Path) -> None:
    result, model = single_process(tmp_path)
    torch.testing.assert_close(torch.tensor(ddp_results["accum"]["losses"]), torch.tensor(result.losses),
                               rtol=RTOL, atol=ATOL)
    assert_close_states(ddp_results["accum"]["state"], model.state_dict())


def test_two_ddp_processes_with_muon_equal_one_process(ddp_results: dict[str, dict[str, Any]],
                                                       tmp_path: Path) -> None:
    """Muon orthogonalises the all-reduced gradient on each rank: the ranks' weights are the same bit for bit,
    and those of one process up to float32 summation order."""
    result, model = single_process(tmp_path, optimizer="muon")
    torch.testing.assert_close(torch.tensor(ddp_results["muon"]["losses"]), torch.tensor(result.losses),
                               rtol=RTOL, atol=ATOL)
    assert_close_states(ddp_results["muon"]["state"], model.state_dict())
    first, second = ddp_results["muon"]["ranks"]
    assert all(torch.equal(first[name], second[name]) for name in first)
    adamw, _ = single_process(tmp_path / "adamw")  # and the optimizer was Muon: AdamW's steps differ
    assert not torch.allclose(torch.tensor(adamw.losses), torch.tensor(result.losses))


def test_gradient_accumulation_equals_one_big_batch(tmp_path: Path) -> None:
    big, big_model = single_process(tmp_path / "big")
    accumulated, accumulated_model = single_process(tmp_path / "accum", grad_accum=2)
    torch.testing.assert_close(torch.tensor(accumulated.losses), torch.tensor(big.losses), rtol=RTOL, atol=ATOL)
    assert_close_states(accumulated_model.state_dict(), big_model.state_dict())
    # and it is not trivially equal: another batch size gives other losses
    other, _ = single_process(tmp_path / "other", batch_size=6)
    assert not torch.allclose(torch.tensor(other.losses), torch.tensor(big.losses))


def test_a_batch_that_does_not_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batch_size=12 is not divisible by grad_accum=5"):
        TrainConfig(**{**FIVE_STEPS, "grad_accum": 5})


def test_compiled_training_equals_eager(tmp_path: Path) -> None:
    eager, eager_model = single_process(tmp_path / "eager")
    data = TextData.from_text(TEXT, 8)
    model = tiny_model(data.tokenizer.vocab_size)
    compiled = train(model, data, TrainConfig(**{**FIVE_STEPS, "compile": True}), tmp_path / "compiled",
                     progress=False, log=io.StringIO(), peak_flops=1e9, compile_backend="aot_eager")
    torch.testing.assert_close(torch.tensor(compiled.losses), torch.tensor(eager.losses), rtol=1e-4, atol=1e-5)
    assert_close_states(model.state_dict(), eager_model.state_dict())
    assert load_checkpoint(tmp_path / "compiled").train_config["compile"] is True


def test_bfloat16_autocast_on_cpu_trains_close_to_float32(tmp_path: Path) -> None:
    fp32, _ = single_process(tmp_path / "fp32", max_iters=2)
    bf16, model = single_process(tmp_path / "bf16", max_iters=2, dtype="bfloat16")
    assert bf16.losses is not None
    assert fp32.losses is not None
    assert all(abs(a - b) < 0.05 for a, b in zip(bf16.losses, fp32.losses, strict=True))
    assert bf16.losses != fp32.losses  # autocast did run in bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the weights stay float32


def test_float16_on_cpu_is_refused(tmp_path: Path) -> None:
    data = TextData.from_text(TEXT, 8)
    with pytest.raises(ValueError, match="dtype float16 needs CUDA"):
        train(tiny_model(data.tokenizer.vocab_size), data, TrainConfig(**{**FIVE_STEPS, "dtype": "float16"}),
              tmp_path, progress=False)


def test_the_measured_peak_is_the_best_window_not_the_mean(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window slowed by another process must not lower the peak that MFU is reported against."""
    import time

    from typed_transformer.training import measure_matmul_flops

    clock = iter([0.0, 0.01, 0.05, 0.2])  # start; 3 windows of 4 matmuls: 10 ms, 40 ms (slowed), 150 ms
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    flops = measure_matmul_flops(size=8, seconds=0.1)
    assert flops == pytest.approx(2 * 8**3 * 4 / 0.01)  # the first window's rate; the mean would be 4x lower


def test_throughput_and_mfu(tmp_path: Path) -> None:
    result, model = single_process(tmp_path)
    c = model.config
    n = sum(p.numel() for p in model.parameters()) - c.block_size * c.n_embd  # tied head once, no positions
    assert flops_per_token(model) == 6 * n + 12 * c.n_layer * c.n_embd * c.block_size
    assert result.tokens_per_second > 0
    assert result.mfu == pytest.approx(flops_per_token(model) * result.tokens_per_second / 1e9)


# ---------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------

TINY = ["--block-size", "8", "--eval-interval", "100", "--eval-iters", "1", "--batch-size", "4",
        "--sample-tokens", "0", "--no-progress", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
        "--peak-flops", "1e9"]


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "input.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_model_size_flags(text: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert run(["train", "--data", str(text), "--max-iters", "2", *TINY, "--n-layer", "3", "--n-kv-heads", "1",
                "--bias", "--dropout", "0.1", "--grad-accum", "2", "--out", str(out)]) == 0
    saved = load_checkpoint(out)
    c = saved.model.config
    assert (c.n_layer, c.n_head, c.kv_heads, c.n_embd, c.bias, c.dropout) == (3, 2, 1, 16, True, 0.1)
    assert saved.train_config["grad_accum"] == 2
    assert saved.model.blocks[0].ln_1.bias is not None  # type: ignore[union-attr]


def test_config_file_with_flags_overriding(text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text('n_layer = 2\nn-embd = 32\nmax_iters = 3\nlr = 0.002\ndtype = "float32"\ngrad_accum = 2\n'
                      'compile = false\nno_progress = true\n', encoding="utf-8")
    out = tmp_path / "run"
    assert run(["train", "--config", str(config), "--data", str(text), *TINY, "--n-layer", "1", "--out", str(out)]) == 0
    saved = load_checkpoint(out)
    assert (saved.model.config.n_layer, saved.model.config.n_embd) == (1, 16)  # both flags win over the file
    assert saved.iteration == 3
    assert (saved.train_config["learning_rate"], saved.train_config["grad_accum"]) == (0.002, 2)
    assert saved.info["config_file"] == str(config)
    err = capsys.readouterr().err
    assert "train: TrainConfig(max_iters=3, batch_size=4, learning_rate=0.002" in err
    assert "grad_accum=2, dtype='float32', compile=False, threads='auto')" in err


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("n_layers = 2\n", "unknown key 'n_layers' (known: activation, backend, batch_size, bias, "),
        ("n_layer = \"2\"\n", "n_layer: expected a number, got '2'"),
        ("n_layer = 2.5\n", "n_layer: expected an integer, got '2.5'"),
        ("n_layer = 0\n", "n_layer: expected an integer from 1 to 1024, got '0'"),
        ("bias = 1\n", "bias: expected true or false, got 1"),
        ("dtype = \"float64\"\n", "dtype: expected one of float32, bfloat16, float16, got 'float64'"),
        ("data = 3\n", "data: expected a path (a string), got 3"),
        ("resume = true\n", "unknown key 'resume'"),
        ("n_layer = \n", "not valid TOML (Invalid value"),
    ],
)
def test_bad_config_files(toml: str, message: str, text: Path, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml, encoding="utf-8")
    assert run(["train", "--config", str(config), "--data", str(text), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"typed-transformer: error: --config {config}: {message}")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--n-head", "3"], "GPTConfig: n_embd=16 is not divisible by n_head=3"),
        (["--n-kv-heads", "3"], "GPTConfig: n_kv_heads=3 must divide n_head=2"),
        (["--grad-accum", "0"], "argument --grad-accum: expected an integer from 1 to 4096, got '0'"),
        (["--grad-accum", "3"], "batch_size=4 is not divisible by grad_accum=3"),
        (["--dtype", "float16"], "--dtype float16 needs --device cuda"),
        (["--dtype", "float64"], "argument --dtype: invalid choice: 'float64'"),
        (["--optimizer", "sgd"], "argument --optimizer: invalid choice: 'sgd'"),
        (["--muon-lr", "0"], "argument --muon-lr: expected a learning rate in (0, 1], got '0'"),
        (["--backend", "nccl"], None),  # ignored without torchrun: a one-process run
        (["--config", "missing.toml"], "--config missing.toml: no such file"),
    ],
)
def test_bad_values_are_one_line(flags: list[str], message: str | None, text: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["train", "--data", str(text), "--max-iters", "1", *TINY, *flags, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0
        return
    assert code == 2
    assert err.count("\n") == 1
    assert message in err
    assert err.startswith("typed-transformer")


def test_bfloat16_on_a_slow_cpu_says_so(text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import typed_transformer.training as training

    speeds = {torch.float32: 100e9, torch.bfloat16: 1e9}
    monkeypatch.setattr(training, "measure_matmul_flops",
                        lambda device="cpu", dtype=torch.float32, **_: speeds[dtype])
    assert run(["train", "--data", str(text), "--max-iters", "1", *TINY, "--dtype", "bfloat16",
                "--out", str(tmp_path / "slow")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == ["note: this CPU has no fast bfloat16 matmul (1.0 GFLOP/s against 100.0 in float32): "
                     "--dtype bfloat16 will train slower than float32 here"]
    speeds[torch.bfloat16] = 200e9
    assert run(["train", "--data", str(text), "--max-iters", "1", *TINY, "--dtype", "bfloat16",
                "--out", str(tmp_path / "fast")]) == 0
    assert "note:" not in capsys.readouterr().err


@pytest.mark.parametrize(("end", "caveat"), [(1e18, False), (2.0, True)])
def test_mfu_is_against_the_higher_of_the_peaks_at_start_and_end_and_never_above_100_unexplained(
        end: float, caveat: bool, text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The peak was measured once, at the start: a load that fell during the run printed ``MFU 139.9%``."""
    import typed_transformer.training as training

    peaks = iter([1.0, end])  # FLOP/s at the start (a loaded machine, absurdly), then at the end
    monkeypatch.setattr(training, "measure_matmul_flops", lambda *_, **__: next(peaks))
    measured = [flag for flag in TINY if flag not in ("--peak-flops", "1e9")]
    assert run(["train", "--data", str(text), "--max-iters", "3", *measured, "--out", str(tmp_path / "run")]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("throughput:")]
    speed = float(line.split()[1].replace(",", ""))
    percent = float(re.search(r"MFU ([0-9.]+)%", line).group(1))  # type: ignore[union-attr]
    model = load_checkpoint(tmp_path / "run" / CHECKPOINT_NAME).model
    assert percent == pytest.approx(100 * flops_per_token(model) * speed / end, rel=1e-2, abs=0.1)
    if caveat:
        assert line.endswith("; above 100 %: the steps ran faster than the matmul peak measured at the start and "
                             "the end (0.0 and 0.0 GFLOP/s: the machine's load changed during the run); give "
                             "--peak-flops for a fixed one")
    else:
        assert "above 100" not in line


def test_throughput_line(text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["train", "--data", str(text), "--max-iters", "2", *TINY, "--out", str(tmp_path / "run")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("throughput:")]
    assert len(lines) == 1
    assert lines[0].endswith("(1 process(es), float32)")
    assert " tokens/s, MFU " in lines[0]
    # One step: the first step of a run is never timed, so there is nothing to report (not "nan tokens/s").
    assert run(["train", "--data", str(text), "--max-iters", "1", *TINY, "--out", str(tmp_path / "one")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("throughput:")]
    assert lines == ["throughput: not measured (it needs two steps or more in this run; 1 process(es), float32)"]


def test_resume_keeps_the_model_size(text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert run(["train", "--data", str(text), "--max-iters", "1", *TINY, "--out", str(out)]) == 0
    capsys.readouterr()
    assert run(["train", "--data", str(text), "--max-iters", "2", *TINY, "--n-layer", "2", "--resume",
                "--out", str(out)]) == 2
    assert "--n-layer 2 differs from the checkpoint's 1" in capsys.readouterr().err


def torchrun(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "typed_transformer", *argv], capture_output=True, text=True, env=env,
                          timeout=HANG_SECONDS, check=False)


def test_resume_of_a_torchrun_run(text: Path, tmp_path: Path) -> None:
    """2 processes for 3 steps, then 2 processes resumed to 5 == one process for 3 steps, resumed to 5. (Not one
    process for 5 straight steps: the preset's warm-up and decay scale with --max-iters, and a resumed run
    stretches the schedule it started with, as docs/reliability.md says.)"""
    flags = ["train", "--data", str(text), *TINY, "--batch-size", "6", "--grad-accum", "3"]
    ddp = tmp_path / "ddp"
    first = torchrun([*flags, "--max-iters", "3", "--out", str(ddp)])
    assert first.returncode == 0, first.stderr[:3000]
    assert first.stdout.count("done: iteration 3") == 1  # rank 0 alone prints
    assert "batch: 6 sequences per step = 2 process(es) x 3 micro-batch(es) x 1; torch.distributed gloo" \
        in first.stderr
    resumed = torchrun([*flags, "--max-iters", "5", "--resume", "--out", str(ddp)])
    assert resumed.returncode == 0, resumed.stderr[:3000]
    assert "resuming" in resumed.stderr
    assert run([*flags, "--max-iters", "3", "--out", str(tmp_path / "one")]) == 0
    assert run([*flags, "--max-iters", "5", "--resume", "--out", str(tmp_path / "one")]) == 0
    a, b = load_checkpoint(ddp / CHECKPOINT_NAME), load_checkpoint(tmp_path / "one" / CHECKPOINT_NAME)
    assert (a.iteration, b.iteration) == (5, 5)
    assert_close_states(a.model.state_dict(), b.model.state_dict())
    assert [h["iter"] for h in a.history] == [0, 3, 5]


@pytest.mark.parametrize("killed", [1, 0])
def test_a_torchrun_process_killed_leaves_one_line_naming_the_last_checkpoint(killed: int, text: Path,
                                                                              tmp_path: Path) -> None:
    """kill -9 of one of 2 processes mid-run: the survivor (rank 0, or rank 1 when rank 0 is the one killed)
    prints one line naming the checkpoint on disk and its iteration, no gloo traceback; torchrun's own report
    of the killed process is the launcher's, not ours."""
    out = tmp_path / "ddp"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
               "typed_transformer", "train", "--data", str(text), *TINY, "--max-iters", "1000000",
               "--checkpoint-interval", "2", "--out", str(out)]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + HANG_SECONDS
        while not (out / CHECKPOINT_NAME).exists() and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.05)
        workers = torchrun_workers(launcher.pid)
        assert sorted(workers) == [0, 1], launcher.poll()
        os.kill(workers[killed], signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=HANG_SECONDS)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 0
    ours = [line for line in (stdout + stderr).splitlines() if line.startswith("typed-transformer")]
    iteration = load_checkpoint(out / CHECKPOINT_NAME).iteration
    assert len(ours) == 1, stderr[-3000:]
    assert re.fullmatch(
        rf"typed-transformer: error: training stopped at iteration \d+: another of the run's 2 processes stopped "
        rf"\(.+\); the last good checkpoint is {re.escape(str(out / CHECKPOINT_NAME))} \(iteration {iteration}\): "
        "continue with --resume", ours[0]), ours[0]
    assert not [line for line in stderr.splitlines() if line.startswith("[rank")], stderr[-3000:]


def test_a_peer_failure_is_told_from_other_errors_and_cut_to_its_cause() -> None:
    from typed_transformer.step_loop import _cause, _is_peer_failure

    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                        "[127.0.0.1]:62662: Connection reset by peer. This is typically caused by a remote worker "
                        "hanging or bugs in the application. Check the logs of the other ranks.")
    assert _is_peer_failure(gloo)
    assert _cause(gloo) == "Read error [127.0.0.1]:62662: Connection reset by peer"
    assert _is_peer_failure(torch.distributed.DistBackendError("NCCL communicator was aborted"))
    assert not _is_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not _is_peer_failure(ValueError("Connection reset by peer"))


def test_compiled_generation_equals_eager() -> None:
    """The real backend (inductor, frozen weights; max-autotune is left to `bench gpt`, which reports how many
    of its tokens equal eager's, to keep this test at about 20 s): cached steps, recomputed windows past
    block_size and uncached generation give eager's tokens. (aot_eager alone missed that inductor could not
    compile a cache whose attributes were views of one another.)"""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)).eval()
    prompt = torch.tensor([[1, 2]])
    eager = model.generate(prompt, 10, greedy=True)  # past block_size: cached steps, then recomputed windows
    eager_uncached = model.generate(prompt, 10, greedy=True, use_cache=False)
    compiled = compile_for_generation(model, max_autotune=False)
    assert compiled is model
    torch.testing.assert_close(compiled.generate(prompt, 10, greedy=True), eager, rtol=0, atol=0)
    torch.testing.assert_close(compiled.generate(prompt, 10, greedy=True, use_cache=False), eager_uncached,
                               rtol=0, atol=0)
    with pytest.raises(TypeCheckError):  # the eager boundary still checks shapes
        compiled.generate(torch.tensor([1, 2]), 3)


def test_generate_compile_flag(tmp_path: Path, text: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    import typed_transformer.generation as generation

    out = tmp_path / "run"
    assert run(["train", "--data", str(text), "--max-iters", "1", *TINY, "--out", str(out)]) == 0
    compiled: list[GPT] = []

    def record(model: GPT) -> GPT:
        compiled.append(model)
        return model

    monkeypatch.setattr(generation, "compile_for_generation", record)
    capsys.readouterr()
    assert run(["generate", "--checkpoint", str(out), "--max-new-tokens", "5", "--greedy", "--compile"]) == 0
    assert len(compiled) == 1
    assert len(capsys.readouterr().out) == len("\n") + 5 + 1


def test_a_kv_cache_with_capacity_equals_one_that_concatenates() -> None:
    """Preallocated buffers (GPT.new_caches) hold what torch.cat would, also past the capacity and after a crop."""
    from typed_transformer.multihead import KVCache

    generator = torch.Generator().manual_seed(0)
    chunks = [torch.randn(2, 3, t, 4, generator=generator) for t in (2, 1, 1, 3)]
    buffered, growing = KVCache(capacity=5), KVCache()
    for i, chunk in enumerate(chunks):
        k, v = buffered.append(chunk, chunk * 2)
        expected_k, expected_v = growing.append(chunk, chunk * 2)
        assert torch.equal(k, expected_k)
        assert torch.equal(v, expected_v)
        assert buffered.length == growing.length == sum(c.shape[2] for c in chunks[:i + 1])
    buffered.crop(2)
    growing.crop(2)
    extra = torch.randn(2, 3, 1, 4, generator=generator)
    assert torch.equal(buffered.append(extra, extra)[0], growing.append(extra, extra)[0])
    buffered.reset()
    assert buffered.length == 0
    with pytest.raises(ValueError, match="capacity must be None or a positive int, got 0"):
        KVCache(capacity=0)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    assert [cache.capacity for cache in model.new_caches()] == [8]


def test_resume_with_the_preset_and_its_size_flags(text: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert run(["train", "--preset", "baby", "--data", str(text), "--max-iters", "1", *TINY, "--out", str(out)]) == 0
    assert run(["train", "--preset", "baby", "--data", str(text), "--max-iters", "2", *TINY, "--resume",
                "--out", str(out)]) == 0
    capsys.readouterr()
    assert run(["train", "--preset", "seed", "--data", str(text), "--max-iters", "3", *TINY, "--resume",
                "--out", str(out)]) == 2
    assert "--preset seed differs from the checkpoint's model (baby: n_layer=1" in capsys.readouterr().err


def test_with_threads_auto_the_peak_is_the_fastest_count_and_the_count_is_left_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a busy machine the default count's matmuls collapse: a peak measured there made MFU read 391%."""
    from typed_transformer import threads, training

    rates = {1: 90e9, 2: 17e9}  # one core held by another process: two threads far slower than one
    monkeypatch.setattr(threads, "candidate_counts", lambda cores=None: [1, 2])
    monkeypatch.setattr(training, "measure_matmul_flops", lambda device, dtype: rates[torch.get_num_threads()])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_THREADS_AT_IMPORT", 2)  # torch's default on two cores, nobody set a count
    monkeypatch.setattr(threads, "_OURS", set())  # the counts it records stay in this test
    torch.set_num_threads(2)
    try:
        assert training.measure_peak_flops("cpu", torch.float32, "auto") == (90e9, 1)
        assert torch.get_num_threads() == 2
        assert threads.resolve_threads("auto").count is None  # the counts it tried are not taken for the user's
        assert training.measure_peak_flops("cpu", torch.float32, 2) == (17e9, 2)  # an explicit count: that count
    finally:
        torch.set_num_threads(before)
