"""A tool-calling episode through the runner with a real tokenizer and chat template: the call's
closing tag kept for the environment when a stop string ends the turn, the template's closing of
the turn appended as observation tokens, the scripted ids untouched."""

from __future__ import annotations

import pytest

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.engines.stop_tokens import completion_text
from polyrl.envs.builtins.calculator import CalculatorEnv
from polyrl.roles.episodes import EpisodeRunner, EpisodeSettings

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
