"""The end-of-turn closing with templates that trim the assistant's content (Llama 3, Gemma).

Before, the closing was found by locating the policy's text in the rendered turn; a template
that trims it (``content | trim``) no longer holds a turn with leading or trailing blanks, and
the closing was lost: a turn that ended at an ``env.stop`` string got no ``<|eot_id|>``, and
Gemma lost the newline after ``<end_of_turn>``."""

from __future__ import annotations

from polyrl.core.types import PromptSample, SamplingSettings
from polyrl.envs.builtins.calculator import CalculatorEnv
from polyrl.envs.builtins.guess_number import GuessNumberEnv
from polyrl.rollout.episodes import EpisodeRunner, EpisodeSettings
from tests.chat_models import build_bpe_chat_tokenizer
from tests.envs.scripted import ScriptedEngine, gemma_tokenizer, observation_text

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 45"}}</tool_call>'


def test_llama3_turn_ended_at_a_stop_string_gets_its_end_of_turn_token():
    tokenizer = build_bpe_chat_tokenizer()  # Llama-3-style, trims content, no tools=: the text protocol
    first = " " + CALL  # a leading blank, which the template trims
    engine = ScriptedEngine(tokenizer, [first, "It is 5535.<|eot_id|>"], "<|eot_id|>")
    runner = EpisodeRunner(CalculatorEnv, tokenizer, EpisodeSettings(max_turns=3, max_episode_tokens=400, stop=("</tool_call>",)))
    ((episode,),) = runner.run(engine, [PromptSample("What is 123 * 45?", fields={"answer": 5535})], SamplingSettings(n=1))
    assert (episode.episode["tool_calls"], episode.episode["return"]) == (1, 1.0)
    # The policy stopped at </tool_call>: the template's <|eot_id|> closes its turn (before: missing,
    # "...</tool_call><|start_header_id|>tool...").
    assert observation_text(tokenizer, episode, first) == (
        "<|eot_id|><|start_header_id|>tool<|end_header_id|>\n\n5535<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama3_turn_that_sampled_its_end_of_turn_token_gets_no_second_one():
    tokenizer = build_bpe_chat_tokenizer()
    first = CALL + " \n<|eot_id|>"  # trailing blanks before the end of turn
    engine = ScriptedEngine(tokenizer, [first, "It is 5535.<|eot_id|>"], "<|eot_id|>")
    runner = EpisodeRunner(CalculatorEnv, tokenizer, EpisodeSettings(max_turns=3, max_episode_tokens=400))
    ((episode,),) = runner.run(engine, [PromptSample("What is 123 * 45?", fields={"answer": 5535})], SamplingSettings(n=1))
    assert observation_text(tokenizer, episode, first).startswith("<|start_header_id|>tool<|end_header_id|>")


def test_gemma_keeps_the_newline_between_turns():
    tokenizer = gemma_tokenizer()
    first = "My guess is 3 \n<end_of_turn>"  # trailing blanks, trimmed by the template
    engine = ScriptedEngine(tokenizer, [first, "7<end_of_turn>"], "<end_of_turn>")
    runner = EpisodeRunner(GuessNumberEnv, tokenizer, EpisodeSettings(max_turns=3, max_episode_tokens=400))
    ((episode,),) = runner.run(engine, [PromptSample("Guess 1 to 10.", fields={"target": 7})], SamplingSettings(n=1))
    assert (episode.episode["return"], episode.episode["assistant_turns"]) == (1.0, 2)
    # The sampled <end_of_turn> is kept as sampled; the template's "\n" after it is appended
    # (before: lost, "<end_of_turn><start_of_turn>user...").
    assert observation_text(tokenizer, episode, first) == "\n<start_of_turn>user\nHigher.<end_of_turn>\n<start_of_turn>model\n"
    # The second turn was asked with exactly the first prompt, the sampled ids and the observation.
    assert engine.prompts[1] == episode.prompt_ids + episode.completion_ids[: len(engine.prompts[1]) - len(episode.prompt_ids)]


def test_the_inspector_leaves_observation_tokens_unshaded(tiny_arch_dir):
    """An episode's observation tokens were not sampled: their stored log-prob 0.0 is no sampler
    log-prob, but the page shaded them as one (before: as log-prob 0.0, the most likely end of the scale)."""
    from polyrl.tracking.inspector import inspector_rows, sampled_token_values
    from tests.envs.scripted import chatml_tokenizer

    tokenizer = chatml_tokenizer(tiny_arch_dir)
    engine = ScriptedEngine(tokenizer, ["3<|im_end|>", "7<|im_end|>"], "<|im_end|>")
    runner = EpisodeRunner(GuessNumberEnv, tokenizer, EpisodeSettings(max_turns=3, max_episode_tokens=400))
    ((episode,),) = runner.run(engine, [PromptSample("Guess 1 to 10.", fields={"target": 7})], SamplingSettings(n=1))
    values = sampled_token_values(episode)
    assert values["ids"] == episode.completion_ids
    mask = episode.completion_mask
    assert 0 in mask and 1 in mask
    assert [x is None for x in values["sampler_logprob"]] == [m == 0 for m in mask]
    assert all(x == -0.5 for x, m in zip(values["sampler_logprob"], mask) if m)  # the engine's log-probs
    (row,) = inspector_rows([{"completion": episode.text}], token_values=[{"sampler_logprob": values["sampler_logprob"]}])
    assert [x is None for x in row["v"]["sampler_logprob"]] == [m == 0 for m in mask]
