"""The schedule model (polyrl/analysis/schedule_model.py) against hand-computed values, and its CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from polyrl.analysis.schedule_model import (
    Cluster,
    PhaseTimes,
    allreduce_s,
    best_layouts,
    busiest_share,
    predict,
    simulate_pipeline,
)

# One device: 8 + 1 + 2 + 4 + 0.5 + 0.5 = 16 s per step of 64 samples from 8 prompts.
TIMES = PhaseTimes(generate=8.0, score=1.0, logprobs=2.0, update=4.0, sync=0.5, log=0.5, prompts=8, samples=64)
LINK = {"weight_bytes": 1e9, "bandwidth_gb_s": 10.0}  # 1 GB over 10 GB/s: 0.1 s a broadcast


def test_whole_prompt_shares_and_ring_allreduce():
    assert busiest_share(8, 4) == 0.25
    assert busiest_share(8, 3) == 3 / 8  # 3 + 3 + 2 prompts: the busiest worker has 3 of 8
    assert busiest_share(8, 16) == 1 / 8  # more workers than prompts: one prompt each, the rest idle
    assert allreduce_s(1e9, 1, 10.0) == 0.0
    assert allreduce_s(1e9, 4, 10.0) == pytest.approx(0.15)  # 2 · 3/4 · 1e9 B / 1e10 B/s
    assert allreduce_s(1e9, 2, 10.0) == pytest.approx(0.1)  # 2 · 1/2 · 0.1 s


def test_one_device_is_the_measured_step():
    p = predict(TIMES, Cluster())
    assert p.step_s == pytest.approx(16.0) and p.speedup == pytest.approx(1.0) and p.samples_per_s == pytest.approx(4.0)
    assert p.communication_s == 0.0 and p.buffer_utilisation is None and p.devices == 1


def test_synchronous_colocated_on_four_devices():
    p = predict(TIMES, Cluster(workers=4, learner_ranks=4, colocated=True, **LINK))
    # generate 8 · 2/8 = 2, score 1, log-probs 2 · 16/64 = 0.5, update 4 · 16/64 = 1, all-reduce 0.15,
    # broadcast 0 (every device keeps the full weights), load 0.5, log 0.5: 5.65 s in turn
    assert p.step_s == pytest.approx(5.65)
    assert p.speedup == pytest.approx(16 / 5.65)  # 2.83×
    assert p.samples_per_s == pytest.approx(64 / 5.65)
    assert p.communication_share == pytest.approx(0.15 / 5.65)  # 2.7 %
    assert p.learner_wait_s == pytest.approx(2 + 1 + 0.5)  # synchronous: the learner waits for the whole generation side
    assert p.devices == 4 and p.buffer_utilisation is None


def test_asynchronous_generation_bound():
    p = predict(TIMES, Cluster(workers=2, learner_ranks=2, staleness=1, colocated=False, **LINK))
    # generation side: 8 · 4/8 + 1 + 0.5 = 5.5; learner side: 2 · 1/2 + 4 · 1/2 + 0.1 (all-reduce, 2 · 1/2 · 0.1)
    # + 0.1 (broadcast) + 0.5 (log) = 3.7: overlapped, the step is the slower side
    assert p.generation_side_s == pytest.approx(5.5) and p.learner_side_s == pytest.approx(3.7)
    assert p.step_s == pytest.approx(5.5) and p.speedup == pytest.approx(16 / 5.5)  # 2.91× on 4 devices
    assert p.learner_wait_s == pytest.approx(5.5 - 3.7) and p.engine_wait_s == pytest.approx(0.0)
    assert p.buffer_utilisation == 0.0  # the learner always finds the buffer empty
    assert p.communication_share == pytest.approx(0.2 / 5.5) and p.devices == 4


def test_asynchronous_learner_bound_keeps_the_buffer_full():
    p = predict(TIMES, Cluster(workers=4, learner_ranks=1, staleness=1, colocated=False, **LINK))
    # generation side: 8 · 2/8 + 1 + 0.5 = 3.5; learner side: 2 + 4 + 0 + 0.1 + 0.5 = 6.6
    assert p.step_s == pytest.approx(6.6)
    assert p.learner_wait_s == pytest.approx(0.0) and p.engine_wait_s == pytest.approx(6.6 - 3.5)  # held back by k = 1
    assert p.buffer_utilisation == 1.0 and p.devices == 5


@pytest.mark.parametrize("staleness", [1, 2, 3])
def test_pipeline_steady_state(staleness):
    # Constant phase times: k >= 1 overlaps completely, max(G, L); k only bounds how far ahead.
    assert simulate_pipeline(2.0, 3.0, staleness)["step_s"] == pytest.approx(3.0)
    assert simulate_pipeline(3.0, 2.0, staleness)["step_s"] == pytest.approx(3.0)
    assert simulate_pipeline(2.0, 3.0, staleness)["buffer_utilisation"] == pytest.approx(1.0)
    assert simulate_pipeline(3.0, 2.0, staleness)["buffer_utilisation"] == pytest.approx(0.0)
    assert simulate_pipeline(2.0, 3.0, 0)["step_s"] == pytest.approx(5.0)  # synchronous: G + L


def test_layouts_that_cannot_be_are_refused():
    with pytest.raises(ValueError, match="colocated engines need one per learner rank: workers 2 != learner_ranks 1"):
        Cluster(workers=2, learner_ranks=1, colocated=True)
    with pytest.raises(ValueError, match=r"asynchronous training \(staleness >= 1\) .* \(colocated=False\)"):
        Cluster(workers=1, learner_ranks=1, staleness=1, colocated=True)
    with pytest.raises(ValueError, match="samples >= prompts"):
        PhaseTimes(generate=1, score=0, logprobs=0, update=1, sync=0, prompts=8, samples=4)


def test_best_layouts_compare_sync_with_the_fastest_async_split():
    best = best_layouts(TIMES, 4, **LINK)
    assert best["sync"].step_s == pytest.approx(5.65)
    # async splits of 4 devices: 1 engine + 3 ranks: generation 8 + 1.5 = 9.5 > learner; 2 + 2: 5.5 (above);
    # 3 engines + 1 rank: generation 8 · 3/8 + 1.5 = 4.5, learner 6.6 → 6.6. Fastest: 2 + 2.
    assert (best["async"].cluster.workers, best["async"].cluster.learner_ranks) == (2, 2)
    assert best["async"].step_s == pytest.approx(5.5)
    assert list(best_layouts(TIMES, 1)) == ["sync"]  # one device cannot overlap


def test_scale_model_cli_from_json_and_from_an_mlflow_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from polyrl.cli.main import app

    times = tmp_path / "times.json"
    times.write_text(
        json.dumps({"generate": 8, "score": 1, "logprobs": 2, "update": 4, "sync": 0.5, "log": 0.5, "prompts": 8, "samples": 64})
    )
    result = CliRunner().invoke(
        app,
        [
            "scale-model",
            "--times",
            str(times),
            "--workers",
            "2",
            "--ranks",
            "2",
            "--staleness",
            "1",
            "--separate",
            "--weight-gb",
            "1",
            "--bandwidth-gb-s",
            "10",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "= 16 s for 64 samples" in result.output
    row = next(line for line in result.output.splitlines() if line.startswith("│ 4 "))
    assert [cell.strip() for cell in row.split("│")[1:-1]] == [
        "4",
        "1",
        "2",
        "2",
        "own",
        "5.5",
        "11.64",
        "2.91×",
        "33%",
        "0%",
        "3.6%",
    ]

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("scale")).info.run_id
    client.log_param(run_id, "rollout.prompts_per_step", 8)
    for step, generate in [(1, 30.0), (2, 8.0), (3, 10.0)]:  # step 1 (the warm-up) is left out: generate (8 + 10) / 2 = 9
        for phase, value in {"generate": generate, "score": 1, "advantage": 2, "update": 4, "sync": 0.5, "log": 0.5}.items():
            client.log_metric(run_id, f"perf/{phase}_s", value, step=step)
        client.log_metric(run_id, "rollout/samples", 64, step=step)
    result = CliRunner().invoke(app, ["scale-model", "--run", run_id, "--tracking-uri", uri, "--devices", "1"])
    assert result.exit_code == 0, result.output
    assert "generate 9 s" in result.output and "= 17 s for 64 samples (8 prompts)" in result.output  # 9 + 1 + 2 + 4 + 0.5 + 0.5

    refused = CliRunner().invoke(app, ["scale-model", "--times", str(times), "--workers", "2", "--ranks", "1", "--colocated"])
    assert refused.exit_code == 2 and "workers 2 != learner_ranks 1" in refused.output
