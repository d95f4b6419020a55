"""``polyrl eval`` (the command function, in-process): MLflow eval runs, reports, comparisons,
run:<id>[@step] models, and bad input that names what is wrong and keeps finished reports."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from polyrl.cli.evaluate import eval_command

# What these tests start (pyproject.toml markers).
pytestmark = [pytest.mark.vllm, pytest.mark.mlflow_server]

ROWS = [{"id": f"r{i}", "prompt": f"Q: {i}+1=? A:", "answer": str(i + 1)} for i in range(3)]


@pytest.fixture
def app():
    app = typer.Typer()
    app.command("eval")(eval_command)
    return app


@pytest.fixture
def small_suite(tmp_path, jsonl, suite_file):
    jsonl(tmp_path / "q.jsonl", ROWS)
    return suite_file(
        tmp_path / "small.yaml",
        {
            "name": "small",
            "datasets": [{"name": "q", "source": "q.jsonl"}],  # relative to the suite file
            "generation": {"decoding": "greedy", "max_tokens": 4},
            "metrics": {"accuracy": {"extract": "last_number"}, "rewards": [{"module": "length"}]},
        },
    )


def _invoke(app, args):
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    return result.exit_code, result.output


def test_eval_two_models_log_runs_reports_and_a_comparison(app, tmp_path, small_suite, tiny_model, tiny_model_b, eval_tracking):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "reports"
    code, output = _invoke(
        app,
        [
            "--model",
            str(tiny_model),
            "--model",
            str(tiny_model_b),
            "--suite",
            str(small_suite),
            "--engine",
            "hf",
            "--out",
            str(out),
            "--experiment",
            "evals-here",
        ],
    )
    assert code == 0, output
    comparison = json.loads((out / "comparison.json").read_text())
    assert [m["slug"] for m in comparison["models"]] == ["tiny-a", "tiny-b"]
    assert "| q/accuracy |" in (out / "comparison.md").read_text()
    client = MlflowClient(eval_tracking)
    experiment = client.get_experiment_by_name("evals-here")
    runs = {r.data.tags["polyrl.model"]: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {str(tiny_model), str(tiny_model_b)}
    for model, slug in ((tiny_model, "tiny-a"), (tiny_model_b, "tiny-b")):
        run = runs[str(model)]
        report = json.loads((out / slug / "report.json").read_text())
        samples = [json.loads(line) for line in (out / slug / "samples.jsonl").read_text().splitlines()]
        assert run.info.status == "FINISHED" and run.data.tags["polyrl.suite"] == "small"
        assert "polyrl.evaluates_run" not in run.data.tags  # a plain folder evaluates no run
        assert report["mlflow_run_id"] == run.info.run_id
        # Accuracy recomputed from the per-sample table: the last number equals the answer.
        import re

        def last_number(text):
            found = re.findall(r"-?\d+(?:\.\d+)?", text)
            return found[-1] if found else None

        correct = [
            float(last_number(s["completion"]) is not None and float(last_number(s["completion"])) == float(s["answer"]))
            for s in samples
        ]
        assert [s["correct"] for s in samples] == correct
        assert report["metrics"]["q/accuracy"] == pytest.approx(sum(correct) / len(correct))
        assert run.data.metrics["q/accuracy"] == pytest.approx(report["metrics"]["q/accuracy"])
        assert comparison["metrics"]["q/length/mean"][slug] == pytest.approx(sum(s["length"] for s in samples) / 3)
        table = json.loads(
            client.download_artifacts(run.info.run_id, "samples.json", str(tmp_path / slug))
            and (tmp_path / slug / "samples.json").read_text()
        )
        assert [row["completion"] for row in _table_rows(table)] == [s["completion"] for s in samples]
        assert "report/report.md" in {a.path for a in client.list_artifacts(run.info.run_id, "report")}


def _table_rows(table: dict) -> list[dict]:
    """MLflow's log_table JSON (pandas 'split' orientation) back to rows."""
    return [dict(zip(table["columns"], values)) for values in table["data"]]


