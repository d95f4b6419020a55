"""Chat prompts through a whole training run and the eval harness: the rewards see the user's
question and a completion without template tokens, the sample tables show the prompt as the
model saw it, periodic eval formats its prompts as training does, and a model without a chat
template is refused before anything runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from polyrl.config.schema import ExperimentConfig
from polyrl.data.chat import ChatTemplateError
from polyrl.evals.harness import SuiteRunner
from polyrl.launch.preflight import arm_problems

RECORDING_REWARD = '''
import json


class Recording:
    """Scores 1.0 and appends what it was given to a file (one JSON line per batch)."""

    name = "recording"

    def __init__(self, path):
        self.path = path

    def score(self, batch):
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"prompts": list(batch.prompts), "completions": list(batch.completions)}) + "\\n")
        return [1.0] * len(batch)
'''
HEADER = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nAnswer briefly.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is "
SUITE = {
    "name": "chatq",
    "datasets": [{"name": "q", "source": "arithmetic_chat", "split": "test", "limit": 2}],
    "generation": {"decoding": "greedy", "max_tokens": 6},
    "metrics": {"accuracy": {"extract": "auto"}, "pass_at_k": [1]},
}


def _table(client, run_id: str, artifact: str, folder: Path) -> list[dict]:
    table = json.loads(Path(client.download_artifacts(run_id, artifact, str(folder))).read_text())
    return [dict(zip(table["columns"], values)) for values in table["data"]]


@pytest.mark.slow
def test_a_chat_run_formats_once_and_shows_the_model_prompt(tmp_path, chat_model_dir, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from polyrl.launch.runner import run_experiment

    (tmp_path / "recording.py").write_text(RECORDING_REWARD)
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(SUITE))
    seen = tmp_path / "seen.jsonl"
    config = {
        "name": "chat-run",
        "model": {"path": str(chat_model_dir)},
        # arithmetic_chat rows carry messages: chat formatting is on without chat_template: true.
        "data": {"source": "arithmetic_chat", "system_prompt": "Answer briefly."},
        "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 2, "max_tokens": 24},
        "rewards": [{"module": f"{tmp_path / 'recording.py'}:Recording", "params": {"path": str(seen)}}, {"module": "length"}],
        "train": {"steps": 2, "micro_batch_size": 4},
        "tracking": {"uri": mlflow_uri, "progress": False},
        "checkpoint": {"dir": str(tmp_path / "runs"), "every": 2},
        "eval": {"every": 2, "suite": str(tmp_path / "suite.yaml")},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_experiment(path, console=None, show_progress=False)
    run_id = result.arm_run_ids["main"]
    client = MlflowClient(mlflow_uri)
    assert all(math.isfinite(m.value) for m in client.get_metric_history(run_id, "actor/loss"))

    batches = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(batches) == 2
    for batch in batches:  # rewards: the user's question and the completion text, no template tokens
        assert all(p.startswith("What is ") and p.endswith("? Answer with the number only.") for p in batch["prompts"])
        assert not any("<|" in c for c in batch["completions"])
    samples = _table(client, run_id, "samples/step_00001.json", tmp_path / "dl")
    # The table: the prompt as the model saw it, system prompt and template tokens included.
    assert samples and all(row["prompt"].startswith(HEADER) for row in samples)
    assert all(row["prompt"].endswith("<|start_header_id|>assistant<|end_header_id|>\n\n") for row in samples)
    assert [row["completion"] for row in samples] == batches[0]["completions"][: len(samples)]
    # Periodic eval sets no chat settings of its own: it formats as the run's training prompts.
    evals = _table(client, run_id, "eval_samples/step_00002.json", tmp_path / "dl2")
    assert len(evals) == 2 and all(row["prompt"].startswith(HEADER) for row in evals)


def test_a_model_without_a_chat_template_is_refused_before_anything_runs(tmp_path, random_policy_dir, chat_model_dir):
    config = ExperimentConfig(name="t", model={"path": str(random_policy_dir)}, data={"chat_template": True})
    assert any(p.startswith("data.chat_template: true, but the tokenizer of model.path") for p in arm_problems(config))
    assert not any(
        "chat_template" in p
        for p in arm_problems(config.model_copy(update={"model": config.model.model_copy(update={"path": str(chat_model_dir)})}))
    )
    off = ExperimentConfig(name="t", model={"path": str(chat_model_dir)}, data={"chat_template": False, "system_prompt": "s"})
    assert any(
        p.startswith("data.system_prompt: set, but prompts are not formatted through a chat template") for p in arm_problems(off)
    )
    # polyrl eval: a chat suite on a model without a template fails in check_model, before any engine starts.
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(SUITE))
    runner = SuiteRunner(tmp_path / "suite.yaml")
    runner.check_model(chat_model_dir)
    with pytest.raises(ChatTemplateError, match=r"datasets\[q\]\.messages_field: the rows carry a 'messages' column"):
        runner.check_model(random_policy_dir)


def test_eval_rows_show_the_model_prompt_and_score_the_clean_text(tmp_path, chat_model_dir):
    from polyrl.engines.hf_engine import HFRolloutEngine

    suite = {**SUITE, "datasets": [{**SUITE["datasets"][0], "system_prompt": "Answer briefly."}]}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    runner = SuiteRunner(tmp_path / "suite.yaml")
    engine = HFRolloutEngine(str(chat_model_dir))
    result = runner.run(engine)
    assert [row["prompt"].startswith(HEADER) for row in result.rows] == [True, True]
    assert all("<|" not in row["completion"] for row in result.rows)
    first = runner.prompts(engine, runner.datasets[0])
    assert runner.prompts(engine, runner.datasets[0]) is first  # formatted once per tokenizer
