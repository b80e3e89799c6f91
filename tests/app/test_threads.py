"""The intra-op thread count: the tuner's timing logic (with a fake clock), who decides, drift re-checks."""

import io
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from typed_transformer import threads
from typed_transformer.checkpoint import CHECKPOINT_NAME, load_checkpoint
from typed_transformer.data import TextData
from typed_transformer.gpt import GPT, GPTConfig
from typed_transformer.seq2seq_training import Seq2SeqConfig, load_seq2seq, train_seq2seq
from typed_transformer.step_loop import StepLoop
from typed_transformer.threads import ThreadChoice, ThreadTuner, candidate_counts, resolve_threads, tune_threads
from typed_transformer.training import TrainConfig, train


class FakeMachine:
    """A clock and a thread setting: a step at count ``c`` takes ``costs[c]`` fake seconds."""

    def __init__(self, costs: dict[int, float]) -> None:
        self.costs = dict(costs)
        self.now = 0.0
        self.count = 0
        self.sets: list[int] = []

    def clock(self) -> float:
        return self.now

    def set_threads(self, count: int) -> None:
        self.count = count
        self.sets.append(count)

    def step(self, tuner: ThreadTuner, cost: float | None = None) -> None:
        tuner.begin()
        self.now += self.costs[self.count] if cost is None else cost
        tuner.end()


def tuning(tuner: ThreadTuner) -> bool:
    """``tuner.tuning``, read through a call (mypy keeps an asserted property narrowed across the steps)."""
    return tuner.tuning


def tuner_on(machine: FakeMachine, candidates: list[int], log: list[str] | None = None,
             **options: float | None) -> ThreadTuner:
    return ThreadTuner(candidates, clock=machine.clock, set_threads=machine.set_threads,
                       log=None if log is None else log.append, **options)  # type: ignore[arg-type]


def test_the_fastest_count_wins_and_is_set() -> None:
    machine = FakeMachine({1: 0.10, 2: 0.06, 3: 0.08})
    tuner = tuner_on(machine, [1, 2, 3])
    while tuning(tuner):
        machine.step(tuner)
    assert (tuner.count, machine.count) == (2, 2)
    assert tuner.step_time == pytest.approx(0.06)
    assert len(tuner.decisions) == 1
    assert tuner.decisions[0][0] == 2
    assert tuner.decisions[0][1] == pytest.approx({1: 0.10, 2: 0.06, 3: 0.08})
    # warm-up 1 + trial 3 steps per count
    assert machine.sets == [1, 2, 3, 2]


def test_a_count_within_the_tie_margin_loses_to_fewer_threads() -> None:
    machine = FakeMachine({1: 0.100, 2: 0.099})
    tuner = tuner_on(machine, [1, 2], tie=0.03)
    while tuning(tuner):
        machine.step(tuner)
    assert tuner.count == 1


def test_the_warm_up_step_is_not_counted() -> None:
    machine = FakeMachine({1: 0.10, 2: 0.20})
    tuner = tuner_on(machine, [1, 2], abandon=10.0)
    machine.step(tuner, cost=5.0)  # the first step of the run: allocation, compilation
    while tuning(tuner):
        machine.step(tuner)
    assert tuner.decisions[0][1] == pytest.approx({1: 0.10, 2: 0.20})


def test_a_count_much_slower_than_the_best_is_dropped_after_one_step() -> None:
    # Another process holds a core: two threads wait for the descheduled one (10-20x slower).
    machine = FakeMachine({1: 0.10, 2: 1.50})
    log: list[str] = []
    tuner = tuner_on(machine, [1, 2], log=log)
    steps = 0
    while tuning(tuner):
        machine.step(tuner)
        steps += 1
    assert steps == 4 + 1  # one warm-up and three timed steps at 1, one step at 2
    assert tuner.count == 1
    assert log == ["threads: 1 (median step time 1: 100.0 ms, 2: dropped)"]