def test_eval_run_ref_uses_latest_or_named_checkpoint(app, tmp_path, small_suite, tiny_model, eval_tracking):
    import torch
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from polyrl.trainer.checkpoint import save_checkpoint

    arm_dir = tmp_path / "runs" / "exp" / "grpo"
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    for step in (2, 4):
        with torch.no_grad():
            model.lm_head.weight.add_(0.01)  # each checkpoint differs
        save_checkpoint(
            arm_dir / f"step_{step:06d}",
            step=step,
            models={"policy": model},
            optimizers={},
            state={"policy_path": str(tiny_model)},
        )
    client = MlflowClient(eval_tracking)
    tags = {"polyrl.checkpoint_dir": str(arm_dir), "polyrl.arm": "grpo", "polyrl.seed": "1"}
    train_run = client.create_run(client.create_experiment("train"), tags=tags).info.run_id
    cache = tmp_path / "exports"
    for ref, step in ((f"run:{train_run}", 4), (f"run:{train_run}@2", 2)):
        out = tmp_path / f"out-{step}"
        code, output = _invoke(
            app, ["--model", ref, "--suite", str(small_suite), "--engine", "hf", "--out", str(out), "--cache-dir", str(cache)]
        )
        assert code == 0, output
        report = json.loads((out / "report.json").read_text())
        assert report["model"]["run_id"] == train_run and report["model"]["step"] == step
        exported = load_file(str(cache / train_run / f"step_{step:06d}" / "model.safetensors"))
        policy = load_file(str(arm_dir / f"step_{step:06d}" / "policy.safetensors"))
        assert torch.equal(exported["lm_head.weight"], policy["lm_head.weight"])
        run = client.get_run(report["mlflow_run_id"])
        assert run.data.tags["polyrl.evaluates_run"] == train_run
        assert run.data.tags["polyrl.checkpoint_step"] == str(step)
        assert client.get_metric_history(run.info.run_id, "q/accuracy")[0].step == step
        # The per-example outcomes: in the eval run, and in the training run it evaluated.
        for run_id, name, table in (
            (run.info.run_id, f"step_{step:05d}.jsonl", "samples.json"),
            (train_run, f"step_{step:05d}.polyrl-eval.jsonl", f"runs:/{run.info.run_id}/samples.json"),
        ):
            path = client.download_artifacts(run_id, f"eval_examples/small/{name}", str(tmp_path / f"dl-{step}"))
            rows = [json.loads(line) for line in open(path)]
            assert [(r["example_id"], r["arm"], r["seed"], r["step"]) for r in rows] == [
                (f"r{i}", "grpo", 1, step) for i in range(3)
            ]
            assert rows[2]["sample_ref"] == f"{table}#2"
    code, output = _invoke(
        app, ["--model", f"run:{train_run}@3", "--suite", str(small_suite), "--engine", "hf", "--cache-dir", str(cache)]
    )
    assert code != 0 and "no checkpoint at step 3" in output and "[2, 4]" in output
    code, output = _invoke(app, ["--model", "run:0123456789abcdef", "--suite", str(small_suite), "--engine", "hf"])
    assert code != 0 and "no MLflow run '0123456789abcdef'" in output


def test_eval_bad_input_names_the_problem(app, tmp_path, small_suite, tiny_model, suite_file, eval_tracking):
    code, output = _invoke(app, ["--model", str(tmp_path / "nope"), "--suite", str(small_suite), "--engine", "hf"])
    assert code != 0 and "no such model folder" in output and "nope" in output
    code, output = _invoke(app, ["--model", str(tiny_model), "--suite", "no_such_suite", "--engine", "hf"])
    assert code != 0 and "known suites" in output
    (tmp_path / "empty.jsonl").write_text("")
    empty = suite_file(tmp_path / "empty.yaml", {"name": "empty", "datasets": {"source": "empty.jsonl"}})
    code, output = _invoke(app, ["--model", str(tiny_model), "--suite", str(empty), "--engine", "hf"])
    assert code != 0 and "empty.jsonl" in output and "empty" in output
    code, output = _invoke(app, ["--model", str(tiny_model), "--suite", str(small_suite), "--engine", "tpu"])
    assert code != 0 and "allowed: hf, vllm" in output


def test_eval_failing_metric_keeps_the_finished_report(app, tmp_path, small_suite, tiny_model, suite_file, eval_tracking):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "report"
    code, output = _invoke(app, ["--model", str(tiny_model), "--suite", str(small_suite), "--engine", "hf", "--out", str(out)])
    assert code == 0, output
    before = {p.name: p.read_text() for p in out.iterdir()}
    (tmp_path / "flaky.py").write_text(
        "class Flaky:\n    name = 'flaky'\n    def setup(self):\n        pass\n"
        "    def score(self, batch):\n        raise RuntimeError('scorer exploded')\n"
    )
    broken = suite_file(
        tmp_path / "broken.yaml",
        {
            "name": "small",
            "datasets": [{"name": "q", "source": "q.jsonl"}],
            "generation": {"max_tokens": 4},
            "metrics": {"rewards": [{"module": f"{tmp_path / 'flaky.py'}:Flaky"}]},
        },
    )
    code, output = _invoke(
        app,
        [
            "--model",
            str(tiny_model),
            "--suite",
            str(broken),
            "--engine",
            "hf",
            "--out",
            str(out),
            "--experiment",
            "failing-metric",
        ],
    )
    assert code != 0
    assert "metric 'flaky' failed" in output and "scorer exploded" in output
    assert {p.name: p.read_text() for p in out.iterdir()} == before  # the finished report is intact
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report.")]  # no staging left behind
    client = MlflowClient(eval_tracking)
    failed = [
        r
        for r in client.search_runs([client.get_experiment_by_name("failing-metric").experiment_id])
        if r.info.status == "FAILED"
    ]
    assert len(failed) == 1 and "scorer exploded" in failed[0].data.tags["polyrl.error"]


