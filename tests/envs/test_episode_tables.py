"""Sample tables show an episode turn by turn (JSON row and HTML page)."""

from __future__ import annotations

import json

import torch

from polyrl.core.types import Completion, PromptSample
from polyrl.rollout.batches import Rollout, Scores
from polyrl.tracking.sample_html import samples_html
from polyrl.trainer.loop import sample_rows

EPISODE = {
    "turns": [
        {"role": "user", "content": "What is 123 * 45?", "trained": False, "tokens": 12},
        {"role": "assistant", "content": '<tool_call>{"name": "calculator"}</tool_call>', "trained": True, "tokens": 9,
         "reward": None, "tool_calls": 1, "tool_errors": 1},
        {"role": "tool", "content": "Error: bad arguments <b>", "trained": False, "tokens": 7},
        {"role": "assistant", "content": "5535", "trained": True, "tokens": 3, "reward": 1.0, "tool_calls": 0, "tool_errors": 0},
    ],
    "return": 1.0, "assistant_turns": 2, "tool_calls": 1, "tool_errors": 1, "end": "done", "observation_tokens": 7,
}  # fmt: skip


def test_episode_rows_and_page():
    completion = Completion([1, 2], list(range(19)), "5535", [0.0] * 19, "stop", completion_mask=(1,) * 9 + (0,) * 7 + (1,) * 3,
                            episode=EPISODE)  # fmt: skip
    rows = sample_rows(Rollout([PromptSample("What is 123 * 45?")], [completion], torch.tensor([0])), Scores([1.0], {}))
    assert rows[0]["length"] == 12  # policy tokens only: 9 + 3, the 7 observation tokens left out
    assert json.loads(rows[0]["episode"]) == EPISODE
    page = samples_html(rows, [[]], title="samples")
    assert page.count('class="turn ') == 4
    assert "tool calls 1, errors 1" in page and "not trained" in page and "reward 1" in page
    assert "&lt;b&gt;" in page and "<b>\n" not in page  # tool output escaped
    assert "return 1 · 2 turns · tool calls 1 (errors 1) · ended: done" in page
