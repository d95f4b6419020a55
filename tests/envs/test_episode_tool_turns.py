"""A tool-calling episode through the runner with a real tokenizer and chat template: the call's
closing tag kept for the environment when a stop string ends the turn, the template's closing of
the turn appended as observation tokens, the scripted ids untouched."""

from __future__ import annotations

import pytest

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines.stop_tokens import completion_text
from polyrl.envs.builtins.calculator import CalculatorEnv
from polyrl.rollout.episodes import EpisodeRunner, EpisodeSettings

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 45"}}</tool_call>'


class ScriptedEngine:
    """Samples nothing: returns the next scripted turn's ids (cut at a stop string as both engines
    cut, text made by the engines' own completion_text), with made-up log-probs."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []

    def generate(self, prompts, settings):
        eot = {self.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt.prompt_ids))
            ids = self.tokenizer(self.turns.pop(0), add_special_tokens=False)["input_ids"]
            text = completion_text(self.tokenizer, ids, "stop", eot, settings.stop)
            out.append([Completion(list(prompt.prompt_ids), ids, text, [-0.5] * len(ids), "stop")])
        return out


@pytest.mark.parametrize("stop", [[], ["</tool_call>"]])
def test_tool_call_turn_then_answer(tiny_arch_dir, stop):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_arch_dir("qwen2"))
    first = CALL if stop else CALL + "<|im_end|>"  # with the stop string the turn ends at the tag
    engine = ScriptedEngine(tokenizer, [first, "It is 5535.<|im_end|>"])
    runner = EpisodeRunner(CalculatorEnv, tokenizer, EpisodeSettings(max_turns=3, max_episode_tokens=400, stop=tuple(stop)))
    (group,) = runner.run(engine, [PromptSample("What is 123 * 45?", fields={"answer": 5535})], SamplingSettings(n=1))
    (episode,) = group
    assert (episode.finish_reason, episode.episode["end"], episode.episode["return"]) == ("stop", "done", 1.0)
    assert (episode.episode["tool_calls"], episode.episode["tool_errors"]) == (1, 0)
    first_ids = tokenizer(first, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer("It is 5535.<|im_end|>", add_special_tokens=False)["input_ids"]
    mask = list(episode.completion_mask)
    n_obs = len(mask) - len(first_ids) - len(answer_ids)
    assert mask == [1] * len(first_ids) + [0] * n_obs + [1] * len(answer_ids)
    assert episode.completion_ids[: len(first_ids)] == first_ids
    assert episode.completion_ids[-len(answer_ids) :] == answer_ids
    observation = tokenizer.decode(episode.completion_ids[len(first_ids) : len(first_ids) + n_obs])
    closing = "<|im_end|>\n" if stop else "\n"  # the template's closing the policy did not sample
    assert observation == closing + "<|im_start|>tool\n5535<|im_end|>\n<|im_start|>assistant\n"
    # The second turn was asked with exactly the first prompt, the sampled ids and the observation.
    assert engine.prompts[1] == episode.prompt_ids + episode.completion_ids[: len(first_ids) + n_obs]
    assert [t["role"] for t in episode.episode["turns"]] == ["system", "user", "assistant", "tool", "assistant"]


def test_a_shaped_return_is_not_a_solve(tiny_arch_dir):
    """With a format reward, a tool call that ran earns 0.1 whatever the answer; accuracy (train/accuracy,
    the correct/wrong lengths, the eval harness's accuracy and pass@k) counts the environment's
    verdict on the final answer, not "return above 0", which would count the wrong answer below."""
    from functools import partial

    from transformers import AutoTokenizer

    from polyrl.envs.base import episode_accuracy_value
    from polyrl.rollout.collector import CollectSettings, RolloutCollector

    tokenizer = AutoTokenizer.from_pretrained(tiny_arch_dir("qwen2"))
    call = CALL + "<|im_end|>"
    # Prompt 1: call, then the right product; prompt 2: call, then a wrong one; prompt 3: calls
    # until max_turns (2) cuts it, no answer. The runner plays each turn of all live episodes as
    # one batch: the first turns of the three, then the second turns.
    turns = [call, call, call, "It is 5535.<|im_end|>", "It is 5534.<|im_end|>", call]
    engine = ScriptedEngine(tokenizer, turns)
    runner = EpisodeRunner(
        partial(CalculatorEnv, format_reward=0.1), tokenizer, EpisodeSettings(max_turns=2, max_episode_tokens=400)
    )
    question = PromptSample("What is 123 * 45?", fields={"answer": 5535})
    collector = RolloutCollector(
        engine, None, lambda count: [question] * count, CollectSettings(prompts_per_step=3, samples_per_prompt=1), episodes=runner
    )
    collected = collector.collect(1)
    records = [c.episode for c in collected.rollout.completions]
    assert [r["end"] for r in records] == ["done", "done", "max_turns"]
    # Returns: 0.1 + 1 = 1.1 (solved), 0.1 + 0 = 0.1 (wrong), 0.1 (cut after its calls): all above 0.
    assert [r["return"] for r in records] == pytest.approx([1.1, 0.1, 0.1])
    assert [r["solved"] for r in records] == [True, False, False]
    assert [episode_accuracy_value(r) for r in records] == [1.0, 0.0, 0.0]
    assert collected.scores.metrics["train/accuracy"] == pytest.approx(1 / 3)  # the returns alone would say 3 of 3
    assert collected.scores.totals == pytest.approx([1.1, 0.1, 0.1])  # the reward is still the return
    # An environment that gives no verdict: accuracy falls back to the return.
    assert episode_accuracy_value({"return": 0.5, "solved": None}) == 0.5
    assert episode_accuracy_value({"return": 0.0}) == 0.0
