"""State-space models: refused for what they are, with the way out.

A pure state-space model (Mamba, Mamba-2: no attention layer) was refused packed rows with
"needs sdpa attention … this policy uses 'eager'", which sends a user after an attention setting
that cannot help: the scan itself carries one row into the next. A model vLLM's CPU build cannot
run (Jamba: its Mamba-1 mixer's prefill needs the compiled ``selective_scan_fwd``) started, then
failed at the first generate in a long kernel traceback; it is now refused when the engine is
built and in the pre-flight of a run, naming ``rollout.engine: hf``.

The models are transformers' own config classes at tiny sizes, built here (nothing is downloaded).
"""

from __future__ import annotations

import io

import pytest
import torch
import transformers
from rich.console import Console
from transformers import AutoModelForCausalLM

from polyrl.core.errors import PolyrlError
from polyrl.modeling.packing import padding_free_refusal
from polyrl.modeling.shared_prompts import sharing_refusal
from polyrl.policies.architectures import build_bpe_tokenizer
from polyrl.policies.text import save_model_dir

MAMBA = ("MambaConfig", dict(hidden_size=64, state_size=8, num_hidden_layers=2, expand=2))
MAMBA2 = ("Mamba2Config", dict(hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, num_heads=4, head_dim=32, n_groups=1))
# Jamba: a Mamba-1 layer, then an attention layer with a two-expert MoE.
JAMBA = (
    "JambaConfig",
    dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=2,
        num_experts_per_tok=1, mamba_d_state=8, mamba_expand=2, mamba_dt_rank=8,
    ),
)  # fmt: skip
LLAMA = (
    "LlamaConfig",
    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1),
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_bpe_tokenizer(vocab_size=300, corpus=["What is 12 + 7? The answer is 19.\n" * 40])


def tiny(spec, tokenizer):
    class_name, settings = spec
    config = getattr(transformers, class_name)(
        vocab_size=len(tokenizer), max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **settings,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("state_space")
    return {name: save_model_dir(tiny(spec, tokenizer), tokenizer, root / name) for name, spec in
            {"mamba": MAMBA, "jamba": JAMBA, "llama": LLAMA}.items()}  # fmt: skip


@pytest.mark.parametrize("spec, mixer", [(MAMBA, "MambaMixer"), (MAMBA2, "Mamba2Mixer")])
def test_a_pure_state_space_model_is_refused_packing_for_its_scan_not_for_its_attention(spec, mixer, tokenizer):
    model = tiny(spec, tokenizer)
    for reason in (padding_free_refusal(model), sharing_refusal(model, takes_images=False)):
        assert reason is not None and "has no attention layer" in reason and f"state-space scan ({mixer})" in reason, reason
        assert "sdpa" not in reason
    assert "rows packed end to end" in padding_free_refusal(model)
    assert "a prompt's completions in one row" in sharing_refusal(model, takes_images=False)


def test_models_with_attention_keep_their_own_verdicts(tokenizer):
    assert padding_free_refusal(tiny(LLAMA, tokenizer)) is None
    # A hybrid has attention: the probe judges it (it leaks), not the attention-free check.
    reason = padding_free_refusal(tiny(JAMBA, tokenizer))
    assert reason is not None and "has no attention layer" not in reason


def test_a_run_asking_packed_rows_of_a_mamba_is_refused_naming_the_scan(folders, tmp_path, write_experiment):
    from polyrl.launch.runner import run_experiment

    config = {
        "name": "mamba_packed",
        "seed": 0,
        "model": {"path": str(folders["mamba"])},
        "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 2, "max_tokens": 4},
        "rewards": [{"module": "length", "params": {"unit": "chars"}}],
        "train": {"steps": 1, "micro_batch_size": 4, "padding_free": True},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs")},
    }
    with pytest.raises(PolyrlError, match=r"train\.padding_free: MambaForCausalLM has no attention layer.*MambaMixer"):
        run_experiment(write_experiment(tmp_path, config), console=Console(file=io.StringIO()), show_progress=False)


# --- vLLM's CPU build and the Mamba-1 scan --------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_missing():
    pytest.importorskip("vllm")
    from polyrl.engines.vllm_kernels import _has_mamba1_scan_kernel

    if _has_mamba1_scan_kernel():
        pytest.skip("this vLLM build has selective_scan_fwd (a CUDA build): Jamba runs on it")


def test_jamba_is_found_to_need_the_scan_kernel_and_others_are_not(folders, kernel_missing):
    from polyrl.engines.vllm_kernels import missing_vllm_kernel

    reason = missing_vllm_kernel(folders["jamba"])
    assert reason is not None and "JambaForCausalLM" in reason and "selective_scan_fwd" in reason, reason
    assert missing_vllm_kernel(folders["mamba"]) is not None  # vLLM's Mamba builds the same mixer
    assert missing_vllm_kernel(folders["llama"]) is None


def test_the_vllm_engine_refuses_jamba_before_it_starts_naming_the_hf_engine(folders, kernel_missing):
    from polyrl.engines.base import build_rollout_engine
    from polyrl.engines.vllm_kernels import MissingKernelError

    with pytest.raises(PolyrlError) as caught:
        build_rollout_engine("vllm", str(folders["jamba"]), seed=0, kv_cache_gb=0.1, max_model_len=64)
    message = str(caught.value)
    assert str(folders["jamba"]) in message and "JambaForCausalLM" in message and "selective_scan_fwd" in message
    assert "rollout.engine: hf" in message
    assert isinstance(caught.value.__cause__, MissingKernelError)


def test_the_preflight_of_a_run_refuses_jamba_with_vllm_and_not_with_hf(folders, kernel_missing):
    from polyrl.config.experiment import ExperimentConfig
    from polyrl.launch.preflight import arm_problems

    def config(engine: str) -> ExperimentConfig:
        return ExperimentConfig(
            name="jamba", model={"path": str(folders["jamba"])}, rollout={"engine": engine},
            rewards=[{"module": "length", "params": {"unit": "chars"}}],
        )  # fmt: skip

    problems = [p for p in arm_problems(config("vllm"), runs_here=True) if p.startswith("rollout.engine")]
    assert len(problems) == 1 and "selective_scan_fwd" in problems[0] and "allowed here: rollout.engine: hf" in problems[0]
    assert not [p for p in arm_problems(config("hf"), runs_here=True) if p.startswith("rollout.engine")]
    # polyrl validate (not runs_here) does not import vLLM for it.
    assert not [p for p in arm_problems(config("vllm")) if p.startswith("rollout.engine")]


def test_only_a_config_with_state_space_settings_sends_the_preflight_to_vllm(folders):
    from polyrl.launch.preflight_this_machine import _declares_state_space

    assert _declares_state_space(folders["jamba"] / "config.json")  # mamba_d_state, mamba_expand …
    assert _declares_state_space(folders["mamba"] / "config.json")  # state_size
    assert not _declares_state_space(folders["llama"] / "config.json")