def test_eval_with_its_mlflow_server_down_is_one_message_in_seconds(app, tmp_path, small_suite, tiny_model):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the socket is
    started = time.monotonic()
    code, output = _invoke(
        app,
        [
            "--model",
            str(tiny_model),
            "--suite",
            str(small_suite),
            "--engine",
            "hf",
            "--tracking-uri",
            uri,
            "--out",
            str(tmp_path / "report"),
        ],
    )
    assert code != 0 and f"cannot reach MLflow at {uri}" in output and "nothing was trained or logged" not in output
    assert "nothing was evaluated or logged" in output
    assert time.monotonic() - started < 15
    assert not (tmp_path / "report").exists()  # before any engine or report


def test_eval_of_a_lora_run_loads_base_plus_adapter(app, tmp_path, small_suite, tiny_model, eval_tracking):
    """A model.lora checkpoint holds the adapter only; run:<id> evaluates base + adapter (merged
    into the cached export), whose logits are the adapted policy's, not the base model's."""
    import torch
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM

    from polyrl.modeling.lora import add_lora
    from polyrl.trainer.checkpoint import save_checkpoint

    lora = add_lora(AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval(), r=4, alpha=8, target_modules="all-linear")
    with torch.no_grad():
        for name, p in lora.model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.02)
    arm_dir = tmp_path / "runs" / "exp" / "lora"
    save_checkpoint(
        arm_dir / "step_000001", step=1, models={"policy": lora}, optimizers={}, state={"policy_path": str(tiny_model)}
    )
    assert not (arm_dir / "step_000001" / "policy.safetensors").exists()
    client = MlflowClient(eval_tracking)
    train_run = client.create_run(
        client.create_experiment("train-lora"), tags={"polyrl.checkpoint_dir": str(arm_dir)}
    ).info.run_id
    cache = tmp_path / "exports"
    code, output = _invoke(
        app,
        [
            "--model",
            f"run:{train_run}",
            "--suite",
            str(small_suite),
            "--engine",
            "hf",
            "--out",
            str(tmp_path / "out"),
            "--cache-dir",
            str(cache),
        ],
    )
    assert code == 0, output
    exported = AutoModelForCausalLM.from_pretrained(str(cache / train_run / "step_000001")).eval()
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        want = lora.model(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()(input_ids=ids).logits
        got = exported(input_ids=ids).logits
    assert (want - base).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_eval_of_a_run_formats_prompts_as_the_run_was_trained(app, tmp_path, small_suite, chat_model_dir, eval_tracking):
    """A run trained with data.chat_template (and a system prompt) is asked the suite's plain
    prompts through its chat template, with its system prompt, as its periodic evals were; the
    model folder itself, evaluated on the same suite, gets the raw prompts."""
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM

    from polyrl.trainer.checkpoint import save_checkpoint

    model = AutoModelForCausalLM.from_pretrained(str(chat_model_dir))
    arm_dir = tmp_path / "runs" / "exp" / "chat"
    config = {"data": {"chat_template": True, "system_prompt": "Answer briefly.", "messages_field": "messages"}}
    save_checkpoint(
        arm_dir / "step_000001",
        step=1,
        models={"policy": model},
        optimizers={},
        state={"policy_path": str(chat_model_dir), "config": config},
    )
    client = MlflowClient(eval_tracking)
    train_run = client.create_run(
        client.create_experiment("train-chat"), tags={"polyrl.checkpoint_dir": str(arm_dir)}
    ).info.run_id
    prompts = {}
    for name, ref in (("run", f"run:{train_run}"), ("folder", str(chat_model_dir))):
        out = tmp_path / f"out-{name}"
        code, output = _invoke(
            app,
            [
                "--model",
                ref,
                "--suite",
                str(small_suite),
                "--engine",
                "hf",
                "--out",
                str(out),
                "--cache-dir",
                str(tmp_path / "exports"),
            ],
        )
        assert code == 0, output
        run = client.get_run(json.loads((out / "report.json").read_text())["mlflow_run_id"])
        table = json.loads(open(client.download_artifacts(run.info.run_id, "samples.json", str(tmp_path))).read())
        column = table["columns"].index("prompt")  # MLflow's table: columns and rows of values
        prompts[name] = [row[column] for row in table["data"]]
    assert (
        all("Answer briefly." in p and "<|start_header_id|>" in p for p in prompts["run"]) and "Q: 0+1=? A:" in prompts["run"][0]
    )
    assert prompts["folder"][0].startswith("Q: 0+1=? A:") and "<|start_header_id|>" not in prompts["folder"][0]
