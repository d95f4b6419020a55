"""The judge's own engine (``params.engine``): where judge inputs become score-token log-probs or
greedy answers.

- ``hf`` (the default): polyrl's :class:`~polyrl.engines.hf_engine.HFRolloutEngine`. The
  probability reading is one direct forward of its transformers model over the batch (right
  padding); the parsed reading is its ``generate``.
- ``vllm``: polyrl's :class:`~polyrl.engines.vllm_engine.VLLMRolloutEngine`, a ``vllm.LLM`` of
  the judge's own in this process. The parsed reading is its batched greedy ``generate``. The
  probability reading asks vLLM for exactly one greedy token with ``logprob_token_ids`` (the score
  tokens): vLLM gathers their log-probs from the full-vocabulary ``log_softmax`` of the next-token
  logits in float32, the very quantity the HF path computes, so there is no top-k truncation and
  the mass on the score tokens (``min_score_mass``) is the true one. ``allowed_token_ids`` is not
  used: the engine reports processed log-probs (after logits processors), so restricting the
  vocabulary would renormalise onto the score tokens and the mass would always read 1.

The two engines then differ only by their kernels' rounding (the tests compare them). A
vLLM engine cannot hold more than ``vllm.sampling_params.MAX_LOGPROB_TOKEN_IDS`` score tokens
per request; more allowed scores are refused at set-up.

Memory: the vLLM judge starts with the smallest KV cache vLLM accepts (one judge input of
``max_input_tokens + max_new_tokens``; short inputs share it, long ones queue) unless
``kv_cache_gb`` says otherwise. vLLM's CPU backend binds torch's threads when it starts, and its
worker seeds the global random generators: the process's torch thread count and random states
are put back afterwards (the learner shares the process).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from polyrl.rewards.base import RewardConfigError
from polyrl.runtime.devices import cuda_rng_states, has_cuda, set_cuda_rng_states

JUDGE_ENGINES = ("hf", "vllm")


def start_judge_engine(
    engine: str, folder: Path, *, dtype: str, max_model_len: int, kv_cache_gb: float | None, field: str
) -> Any:
    """The judge's engine of kind ``engine`` on the model ``folder``; ``field``: the YAML path of
    ``engine`` for errors."""
    if engine == "hf":
        from polyrl.engines.hf_engine import HFRolloutEngine

        device = None if has_cuda() else "cpu"
        return HFRolloutEngine(str(folder), dtype=dtype, max_model_len=max_model_len, device=device)
    if engine != "vllm":
        raise RewardConfigError(f"judge {field}: {engine!r}; allowed: {', '.join(JUDGE_ENGINES)}")
    from polyrl.engines.kv_cache import KvCacheNeed
    from polyrl.engines.vllm_engine import VLLMRolloutEngine
    from polyrl.engines.vllm_start_errors import EngineStartError
    from polyrl.runtime.threads import set_torch_threads

    size: dict[str, Any] = (
        {"kv_cache_gb": kv_cache_gb}
        if kv_cache_gb is not None
        else {"kv_cache_need": KvCacheNeed(sequences=1, tokens_per_sequence=max_model_len)}
    )
    threads = torch.get_num_threads()
    try:
        with random_states_kept():
            return VLLMRolloutEngine(str(folder), seed=0, dtype=dtype, max_model_len=max_model_len, enforce_eager=True, **size)
    except EngineStartError as error:
        raise RewardConfigError(
            f"judge {field}: vllm could not start the judge on {str(folder)!r} ({error.__cause__!r}); "
            f"allowed: {', '.join(JUDGE_ENGINES)} (engine: hf runs any model transformers can)"
        ) from error
    finally:
        set_torch_threads(threads)


@contextmanager
def random_states_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's global random states as they were before the block. vLLM's
    worker seeds them all when it starts (``set_random_seed``): a judge started mid set-up would
    otherwise reset the run's randomness to the judge's seed, the same in every arm and run seed."""
    import random

    import numpy as np

    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = cuda_rng_states()
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.random.set_rng_state(cpu)
        set_cuda_rng_states(cuda)


def model_positions(folder: Path) -> int | None:
    """The judge model's ``max_position_embeddings`` (None when its config does not say)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    text = getattr(config, "text_config", None) or config
    positions = getattr(text, "max_position_embeddings", None)
    return int(positions) if positions else None


def max_score_tokens(engine: str) -> int | None:
    """How many score tokens one request of this engine can read the log-probs of (None: any)."""
    if engine != "vllm":
        return None
    from vllm.sampling_params import MAX_LOGPROB_TOKEN_IDS

    return int(MAX_LOGPROB_TOKEN_IDS)


@torch.no_grad()
def score_token_logprobs(engine: Any, rows: list[list[int]], token_ids: Sequence[int]) -> list[list[float]]:
    """For each judge input (token ids), the log-probabilities of ``token_ids`` as its next token,
    normalised over the whole vocabulary (float32 ``log_softmax`` of the logits)."""
    if engine.name == "vllm":
        return _vllm_logprobs(engine, rows, list(token_ids))
    return _hf_logprobs(engine, rows, list(token_ids))


def _hf_logprobs(engine: Any, rows: list[list[int]], token_ids: list[int]) -> list[list[float]]:
    # Right padding: a causal model's logits at a row's last real token do not see the padding after it.
    model = engine.model
    device = next(model.parameters()).device
    width = max(len(r) for r in rows)
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, : len(r)] = torch.tensor(r)
        mask[k, : len(r)] = 1
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    last = torch.tensor([len(r) - 1 for r in rows], device=logits.device)
    final = logits[torch.arange(len(rows), device=logits.device), last]
    log_probs = torch.log_softmax(final.float(), dim=-1)[:, token_ids]
    return log_probs.cpu().tolist()


def _vllm_logprobs(engine: Any, rows: list[list[int]], token_ids: list[int]) -> list[list[float]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    # Greedy, one token: vLLM then reports log_softmax of the untempered logits (the engine's
    # processed log-probs equal the raw ones when nothing processes them).
    params = SamplingParams(n=1, temperature=0.0, top_k=0, max_tokens=1, logprob_token_ids=token_ids)
    outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=list(r)) for r in rows], params, use_tqdm=False)
    values = []
    for output in outputs:  # LLM.generate returns outputs in input order
        position = output.outputs[0].logprobs[0]  # {token id: Logprob}, the sampled token included
        values.append([float(position[t].logprob) for t in token_ids])
    return values
