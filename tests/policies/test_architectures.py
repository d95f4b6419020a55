"""Any causal LM folder: tiny random Llama, Qwen2, Qwen3, Mistral, Gemma 3 (text), Gemma 2 and
Phi-3 models, each with a BPE tokenizer trained here and a chat template (the session fixture
``tiny_arch_dir``), go through the whole platform as a downloaded model would.

Per architecture, one experiment of two arms: ``vllm`` (2 steps with vLLM rollouts: the
sampler/learner log-prob gap of step 1 checks the load, that of step 2 the weight sync after
an update, both <= 1e-5 in fp32) and ``hf`` (transformers generate), stopped by a SIGTERM
after its step 1 (as a scheduler stops a job: a checkpoint of that step, then exit); the
resumed run trains its step 2 into the same MLflow run, and ``polyrl eval`` scores that
checkpoint (run:<id>). Every architecture's own default head tying is used: Gemma ties its
output head to the embedding, the others do not, so both kinds of head are synced here (and
test_tied_and_untied_heads_follow_a_sync checks each head alone).

Two hybrids, whose layers mix tokens outside attention (Falcon-H1: Mamba beside attention and a
logit multiplier after the head; LFM2: convolution layers), train with packing off, which
``padding_free: auto`` chooses at set-up and says why; ``true`` is refused. Falcon-H1 also runs
the whole matrix above (vLLM's sampler agrees with the learner now that the learner applies the
multiplier: the decoder → head shortcut without it was 0.08 nats/token off vLLM). LFM2 is checked
with the HF engine only: vLLM 0.32's CPU build does not load it ('Lfm2Config' object has no
attribute 'conv_dim', with transformers 5.19).
"""

from __future__ import annotations

import json
import os
import signal

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from mlflow.tracking import MlflowClient  # noqa: E402
from rich.console import Console  # noqa: E402

from polyrl.evals.evaluate import EngineOptions, evaluate_models  # noqa: E402
from polyrl.launch.interrupts import RunInterrupted  # noqa: E402
from polyrl.launch.runner import run_experiment  # noqa: E402
from polyrl.trainer import loop  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARCHITECTURES = ["llama", "qwen2", "qwen3", "mistral", "gemma3_text", "gemma2", "phi3", "falcon_h1"]
MAX_GAP = 1e-5  # fp32 on both sides; a stale or mis-mapped weight shows as 1e-2 nats or more


