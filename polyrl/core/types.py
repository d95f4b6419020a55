"""Data that crosses phase boundaries: one prompt, one completion, one rollout batch.

These types are shared by the rollout engines, reward modules, learner and eval harness.
They carry images and per-token modalities from the start so that the image modality plugs
in without a redesign: a text-only sample simply has no images and every token's modality
is ``"text"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PromptSample:
    """One dataset row as the platform sees it."""

    prompt: str
    references: list[str] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)
    # Every other column of the dataset row (e.g. ``answer``, ``id``), passed to rewards.
    fields: dict[str, Any] = field(default_factory=dict)
    # Chat prompts (polyrl/data/chat.py): the prompt as the model sees it, template tokens
    # included, and its token ids, made once; the engines send these ids and the learner scores
    # them. ``prompt`` stays the user's text, which rewards see. None: ``prompt`` is sent as is.
    model_prompt: str | None = None
    prompt_ids: list[int] | None = None

    @property
    def shown_prompt(self) -> str:
        """The prompt as the model saw it (sample tables)."""
        return self.prompt if self.model_prompt is None else self.model_prompt


@dataclass
class Completion:
    """One sampled completion of one prompt, as returned by a rollout engine."""

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    # Log-probability of each completion token under the *sampler* (vLLM or HF), used to
    # measure the sampler/learner gap and for truncated importance-sampling correction.
    sampling_logprobs: list[float]
    finish_reason: str  # "stop" (EOS or stop string) or "length" (hit max_tokens)
    # Modality of each prompt token (None: all text).
    prompt_token_modalities: list[str] | None = None
    # Modality of each completion token ("text", "image", ...; a name of ModalitiesConfig):
    # it picks the token's GAE gamma/lambda. Left empty, every token is "text".
    completion_token_modalities: tuple[str, ...] = ()
    # The processor's image tensors of the prompt (e.g. ``pixel_values``), for the learner's
    # multimodal forward; None for a text-only prompt. Shared by the n samples of a prompt.
    image_inputs: dict[str, Any] | None = None
    # Token ids the sampler could never sample (image/special tokens of an image-text model).
    # The learner masks the same ids, so both log-probs normalise over the same vocabulary.
    banned_token_ids: tuple[int, ...] = ()
    # The policy version whose weights sampled it: 0 = the weights the engine started with, then
    # one more per weight sync (RolloutEngine.update_weights). None: an engine that does not say.
    policy_version: int | None = None
    # Episodes (polyrl/rollout/episodes.py): 1 for each completion token the policy sampled, 0 for
    # an observation token the environment appended (tool result, user message), which carries
    # no gradient and counts in no length. Empty: every token is the policy's (a plain completion).
    completion_mask: tuple[int, ...] = ()
    # Episodes: the episode turn by turn for sample tables (roles, contents, tool calls, per-turn
    # rewards, which tokens trained) and its return; None for a plain completion.
    episode: dict[str, Any] | None = None
    # On-policy distillation (config distill:): the teacher's log-prob of each completion token given the
    # prompt and the tokens before it (0 on an episode's observation tokens); empty: no teacher scored it.
    teacher_logprobs: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        self.completion_mask = tuple(int(m) for m in self.completion_mask)
        if self.teacher_logprobs and len(self.teacher_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"teacher_logprobs has {len(self.teacher_logprobs)} entries for {len(self.completion_ids)} completion tokens"
            )
        if self.completion_mask and len(self.completion_mask) != len(self.completion_ids):
            raise ValueError(
                f"completion_mask has {len(self.completion_mask)} entries for {len(self.completion_ids)} completion tokens"
            )
        if not self.completion_token_modalities:
            self.completion_token_modalities = ("text",) * len(self.completion_ids)
        else:
            self.completion_token_modalities = tuple(self.completion_token_modalities)
        if len(self.completion_token_modalities) != len(self.completion_ids):
            raise ValueError(
                f"completion_token_modalities has {len(self.completion_token_modalities)} entries for "
                f"{len(self.completion_ids)} completion tokens"
            )

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def policy_length(self) -> int:
        """The number of tokens the policy sampled (an episode's observation tokens left out)."""
        return sum(self.completion_mask) if self.completion_mask else len(self.completion_ids)


@dataclass
class SamplingSettings:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    # The position of ``prompts[0]`` in the whole batch that the per-request seeds are derived
    # from (engines/base.py request_seed): a worker pool sends each worker a slice of the batch
    # with its offset, so a prompt's samples do not depend on how the batch was split.
    first_prompt_index: int = 0