def test_drift_starts_a_new_tuning_that_follows_the_load() -> None:
    machine = FakeMachine({1: 0.10, 2: 0.05})
    log: list[str] = []
    tuner = tuner_on(machine, [1, 2], log=log, recheck_seconds=None, window=5, drift=1.5)
    while tuning(tuner):
        machine.step(tuner)
    assert tuner.count == 2
    for _ in range(20):  # steady: no re-check
        machine.step(tuner)
    assert not tuning(tuner)
    assert len(tuner.decisions) == 1
    machine.costs = {1: 0.11, 2: 1.00}  # another process takes a core
    for _ in range(5):
        machine.step(tuner)
    assert tuning(tuner)
    while tuning(tuner):
        machine.step(tuner)
    assert (tuner.count, machine.count) == (1, 1)
    assert len(tuner.decisions) == 2
    assert [line.split(" (")[0] for line in log] == ["threads: 2", "threads: 1"]  # one line per change


def test_a_drift_shorter_than_the_window_is_ignored() -> None:
    machine = FakeMachine({1: 0.10, 2: 0.05})
    tuner = tuner_on(machine, [1, 2], recheck_seconds=None, window=5)
    while tuning(tuner):
        machine.step(tuner)
    for cost in (0.05, 0.5, 0.5, 0.05, 0.05, 0.05, 0.5, 0.05):  # median of every 5 stays 0.05
        machine.step(tuner, cost=cost)
    assert not tuning(tuner)


def test_a_periodic_recheck_keeps_a_count_that_is_still_best() -> None:
    machine = FakeMachine({1: 0.10, 2: 0.05})
    log: list[str] = []
    tuner = tuner_on(machine, [1, 2], log=log, recheck_seconds=1.0)
    while tuning(tuner):
        machine.step(tuner)
    for _ in range(19):  # 0.95 fake seconds
        machine.step(tuner)
    assert not tuning(tuner)
    machine.step(tuner)
    assert tuning(tuner)
    while tuning(tuner):
        machine.step(tuner)
    assert tuner.count == 2
    assert len(tuner.decisions) == 2
    assert len(log) == 1  # a kept count is not printed
    assert log[0].startswith("threads: 2 (median step time")