def _experiment(folder, model_dir, model_type: str) -> dict:
    return {
        "name": f"arch_{model_type}",
        "seed": 0,
        "model": {"path": str(model_dir)},
        "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8, "kv_cache_gb": 0.1, "max_model_len": 128},
        "rewards": [{"module": "length", "params": {"unit": "chars"}}],
        "train": {"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 8},
        "tracking": {"uri": f"sqlite:///{folder / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(folder / "runs"), "every": 1},
        "arms": {"vllm": {"rollout": {"engine": "vllm"}}, "hf": {"rollout": {"engine": "hf"}}},
    }


def _history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_architecture_trains_with_both_engines_resumes_and_evaluates(
    model_type, tiny_arch_dir, tmp_path, write_experiment, monkeypatch
):
    model_dir = tiny_arch_dir(model_type)
    path = write_experiment(tmp_path, _experiment(tmp_path, model_dir, model_type))
    quiet = Console(quiet=True)
    steps_taken = []
    original_step = loop.TrainingLoop.step

    def sigterm_during_the_third_step(self):
        steps_taken.append(self.step_index + 1)
        if len(steps_taken) == 3:  # vllm arm: steps 1, 2; hf arm: step 1, which then ends with a checkpoint
            os.kill(os.getpid(), signal.SIGTERM)
        return original_step(self)

    monkeypatch.setattr(loop.TrainingLoop, "step", sigterm_during_the_third_step)
    with pytest.raises(RunInterrupted):
        run_experiment(path, console=quiet, show_progress=False)
    result = run_experiment(path, console=quiet, show_progress=False, resume=True)
    assert steps_taken == [1, 2, 1, 2]
    client = MlflowClient(result.tracking_uri)

    vllm_run = result.arm_run_ids["vllm"]
    gaps = _history(client, vllm_run, "rollout/logprob_gap")
    assert sorted(gaps) == [1, 2], gaps
    print(f"{model_type}: rollout/logprob_gap {gaps}")
    assert all(gap <= MAX_GAP for gap in gaps.values()), gaps  # step 2 sampled after a sync
    for arm in ("vllm", "hf"):
        losses = _history(client, result.arm_run_ids[arm], "actor/loss")
        assert losses and all(torch.isfinite(torch.tensor(v)) for v in losses.values()), (arm, losses)
        assert _history(client, result.arm_run_ids[arm], "actor/grad_norm")[1] > 0

    hf_run = result.arm_run_ids["hf"]
    assert sorted(_history(client, hf_run, "actor/loss")) == [1, 2]  # step 1 before the stop, step 2 resumed
    assert (
        len(
            client.search_runs(
                [client.get_experiment_by_name(f"arch_{model_type}").experiment_id], filter_string="tags.`polyrl.role` = 'arm'"
            )
        )
        == 2
    )  # continued, not a new run

    suite = tmp_path / "suite.yaml"
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Q: {i}+1=? A:", "answer": str(i + 1)}) + "\n" for i in range(2))
    )
    suite.write_text(
        json.dumps(
            {
                "name": "tiny",
                "datasets": [{"name": "q", "source": "q.jsonl"}],
                "generation": {"decoding": "greedy", "max_tokens": 4},
                "metrics": {"accuracy": {"extract": "last_number"}},
            }
        )
    )
    outcome = evaluate_models(
        [f"run:{hf_run}"],
        suite,
        engine=EngineOptions("hf", "float32", 128, 0.1),
        out=tmp_path / "eval",
        experiment="evals",
        tracking_uri=result.tracking_uri,
        cache_dir=tmp_path / "exports",
    )
    (report,) = outcome.reports
    assert report["model"]["step"] == 2 and "q/accuracy" in report["metrics"]
    assert client.get_run(report["mlflow_run_id"]).info.status == "FINISHED"


def _sample_and_gap(engine, model, tokenizer, seed: int) -> float:
    from polyrl.core.types import PromptSample, SamplingSettings
    from polyrl.modeling.logprobs import logprob_gap, pack_completions, token_logprobs

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 17 + 25?"}], tokenize=False, add_generation_prompt=True
    )
    groups = engine.generate(
        [PromptSample(prompt=prompt), PromptSample(prompt="Q: 76+4=? A:")], SamplingSettings(n=4, max_tokens=16, seed=seed)
    )
    batch = pack_completions([c for group in groups for c in group], pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        learner, _ = token_logprobs(model, batch)
    return logprob_gap(batch.sampling_logprobs, learner, batch.response_mask)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_tied_and_untied_heads_follow_a_sync(model_type, tied, tiny_arch_dir):
    """Only the output head moves (tied: the embedding it shares); after a sync the sampler
    agrees with the synced head (<= 1e-5) and no longer with the other one (a stale head would).
    Two syncs on one engine: first with the engine's weights kept, then back to the old head after
    the weights were dropped for an update, as the synchronous CPU loop does
    (polyrl/engines/vllm_release.py): the embedding and head come back from the sync."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from polyrl.engines.base import build_rollout_engine
    from polyrl.engines.vllm_quiet import WEIGHT_SYNC_FAILURES

    folder = tiny_arch_dir(model_type, tied=tied)
    old = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert (old.lm_head.weight is old.model.embed_tokens.weight) == tied
    new = copy.deepcopy(old)
    with torch.no_grad():
        new.lm_head.weight.add_(torch.randn(new.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)) * 0.05)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    engine = build_rollout_engine("vllm", str(folder), seed=0, kv_cache_gb=0.1, max_model_len=128)
    try:
        assert _sample_and_gap(engine, old, tokenizer, seed=1) <= MAX_GAP
        misses_before = sum(WEIGHT_SYNC_FAILURES.values())
        # Kept: the engine still holds its weights when the new ones arrive.
        engine.sync_weights(new.state_dict().items())
        # A tied head is refreshed from the embedding, not loaded by name: vLLM's "failed to load"
        # record for it is expected and must not reach the user as a stale-weights warning.
        assert sum(WEIGHT_SYNC_FAILURES.values()) == misses_before, dict(WEIGHT_SYNC_FAILURES)
        assert _sample_and_gap(engine, new, tokenizer, seed=2) <= MAX_GAP
        assert _sample_and_gap(engine, old, tokenizer, seed=3) > 1e-3  # the head did change
        # Released: the weights are dropped first, then the old head is synced back.
        assert engine.release_weights() > 0
        engine.sync_weights(old.state_dict().items())
        assert sum(WEIGHT_SYNC_FAILURES.values()) == misses_before, dict(WEIGHT_SYNC_FAILURES)
        assert _sample_and_gap(engine, old, tokenizer, seed=4) <= MAX_GAP
        assert _sample_and_gap(engine, new, tokenizer, seed=5) > 1e-3
    finally:
        engine.close()


@pytest.mark.parametrize("model_type", ["falcon_h1", "lfm2"])
def test_a_hybrid_trains_with_packing_off_and_says_why_or_is_refused(
    model_type, tiny_arch_dir, tmp_path, write_experiment, capsys
):
    """Hybrids (Falcon-H1: Mamba beside attention and a logit multiplier; LFM2: convolution layers)
    through the whole platform with the HF engine: ``padding_free: auto`` falls back at set-up with
    one line saying why (printed when the loop starts, a run tag, ``runtime.padding_free_reason``)
    and two steps train (finite loss, a gradient, the sampler and learner agree); ``true`` is
    refused naming the reason."""
    import io

    from polyrl.core.errors import PolyrlError

    model_dir = tiny_arch_dir(model_type)
    config = {
        "name": f"hybrid_{model_type}",
        "seed": 0,
        "model": {"path": str(model_dir)},
        "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 2, "max_tokens": 6},
        "rewards": [{"module": "length", "params": {"unit": "chars"}}],
        "train": {"steps": 2, "learning_rate": 1e-2, "micro_batch_size": 4, "padding_free": "auto"},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs")},
    }
    output = io.StringIO()
    result = run_experiment(write_experiment(tmp_path, config), console=Console(file=output, width=400), show_progress=False)
    client = MlflowClient(result.tracking_uri)
    (run_id,) = result.arm_run_ids.values()
    run = client.get_run(run_id)
    reason = run.data.params["runtime.padding_free_reason"]
    expected = {"falcon_h1": "after its output head", "lfm2": "per-row attention in 1 of 2 layers"}[model_type]
    assert run.data.params["runtime.padding_free"] == "False" and expected in reason, reason
    printed = capsys.readouterr().out  # the loop's lines (without a progress bar: plain print)
    assert f"[main] warning: train.padding_free: auto is off: {reason}" in printed, printed
    assert run.data.tags["health.train.padding_free"].startswith("auto is off")
    losses = _history(client, run_id, "actor/loss")
    assert sorted(losses) == [1, 2] and all(torch.isfinite(torch.tensor(v)) for v in losses.values()), losses
    assert all(v > 0 for v in _history(client, run_id, "actor/grad_norm").values())
    assert all(gap <= 1e-4 for gap in _history(client, run_id, "rollout/logprob_gap").values())

    config["name"] = f"hybrid_{model_type}_true"
    config["train"]["padding_free"] = True
    with pytest.raises(PolyrlError, match=rf"train\.padding_free: .*{expected}"):
        run_experiment(write_experiment(tmp_path, config, "true.yaml"), console=Console(file=io.StringIO()), show_progress=False)
