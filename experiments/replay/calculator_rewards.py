"""Reward modules for replaying the calculator study's episodes (experiments/real/calculator_grpo.yaml)
with ``polyrl replay``: an episode run's store gives each reward the episode in
``fields["episode"]`` (turns, return, the environment's verdict ``solved``, ``tool_calls``,
``tool_errors`` and ``end``: "done" when the episode ended on a turn without a call, an answer)."""

from __future__ import annotations

from polyrl.rewards import RewardBatch, RewardModule


def call_ran(episode: dict) -> bool:
    """The episode made a tool call that ran: more calls than failed calls (the environment pays
    its format reward once, for the first call without an error)."""
    return episode["tool_calls"] > episode["tool_errors"]


class EpisodeSolved(RewardModule):
    """1.0 when the environment's verdict says the final answer was right, else 0.0 (None: no episode)."""

    name = "solved"

    def score(self, batch: RewardBatch) -> list[float | None]:
        return [None if "episode" not in f else float(bool(f["episode"]["solved"])) for f in batch.fields]


class AnsweredToolCall(RewardModule):
    """1.0 for an episode whose tool call ran AND that ended in an answer (``end`` "done"), else 0.0.

    The study paid its format reward for a call that ran, whether or not an answer followed; the
    policy learned to call on every turn and never answer (docs/results.md). Gated on the answer,
    a call alone earns nothing. "Ran": :func:`call_ran`."""

    name = "answered_tool_call"

    def score(self, batch: RewardBatch) -> list[float | None]:
        out: list[float | None] = []
        for f in batch.fields:
            episode = f.get("episode")
            if episode is None:
                out.append(None)
                continue
            out.append(float(call_ran(episode) and episode["end"] == "done"))
        return out


class ToolCallRan(RewardModule):
    """1.0 for an episode whose tool call ran, answered or not: the calculator study's own format
    reward (``format_reward_on: call``), for replaying a run trained with the answer-gated one the
    other way round. "Ran": :func:`call_ran`."""

    name = "tool_call_ran"

    def score(self, batch: RewardBatch) -> list[float | None]:
        return [None if (episode := f.get("episode")) is None else float(call_ran(episode)) for f in batch.fields]
