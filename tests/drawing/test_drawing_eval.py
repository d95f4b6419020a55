"""The drawing eval suite runs on a drawing policy and its numbers agree with the drawing reward."""

import pytest

from polyrl.engines.base import build_rollout_engine
from polyrl.evals import SuiteRunner
from polyrl.rewards import RewardBatch
from polyrl.rewards.builtins.drawing import Drawing


@pytest.mark.slow
def test_drawing_suite_scores_cells_and_the_training_reward(drawing_policy_dir):
    runner = SuiteRunner("drawing", limit=12)
    assert runner.suite.metrics.accuracy is False
    engine = build_rollout_engine("hf", str(drawing_policy_dir), seed=0)
    result = runner.run(engine)
    groups = engine.generate(runner.datasets[0].samples, runner.settings)  # greedy: the same completions again
    completions = [g[0].text for g in groups]
    batch = RewardBatch.from_samples(runner.datasets[0].samples, completions)
    cells = Drawing(text_weight=0.0).score(batch)
    reward = Drawing().score(batch)
    assert result.datasets == {"drawing": {"prompts": 12, "samples": 12}}
    assert result.metrics["drawing/reward/cells/mean"] == pytest.approx(sum(cells) / 12, abs=1e-9)
    assert result.metrics["drawing/reward/drawing/mean"] == pytest.approx(sum(reward) / 12, abs=1e-9)
    assert 0.0 < result.metrics["drawing/reward/cells/mean"] < 1.0
