"""``textarena``: TextArena's games (Guertler et al., "TextArena", arXiv 2504.11442) as episodes.

Rows (data source ``textarena:<game>``, :mod:`polyrl.data.textarena`) name the game
(``textarena_env``, e.g. ``GuessTheNumber-v0``) and its ``seed``: the same row is the same game.
The policy is TextArena's player 0. ``start`` resets the game (its unwrapped ``-raw`` variant) and
shows what the game told player 0; each assistant turn is player 0's action, and the policy
then sees what the game (and the opponent) said since, as one user message.

Rewards and verdicts are TextArena's own: when the game ends the return is player 0's reward
(single-player puzzles: 1 for a solve, else the game's partial credit such as ``GuessTheNumber``'s
closeness of the last guess, or its invalid-move penalty; two-player games: 1 win, 0 draw, -1
loss), and the episode is solved when that reward is 1. An episode cut at
``rollout.episodes.max_turns`` before the game ends is unsolved with return 0.

Two-player games are played against a fixed, scripted opponent (player 1): ``first_available``
plays the first of the moves the game lists to it under ``Available Moves:`` (TicTacToe lists
them; many games list none, and are refused at ``start``), ``random_available`` a seeded random
one of them. TextArena's own agents are LLM clients behind an API, which training here cannot
call.

TextArena draws its games from Python's global ``random`` (and seeds it in ``reset``); every
call into a game runs with the episode's own random state swapped in, under one lock, so games
stay fixed by their row whatever else runs, and the trainer's global random stream is untouched.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from polyrl.envs.base import EnvConfigError, EpisodeRow, Step
from polyrl.envs.registry import register_env

INSTALL_HINT = "pip install 'polyrl[envs]'"
GAME_ID = -1  # TextArena's id of the game's own messages
OPPONENTS = ("first_available", "random_available")
# Moves a game lists to a player: "Available Moves: '[0]', '[4]'".
_AVAILABLE = re.compile(r"Available Moves:\s*(.*)")
_MOVE = re.compile(r"'(\[[^\]]*\])'")
_RANDOM_LOCK = threading.RLock()
# Opponent turns in a row before the game is taken to be stuck (a game that keeps asking player 1).
_MAX_OPPONENT_TURNS = 1000

__all__ = ["TextArenaEnv", "import_textarena", "listed_moves", "raw_game_id"]


def import_textarena(what: str) -> Any:
    try:
        import textarena
    except ImportError as error:
        raise EnvConfigError(f"{what} needs the textarena package, which is not installed: {INSTALL_HINT}") from error
    return textarena


def raw_game_id(game: str) -> str:
    """The unwrapped variant of a registered game (``GuessTheNumber-v0`` → ``GuessTheNumber-v0-raw``):
    polyrl renders observations itself, turn by turn, so TextArena's observation wrappers (which
    repeat the whole history every turn) do not apply."""
    from textarena.envs.registration import ENV_REGISTRY

    if game.endswith("-raw") or f"{game}-raw" not in ENV_REGISTRY:
        return game
    return f"{game}-raw"


def listed_moves(text: str) -> list[str]:
    """The moves of the last ``Available Moves:`` line of ``text`` (``["[0]", "[4]"]``)."""
    lines = _AVAILABLE.findall(text)
    return _MOVE.findall(lines[-1]) if lines else []


@register_env("textarena")
class TextArenaEnv:
    """A TextArena game, played as player 0 (see the module docstring).

    Params: ``opponent`` — the scripted player 1 of two-player games: ``first_available`` (default)
    or ``random_available``.
    """

    tools: list[Any] = []

    def __init__(self, opponent: Literal["first_available", "random_available"] = "first_available"):
        if opponent not in OPPONENTS:
            raise EnvConfigError(f"textarena: env.params.opponent {opponent!r} is not one of {list(OPPONENTS)}")
        self.opponent = opponent
        self.game: Any = None
        self.game_name = ""
        self.players = 1
        self._random_state: Any = None
        self._opponent_rng = random.Random(0)

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        """Python's global ``random`` holds this episode's state while the game runs."""
        with _RANDOM_LOCK:
            outer = random.getstate()
            random.setstate(self._random_state)
            try:
                yield
            finally:
                self._random_state = random.getstate()
                random.setstate(outer)

    def start(self, row: EpisodeRow) -> list[dict[str, Any]]:
        game, seed = row.get("textarena_env"), row.get("seed")
        if not isinstance(game, str) or seed is None:
            raise EnvConfigError(
                "textarena plays rows with 'textarena_env' (the game) and 'seed' columns, as data source "
                f"textarena:<game> gives them; this row has {', '.join(['prompt', *row.fields])}"
            )
        textarena = import_textarena("environment textarena")
        self.game_name, seed = game, int(seed)
        self._random_state = random.Random(seed).getstate()
        self._opponent_rng = random.Random(f"polyrl-textarena-opponent-{seed}")
        with self._own_random():
            self.game = textarena.make(raw_game_id(game))
            try:
                self.game.reset(num_players=1, seed=seed)
                self.players = 1
            except (AssertionError, ValueError) as single:  # a game for two (or more) players says so here
                try:
                    self.game.reset(num_players=2, seed=seed)
                except (AssertionError, ValueError):
                    raise EnvConfigError(
                        f"textarena: {game} is neither a one- nor a two-player game ({single}); polyrl plays those only"
                    ) from None
                self.players = 2
        self._opponent_turns()  # a game where player 1 moves first: it moves before player 0 sees the board
        return [{"role": "user", "content": self._turn_text()}]

    def step(self, text: str) -> Step:
        with self._own_random():
            done, _ = self.game.step(text)
        if not done:
            done = self._opponent_turns()
        if done:
            return self._outcome()
        return Step([{"role": "user", "content": self._turn_text()}], solved=False)

    def _opponent_turns(self) -> bool:
        """Player 1's turns until it is player 0's turn again (or the game ends): whether it ended."""
        for _ in range(_MAX_OPPONENT_TURNS):
            if self.players == 1 or self.game.state.current_player_id == 0:
                return False
            with self._own_random():
                _, observation = self.game.get_observation()
            seen = "\n".join(message for _, message, _ in observation)
            moves = listed_moves(seen)
            if not moves:
                raise EnvConfigError(
                    f"textarena: the scripted opponent ({self.opponent}) plays a move the game lists under 'Available "
                    f"Moves:'; {self.game_name} lists none to player 1, so it cannot be played against it here: play a "
                    "single-player game, or a two-player game that lists its moves (TicTacToe-v0)"
                )
            move = moves[0] if self.opponent == "first_available" else self._opponent_rng.choice(moves)
            with self._own_random():
                done, _ = self.game.step(move)
            if done:
                return True
        raise EnvConfigError(f"textarena: {self.game_name} asked the opponent for {_MAX_OPPONENT_TURNS} moves in a row")

    def _turn_text(self) -> str:
        """What the game (and the opponent) said to player 0 since its last turn, its own action left out."""
        with self._own_random():
            _, observation = self.game.get_observation()
        lines = []
        for sender, message, _ in observation:
            if sender == 0:  # player 0's own action, which the policy wrote
                continue
            lines.append(message if sender == GAME_ID else f"[Opponent] {message}")
        return "\n\n".join(lines) or "(the game said nothing; your move)"

    def _outcome(self) -> Step:
        with self._own_random():
            rewards, _ = self.game.close()
        reward = float((rewards or {}).get(0, 0.0))
        return Step(reward=reward, done=True, solved=reward >= 1.0)