def test_a_run_under_a_changing_load_prints_a_thread_change_once() -> None:
    """The main job under load printed 39 ``threads:`` lines among 9 ``iter`` lines: every re-check spoke."""
    costs = {1: 0.10, 2: 0.05}
    log: list[str] = []
    trials: list[int] = []

    def trial() -> float:
        trials.append(torch.get_num_threads())
        return costs[trials[-1]]

    schedule = threads.RunThreads(trial, [1, 2], recheck_seconds=1.0, log=log.append)
    before = torch.get_num_threads()
    try:
        for iteration in range(400):
            schedule.tune(iteration)
            # the kept steps swing between two loads (drift re-checks) that both leave 2 threads the fastest
            schedule.observe(costs[torch.get_num_threads()] * (1 if iteration // 20 % 2 else 3))
            if iteration == 300:
                costs = {1: 0.05, 2: 0.10}
        assert log == ["threads: 2 at iteration 0 (median trial step 1: 100.0 ms, 2: 50.0 ms)",
                       "threads: 1 at iteration 303 (median trial step 1: 50.0 ms, 2: dropped)"]
        assert schedule.changes == [[0, 2], [303, 1]]
        assert len(trials) > 5 * 8  # many re-checks (8 trial steps each) kept the count silently
    finally:
        torch.set_num_threads(before)


def test_a_single_candidate_is_set_and_never_timed() -> None:
    machine = FakeMachine({1: 0.1})
    tuner = tuner_on(machine, [1])
    assert not tuning(tuner)
    assert tuner.count == 1
    assert machine.sets == [1]
    for _ in range(50):
        machine.step(tuner, cost=10.0)
    assert machine.sets == [1]


@pytest.mark.parametrize("options", [{"candidates": []}, {"candidates": [0, 1]}, {"trial": 0}, {"drift": 1.0},
                                     {"abandon": 0.5}, {"warmup": -1}])
def test_bad_tuner_settings(options: dict[str, object]) -> None:
    candidates = options.pop("candidates", [1, 2])
    with pytest.raises(ValueError, match="ThreadTuner"):
        ThreadTuner(candidates, set_threads=lambda count: None, **options)  # type: ignore[arg-type]


def test_end_without_begin() -> None:
    with pytest.raises(RuntimeError, match="without begin"):
        ThreadTuner([1, 2], set_threads=lambda count: None).end()


def test_tune_threads_runs_the_step_until_it_has_chosen() -> None:
    machine = FakeMachine({1: 0.03, 2: 0.02})
    calls: list[int] = []

    def step() -> None:
        calls.append(machine.count)
        machine.now += machine.costs[machine.count]

    chosen = tune_threads(step, [1, 2], clock=machine.clock, set_threads=machine.set_threads)
    assert chosen == 2
    assert machine.count == 2
    assert calls == [1, 1, 1, 1, 2, 2, 2, 2]


def test_candidates() -> None:
    assert candidate_counts(1) == [1]
    assert candidate_counts(2) == [1, 2]
    assert candidate_counts(8) == list(range(1, 9))
    assert candidate_counts(12) == [1, 2, 4, 8, 12]
    assert candidate_counts(16) == [1, 2, 4, 8, 16]
    assert 1 <= threads.usable_cores() <= (__import__("os").cpu_count() or 1)


# ---------------------------------------------------------------------------------------------------
# Who decides: an explicit --threads N, then the user's variables or torch.set_num_threads, then auto
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def no_user_setting(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No thread variable in the environment, torch at the count this module saw at import."""
    before = torch.get_num_threads()
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_THREADS_AT_IMPORT", before)
    monkeypatch.setattr(threads, "_OURS", set())
    yield
    torch.set_num_threads(before)


def test_nothing_said_means_auto(no_user_setting: None) -> None:
    assert resolve_threads(None) == ThreadChoice(None, "auto")
    assert resolve_threads("auto") == ThreadChoice(None, "auto")
    assert resolve_threads("auto").describe().startswith("threads auto (the fastest of 1")


def test_an_explicit_count_wins_over_everything(no_user_setting: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert resolve_threads(3) == ThreadChoice(3, "--threads")
    assert resolve_threads(3).describe() == "threads 3 (--threads)"


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
def test_the_users_variable_wins_over_auto(name: str, no_user_setting: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, "1")
    assert resolve_threads("auto") == ThreadChoice(torch.get_num_threads(), name)


def test_a_count_the_user_set_in_torch_wins_over_auto(no_user_setting: None) -> None:
    other = 2 if torch.get_num_threads() != 2 else 1
    torch.set_num_threads(other)
    assert resolve_threads("auto") == ThreadChoice(other, "torch.set_num_threads")


def test_a_count_the_tuner_set_is_not_taken_for_the_users(no_user_setting: None) -> None:
    other = 2 if torch.get_num_threads() != 2 else 1
    threads._set_threads(other)
    assert resolve_threads("auto").count is None


def test_apply_threads_sets_an_explicit_count(no_user_setting: None) -> None:
    other = 2 if torch.get_num_threads() != 2 else 1
    choice, tuner = threads.apply_threads(other)
    assert (choice.count, tuner, torch.get_num_threads()) == (other, None, other)
    choice, tuner = threads.apply_threads("auto")
    assert choice.count is None
    assert isinstance(tuner, ThreadTuner)


@pytest.mark.parametrize("bad", [0, -2, True, "four", 1.5])
def test_bad_requests(bad: object) -> None:
    with pytest.raises(ValueError, match="threads must be a positive integer or 'auto'"):
        resolve_threads(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, True, "four"])
def test_train_config_checks_threads(bad: object) -> None:
    with pytest.raises(ValueError, match="threads must be 'auto' or a positive integer"):
        TrainConfig(threads=bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------
# In the training loop
# ---------------------------------------------------------------------------------------------------

TEXT = "the quick brown fox jumps over the lazy dog.\n" * 12


def _tiny_run(tmp_path: Path, threads_setting: int | str) -> tuple[list[float], int | None]:
    data = TextData.from_text(TEXT, 8)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=16))
    config = TrainConfig(max_iters=14, batch_size=4, eval_interval=100, eval_iters=1, checkpoint_interval=100,
                         warmup_iters=2, sample_tokens=0, learning_rate=3e-3, min_lr=3e-4, threads=threads_setting)
    result = train(model, data, config, tmp_path, progress=False)
    assert result.losses is not None
    return result.losses, result.threads


def test_a_fixed_seed_and_thread_count_give_the_same_losses(tmp_path: Path, no_user_setting: None) -> None:
    first, count = _tiny_run(tmp_path / "a", 1)
    second, _ = _tiny_run(tmp_path / "b", 1)
    assert count == 1
    assert first == second


def test_auto_in_training_tunes_on_the_steps_and_reports_the_count(
        tmp_path: Path, no_user_setting: None, capsys: pytest.CaptureFixture[str]) -> None:
    _, count = _tiny_run(tmp_path, "auto")
    assert count in candidate_counts()
    if len(candidate_counts()) > 1:
        assert "threads: " in capsys.readouterr().err


def test_a_recheck_that_keeps_the_count_waits_twice_as_long_for_the_next() -> None:
    machine = FakeMachine({1: 0.10, 2: 0.05})
    tuner = tuner_on(machine, [1, 2], recheck_seconds=1.0, drift=100.0)
    starts: list[float] = []
    for _ in range(400):
        was = tuning(tuner)
        machine.step(tuner)
        if tuning(tuner) and not was:
            starts.append(machine.now)
    # Each tuning takes 0.6 fake seconds (4 steps at 1 thread, 4 at 2); the waits after it: 1, 2, 4, 8 s.
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) >= 4
    assert [round(g - 0.6, 1) for g in gaps[:3]] == [2.0, 4.0, 8.0]
    machine.costs = {1: 0.05, 2: 0.10}  # the other count is faster now: the next re-check switches and resets
    while not tuning(tuner):
        machine.step(tuner)
    while tuning(tuner):
        machine.step(tuner)
    assert tuner.count == 1
    assert tuner._wait == 1.0


# ---------------------------------------------------------------------------------------------------
# A resumed auto run replays the counts (docs/reliability.md: a resumed run is the same run)
# ---------------------------------------------------------------------------------------------------


class Killed(Exception):
    """Stands for kill -9: raised from ``on_step``, so nothing after the last checkpoint is saved."""


class ChangingLoad:
    """The step times of a machine whose load changes at iteration ``change``: one thread is fastest before it,
    two after it (``StepLoop.measure`` replaced: the work runs, its seconds come from here, not a clock)."""

    def __init__(self, change: int) -> None:
        self.change = change

    def measure(self, trainer: Any, work: Callable[[], Any]) -> tuple[Any, float]:
        result = work()
        costs = {1: 0.010, 2: 0.030} if trainer.iteration < self.change else {1: 0.040, 2: 0.008}
        return result, costs[torch.get_num_threads()]


def _killing(kills: tuple[int, ...], counts: dict[int, int]) -> Callable[[int], None]:
    """An ``on_step`` that notes the thread count of each kept step and raises :class:`Killed` once after each
    iteration of ``kills``."""
    stopped: set[int] = set()

    def on_step(iteration: int) -> None:
        counts[iteration] = torch.get_num_threads()
        if iteration in kills and iteration not in stopped:
            stopped.add(iteration)
            raise Killed

    return on_step


def _auto_run(out: Path, kills: tuple[int, ...], counts: dict[int, int],
              ) -> dict[str, torch.Tensor]:
    """The run to ``max_iters``, stopped by a kill after each iteration of ``kills`` and resumed from its
    checkpoint; ``counts[i]`` is the thread count the kept step making iteration ``i`` ran at."""
    data = TextData.from_text(TEXT * 4, 8)
    config = TrainConfig(max_iters=20, batch_size=8, eval_interval=100, eval_iters=1, checkpoint_interval=4,
                         warmup_iters=2, sample_tokens=0, threads="auto")

    on_step = _killing(kills, counts)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=16, n_layer=2, n_head=4, n_embd=64,
                          dropout=0.1))
    resume = None
    while True:
        try:
            return train(model, data, config, out, progress=False, on_step=on_step, resume=resume,
                         peak_flops=1e9).model.state_dict()
        except Killed:
            resume = load_checkpoint(out / CHECKPOINT_NAME)
            model = resume.model


def test_a_resumed_auto_run_replays_the_thread_counts_under_a_changing_load(
        tmp_path: Path, no_user_setting: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)  # two candidates, on any machine
    load = ChangingLoad(change=10)
    monkeypatch.setattr(StepLoop, "measure", lambda trainer, work: load.measure(trainer, work))
    whole: dict[int, int] = {}
    uninterrupted = _auto_run(tmp_path / "whole", (), whole)
    assert (whole[1], whole[20]) == (1, 2), whole  # the load change made the tuner change the count mid-run
    assert sorted(i for i in whole if i > 1 and whole[i] != whole[i - 1]) == [14]  # the step of iteration 13
    # Killed after the checkpoint of iteration 12, whose re-check window holds steps of both loads (the resumed
    # run must see the drift at iteration 13 as the whole run did), and after the count changed.
    resumed: dict[int, int] = {}
    got = _auto_run(tmp_path / "killed", (13, 17), resumed)
    assert resumed == whole  # every kept step at the whole run's count (tuning afresh on resume changes them)
    for name, value in uninterrupted.items():
        assert torch.equal(got[name], value), f"{name} differs after a kill and resume under a changing load"


def _auto_seq2seq_run(out: Path, kills: tuple[int, ...], counts: dict[int, int]) -> dict[str, torch.Tensor]:
    """train-seq2seq's run to ``max_iters`` with ``threads="auto"`` (the command's default), stopped by a kill
    after each iteration of ``kills`` and resumed from its checkpoint (every 4 iterations); ``counts`` as in
    :func:`_auto_run`."""
    config = Seq2SeqConfig(max_len=4, d_model=16, nhead=2, layers=1, dim_feedforward=32, batch_size=8, max_iters=20,
                           eval_interval=4, eval_pairs=10, dropout=0.1)

    on_step = _killing(kills, counts)
    resume = False
    while True:
        try:
            return train_seq2seq(config, out, resume=resume, log=io.StringIO(), on_step=on_step,
                                 threads="auto").model.state_dict()
        except Killed:
            resume = True


def test_a_resumed_auto_seq2seq_run_replays_the_thread_counts_under_a_changing_load(
        tmp_path: Path, no_user_setting: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """train-seq2seq keeps the tuner's state in its checkpoints as train does: a run killed (kill -9) twice and
    resumed equals the uninterrupted run bit for bit, every kept step at the same thread count."""
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    load = ChangingLoad(change=10)
    monkeypatch.setattr(StepLoop, "measure", lambda trainer, work: load.measure(trainer, work))
    whole: dict[int, int] = {}
    uninterrupted = _auto_seq2seq_run(tmp_path / "whole", (), whole)
    assert (whole[1], whole[20]) == (1, 2), whole
    changed = [i for i in whole if i > 1 and whole[i] != whole[i - 1]]
    assert len(changed) == 1
    resumed: dict[int, int] = {}
    got = _auto_seq2seq_run(tmp_path / "killed", (13, changed[0] + 2), resumed)
    assert resumed == whole
    for name, value in uninterrupted.items():
        assert torch.equal(got[name], value), f"{name} differs after a kill and resume under a changing load"
    assert load_seq2seq(tmp_path / "killed").history == load_seq2seq(tmp_path / "whole").history
