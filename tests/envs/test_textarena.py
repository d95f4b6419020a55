"""Environment ``textarena`` and data source ``textarena:<game>`` with the real package: games
fixed by their row's seed, TextArena's rewards and verdicts by hand, a scripted two-player
opponent, refusals, and training steps on a TextArena game."""

from __future__ import annotations

import math
import random

import pytest

from polyrl.config.schema import resolve_arms
from polyrl.data.prompts import DataConfigError, check_prompt_source, load_prompt_dataset
from polyrl.envs import EnvConfigError, EpisodeRow, build_env, load_env_class
from tests.engine_settings import kv_cache_for

pytest.importorskip("textarena")  # the envs extra; make setup installs it, so CI runs these

GUESS = "textarena:GuessTheNumber-v0?size=6&test_size=3"


def _env(**params):
    return build_env(load_env_class("textarena"), params, ref="textarena")


def _row(game: str, seed: int) -> EpisodeRow:
    return EpisodeRow(prompt=f"TextArena {game}, game {seed}", fields={"textarena_env": game, "seed": seed})


def _target(env) -> int:
    return env.game.state.game_state["game_number"]


def test_rows_name_seeded_games_and_the_splits_share_no_seed():
    train, test = load_prompt_dataset(GUESS, "train"), load_prompt_dataset(GUESS, "test")
    assert train["seed"] == [0, 1, 2, 3, 4, 5]
    assert test["seed"] == [1_000_000_007, 1_000_000_008, 1_000_000_009]
    assert set(train["textarena_env"]) == {"GuessTheNumber-v0"} and train[0]["id"] == "ta-GuessTheNumber-v0-train-00000"
    assert load_prompt_dataset("textarena:GuessTheNumber-v0?size=2&seed=50", "train")["seed"] == [50, 51]


def test_a_game_is_fixed_by_its_seed_and_leaves_the_global_random_alone():
    random.seed(123)
    expected = [random.random() for _ in range(3)]
    random.seed(123)
    first, second, other = _env(), _env(), _env()
    first.start(_row("GuessTheNumber-v0", 0))
    other.start(_row("GuessTheNumber-v0", 1))  # another game started in between
    second.start(_row("GuessTheNumber-v0", 0))
    assert _target(first) == _target(second) == 13  # seed 0's hidden number (textarena 0.7.4, pinned)
    assert [random.random() for _ in range(3)] == expected


def test_guess_the_number_rewards_and_verdicts_by_hand():
    env = _env()
    opening = env.start(_row("GuessTheNumber-v0", 0))
    assert "between 1 and 20 within 10 turns" in opening[0]["content"] and opening[0]["role"] == "user"
    step = env.step("I guess [10]")
    assert (step.reward, step.done, step.solved) == (None, False, False)
    assert step.observation == [{"role": "user", "content": "The target number is higher."}]
    step = env.step("no number")  # one invalid move is forgiven with a warning (TextArena's error allowance)
    assert not step.done and "invalid move" in step.observation[0]["content"]
    step = env.step("[13]")
    assert (step.reward, step.done, step.solved) == (1.0, True, True)

    # Wrong guesses until the turn limit: TextArena checks the limit (turn >= 10) before it counts
    # the turn, so the 11th guess ends the game, with its partial credit for the last guess,
    # 1 - |11 - 13| / (20 - 1) = 17/19, and no solve.
    env = _env()
    env.start(_row("GuessTheNumber-v0", 0))
    for guess in range(1, 11):
        assert not env.step(f"[{guess}]").done
    step = env.step("[11]")
    assert step.done and not step.solved and step.reward == pytest.approx(17 / 19)


def test_tic_tac_toe_against_the_scripted_opponent():
    # first_available plays the first listed move: after O takes 4 it plays 0, then 1, ...
    env = _env(opponent="first_available")
    opening = env.start(_row("TicTacToe-v0", 3))[0]["content"]
    assert "Available Moves: '[0]'" in opening
    assert not env.step("[4]").done  # O: 4, X: 0
    assert not env.step("[2]").done  # O: 2, X: 1
    win = env.step("[6]")  # O: 2-4-6, the diagonal
    assert (win.reward, win.done, win.solved) == (1.0, True, True)

    env = _env(opponent="first_available")
    env.start(_row("TicTacToe-v0", 3))
    assert not env.step("[8]").done  # O: 8, X: 0
    assert not env.step("[7]").done  # O: 7, X: 1
    loss = env.step("[5]")  # O: 5, X: 2 completes 0-1-2
    assert (loss.reward, loss.done, loss.solved) == (-1.0, True, False)


def test_games_it_cannot_play_are_refused():
    with pytest.raises(EnvConfigError, match=r"ConnectFour-v0 lists none to player 1"):
        env = _env()
        env.start(_row("ConnectFour-v0", 0))
        env.step("[col 3]")
    with pytest.raises(EnvConfigError, match=r"'textarena_env' \(the game\) and 'seed' columns"):
        _env().start(EpisodeRow(prompt="hi", fields={"answer": "3"}))
    with pytest.raises(EnvConfigError, match=r"opponent 'smart' is not one of"):
        _env(opponent="smart")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("textarena:GuessTheNumbr-v0", r"no game 'GuessTheNumbr-v0'; did you mean GuessTheNumber-v0"),
        ("textarena:GuessTheNumber-v0?turns=3", r"unknown param 'turns'; allowed: size, test_size, seed"),
        ("textarena:GuessTheNumber-v0?size=x", r"param size='x' is not an integer"),
        ("textarena:Wordle-v0", r"Wordle-v0 needs data it fetches from the network when it starts \(NLTK"),
    ],
)
def test_bad_sources_are_refused_by_name(source, message):
    with pytest.raises(DataConfigError, match=message):
        check_prompt_source(source, "train")


@pytest.mark.slow
def test_a_few_training_steps_on_a_textarena_game(tmp_path, tiny_arch_dir):
    from polyrl.trainer.build_arm import build_arm

    raw = {
        "name": "textarena",
        "seed": 0,
        "model": {"path": str(tiny_arch_dir("qwen2"))},
        "data": {"source": GUESS},
        "env": {"module": "textarena", "max_turns": 3, "max_episode_tokens": 400, "stop": ["]"]},
        "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8,
                    "max_model_len": 512, **kv_cache_for("hf")},
        "train": {"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 8},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 2},
    }  # fmt: skip
    arm = build_arm(resolve_arms(raw)["main"], arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        history = arm.loop().run()
    finally:
        arm.close()
    assert len(history) == 2
    for metrics in history:
        assert math.isfinite(metrics["actor/loss"]) and metrics["reward/unscored"] == 0.0
        assert metrics["episode/turns_mean"] >= 1.0
        assert 0.0 <= metrics["train/accuracy"] <= 1.0
