"""A teacher named by a polyrl run (``distill.teacher.run: <id>[@<step>]``): found in the tracking
store and exported as ``polyrl eval --model run:<id>`` finds it, before the arm is built."""

from __future__ import annotations

import pytest
import torch

from polyrl.config.schema import ConfigError, resolve_arms


def _checkpointed_run(tmp_path, uri, model_dir) -> str:
    """An MLflow run whose checkpoint folder holds the model at steps 2 and 4 (each step's head shifted)."""
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM

    from polyrl.trainer.checkpoint import save_checkpoint

    arm_dir = tmp_path / "runs" / "teacher_exp" / "main"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    for step in (2, 4):
        with torch.no_grad():
            model.lm_head.weight.add_(0.01 * step)
        save_checkpoint(arm_dir / f"step_{step:06d}", step=step, models={"policy": model}, optimizers={},
                        state={"policy_path": str(model_dir)})  # fmt: skip
    client = MlflowClient(uri)
    tags = {"polyrl.checkpoint_dir": str(arm_dir), "polyrl.arm": "main"}
    return client.create_run(client.create_experiment("teacher"), tags=tags).info.run_id


def test_a_run_teacher_is_its_checkpoint_exported_and_a_missing_run_is_refused(tmp_path, random_policy_dir, tiny_experiment):
    from safetensors.torch import load_file

    from polyrl.launch.arm_steps import resolve_teacher_run
    from polyrl.trainer.build_arm import build_arm

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = _checkpointed_run(tmp_path, uri, random_policy_dir)
    raw = tiny_experiment(model={"path": str(random_policy_dir), "cache_dir": str(tmp_path / "cache")})
    base = load_file(str(random_policy_dir / "model.safetensors"))["lm_head.weight"]
    for ref, step in ((run_id, 4), (f"run:{run_id}@2", 2)):
        config = resolve_arms({**raw, "distill": {"teacher": {"run": ref}}})["main"]
        folder = resolve_teacher_run(config, tracking_uri=uri)
        assert folder.is_relative_to(tmp_path / "cache" / "eval-exports")
        head = load_file(str(folder / "model.safetensors"))["lm_head.weight"]
        # Step 2's head is the base + 0.02; step 4's the base + 0.02 + 0.04.
        assert torch.allclose(head, base + (0.02 if step == 2 else 0.06), atol=1e-6)
    # The export is the teacher of a built arm (its tokenizer is the student's: the run trained it).
    arm = build_arm(config, arm="main", arm_dir=tmp_path / "runs" / "student", teacher_path=folder)
    try:
        assert arm.collector.teacher.path == folder
    finally:
        arm.close()
    missing = resolve_arms({**raw, "distill": {"teacher": {"run": "0123456789abcdef"}}})["main"]
    with pytest.raises(ConfigError, match=r"^distill\.teacher\.run: .*no MLflow run '0123456789abcdef'"):
        resolve_teacher_run(missing, tracking_uri=uri)
    with pytest.raises(ConfigError, match="found in the tracking store when polyrl run"):
        build_arm(missing, arm="main", arm_dir=tmp_path / "runs" / "unresolved")
