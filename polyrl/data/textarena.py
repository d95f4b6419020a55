"""Data source ``textarena:<game>[?size=N&test_size=M&seed=S]``: one row per game of a TextArena game.

A row is ``{"prompt", "textarena_env", "seed", "id", "split"}``: the environment ``textarena``
(:mod:`polyrl.envs.builtins.textarena`) resets the game with that seed, so a row is one fixed
game. ``train`` is seeds ``seed .. seed+size-1`` (default 0 and 1000), ``test`` is ``test_size``
seeds (default 100) from ``seed + HELD_OUT_SEED_OFFSET`` on: no held-out seed is a training seed.
Games with a small space of hidden states (``GuessTheNumber-v0`` hides one of 20 numbers) repeat
their games across seeds, so held-out games there can equal training games; what is held out is
the seed, and the game's opening text does not show the hidden state to compare.

The game is reset once when the source is checked, so one that cannot run here is refused before
training: games that fetch NLTK data or call an LLM API at run time, and games whose code needs a
newer Python than the one running.
"""

from __future__ import annotations

import contextlib
import functools
import io
import random
from typing import Any

import datasets

from polyrl.data.errors import DataConfigError
from polyrl.data.source_params import did_you_mean, source_params
from polyrl.envs.base import EnvConfigError
from polyrl.envs.builtins.textarena import import_textarena, raw_game_id

PREFIX = "textarena:"
SPLITS = ("train", "test")
HELD_OUT_SEED_OFFSET = 1_000_000_007
DEFAULTS = {"size": 1000, "test_size": 100, "seed": 0}

__all__ = ["PREFIX", "is_textarena", "load_split", "parse_source"]


def is_textarena(source: str) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def _registered_games() -> list[str]:
    from textarena.envs.registration import ENV_REGISTRY

    # The variants polyrl plays: the default of each game (its -raw twin is what runs).
    return sorted(name for name in ENV_REGISTRY if not name.endswith(("-raw", "-train")))


@functools.lru_cache(maxsize=64)
def parse_source(source: str) -> tuple[str, int, int, int]:
    """``(game, size, test_size, seed)`` of a ``textarena:`` source, the game checked to exist
    and to reset here (once, seed 0, with its output kept off the console)."""
    game, _, query = source[len(PREFIX) :].partition("?")
    try:
        import_textarena(f"data source {source!r}")
    except EnvConfigError as error:
        raise DataConfigError(str(error)) from None
    games = _registered_games()
    if game not in games:
        close = did_you_mean(game, games)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise DataConfigError(
            f"data source {source!r}: TextArena has no game {game!r}; {hint}its games ({len(games)}): {', '.join(games)}"
        )
    values = dict(DEFAULTS)
    pairs = source_params(source, query)
    for name, raw in pairs:
        if name not in DEFAULTS:
            raise DataConfigError(f"data source {source!r}: unknown param {name!r}; allowed: {', '.join(DEFAULTS)} (integers)")
        try:
            values[name] = int(raw)
        except ValueError:
            raise DataConfigError(f"data source {source!r}: param {name}={raw!r} is not an integer") from None
    if values["size"] < 1 or values["test_size"] < 1:
        raise DataConfigError(
            f"data source {source!r}: size and test_size must be at least 1, got {values['size']}, {values['test_size']}"
        )
    _check_runs(source, game)
    return game, values["size"], values["test_size"], values["seed"]


def _check_runs(source: str, game: str) -> None:
    import textarena

    outer = random.getstate()  # TextArena seeds Python's global random in reset
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            env = textarena.make(raw_game_id(game))
            try:
                env.reset(num_players=1, seed=0)
            except (AssertionError, ValueError) as error:
                if "player" not in str(error).lower():
                    raise
                env.reset(num_players=2, seed=0)
    except LookupError as error:  # nltk: "Resource 'words' not found"
        raise DataConfigError(
            f"data source {source!r}: {game} needs data it fetches from the network when it starts (NLTK: "
            f"{' '.join(str(error).split())[:160]}), which this machine cannot reach; play another game"
        ) from None
    except SyntaxError as error:
        raise DataConfigError(
            f"data source {source!r}: {game}'s code does not run on this Python ({error}); play another game"
        ) from None
    except Exception as error:  # noqa: BLE001 - TextArena's games fail in their own ways (API keys, players)
        raise DataConfigError(f"data source {source!r}: {game} cannot start here: {type(error).__name__}: {error}") from None
    finally:
        random.setstate(outer)


def load_split(source: str, split: str) -> datasets.Dataset:
    game, size, test_size, seed = parse_source(source)
    if split not in SPLITS:
        raise DataConfigError(f"data source {source!r}: unknown split {split!r}; allowed: {list(SPLITS)}")
    first, count = (seed, size) if split == "train" else (seed + HELD_OUT_SEED_OFFSET, test_size)
    rows: list[dict[str, Any]] = [
        {
            "prompt": f"TextArena {game}, game {s}",
            "textarena_env": game,
            "seed": s,
            "id": f"ta-{game}-{split}-{i:05d}",
            "split": split,
        }
        for i, s in enumerate(range(first, first + count))
    ]
    return datasets.Dataset.from_list(rows)


def check_split(source: str, split: str) -> None:
    parse_source(source)
    if split not in SPLITS:
        raise DataConfigError(f"data source {source!r}: unknown split {split!r}; allowed: {list(SPLITS)}")
