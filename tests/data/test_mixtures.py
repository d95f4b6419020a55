"""Data mixtures (``data.sources``): counts by hand, schedules, resumption, refusals, and a
few training steps of a two-source mixture with its per-source metrics."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from polyrl.config.data import DataConfig, schedule_value
from polyrl.config.schema import resolve_arms
from polyrl.core.types import PromptSample
from polyrl.data.errors import DataConfigError
from polyrl.data.mixtures import SOURCE_FIELD, MixtureSampler, draw_counts, tag_samples
from polyrl.data.sampler import PromptSampler


def _parts(sizes: dict[str, int]) -> list[tuple[str, list[PromptSample]]]:
    return [
        (name, tag_samples([PromptSample(prompt=f"{name}-{i}") for i in range(n)], name, source=name))
        for name, n in sizes.items()
    ]


def _sources(batch: list[PromptSample]) -> list[str]:
    return [sample.fields[SOURCE_FIELD] for sample in batch]


def test_draw_counts_by_hand():
    # Weights 3:1, 2 prompts: owed (1.5, 0.5) -> whole (1, 0); the spare prompt goes to the larger
    # fraction, a tie (0.5, 0.5) won by the earlier source: (2, 0), carried (-0.5, 0.5).
    counts, carried = draw_counts([3.0, 1.0], 2, [0.0, 0.0])
    assert counts == [2, 0] and carried == [-0.5, 0.5]
    # Next draw owes (-0.5 + 1.5, 0.5 + 0.5) = (1.0, 1.0): (1, 1), nothing carried; 3 of 4 prompts to source 0.
    counts, carried = draw_counts([3.0, 1.0], 2, carried)
    assert counts == [1, 1] and carried == [0.0, 0.0]
    # Weights 1:1:1, 4 prompts: owed 4/3 each -> (1, 1, 1) + the spare to the first (ties).
    counts, carried = draw_counts([1.0, 1.0, 1.0], 4, [0.0, 0.0, 0.0])
    assert counts == [2, 1, 1] and carried == pytest.approx([-2 / 3, 1 / 3, 1 / 3])
    # A weight of 0 gets nothing and owes nothing, whatever it carried.
    assert draw_counts([1.0, 0.0], 3, [0.0, 0.9]) == ([3, 0], [0.0, 0.0])
    with pytest.raises(ValueError, match="sum to 0"):
        draw_counts([0.0, 0.0], 2, [0.0, 0.0])


def test_realised_shares_follow_the_weights_within_one_prompt():
    sampler = MixtureSampler(_parts({"a": 7, "b": 5}), [lambda s: 0.7, lambda s: 0.3], seed=3)
    drawn: list[str] = []
    for step in range(1, 51):
        drawn += _sources(sampler.next_batch(4, step=step))
        # After k prompts, source a has had 0.7 k of them, give or take less than one.
        assert abs(drawn.count("a") - 0.7 * len(drawn)) < 1
    assert len(drawn) == 200 and drawn.count("a") == 140


def test_schedule_is_piecewise_linear_and_reaches_the_draws():
    points = {0: 1.0, 100: 0.2}
    # Halfway: 1.0 + 0.5 * (0.2 - 1.0) = 0.6; before the first point its value, after the last its value.
    assert schedule_value(points, 50) == pytest.approx(0.6)
    assert schedule_value(points, 0) == 1.0 and schedule_value(points, 250) == 0.2
    assert schedule_value({10: 2.0, 20: 0.0, 30: 1.0}, 25) == pytest.approx(0.5)
    data = DataConfig.model_validate(
        {"sources": [{"source": "a", "weight": {0: 1.0, 10: 0.0}}, {"source": "b", "weight": {0: 0.0, 10: 1.0}}]}
    )
    sampler = MixtureSampler.from_config([s for _, samples in _parts({"a": 8, "b": 8}) for s in samples], data.sources, seed=0)
    assert sampler.scheduled
    assert _sources(sampler.next_batch(4, step=0)) == ["a"] * 4  # weights (1, 0)
    assert _sources(sampler.next_batch(4, step=10)) == ["b"] * 4  # weights (0, 1)
    assert sorted(_sources(sampler.next_batch(4, step=5))) == ["a", "a", "b", "b"]  # (0.5, 0.5)
    with pytest.raises(ValueError, match="draws with the step"):
        sampler.next_batch(4)


def test_a_resumed_mixture_draws_what_an_uninterrupted_one_draws():
    def make() -> MixtureSampler:
        return MixtureSampler(
            _parts({"a": 5, "b": 3, "c": 4}), [lambda s: 1.0, lambda s: 0.5 + s / 10, lambda s: 0.25], seed=11, scheduled=True
        )

    whole = make()
    straight = [[p.prompt for p in whole.next_batch(3, step=step)] for step in range(1, 13)]
    first = make()
    for step in range(1, 6):
        first.next_batch(3, step=step)
    saved = first.state_dict()
    first.next_batch(3, step=6)  # the interrupted run drew on before it stopped: the saved state is unchanged
    resumed = make()
    resumed.load_state_dict(saved)
    assert [[p.prompt for p in resumed.next_batch(3, step=step)] for step in range(6, 13)] == straight[5:]
    # Each source's own order is seeded by the run seed and its place: another seed, another order.
    other = MixtureSampler(
        _parts({"a": 5, "b": 3, "c": 4}), [lambda s: 1.0, lambda s: 0.5 + s / 10, lambda s: 0.25], seed=12, scheduled=True
    )
    assert [[p.prompt for p in other.next_batch(3, step=s)] for s in range(1, 13)] != straight


def test_mismatched_states_are_refused():
    mixture = MixtureSampler(_parts({"a": 2, "b": 2}), [lambda s: 1.0, lambda s: 1.0])
    single = PromptSampler([PromptSample(prompt="x")])
    with pytest.raises(ValueError, match="this run draws from a mixture"):
        mixture.load_state_dict(single.state_dict())
    with pytest.raises(ValueError, match="this run has one data source"):
        single.load_state_dict(mixture.state_dict())
    renamed = MixtureSampler(_parts({"a": 2, "z": 2}), [lambda s: 1.0, lambda s: 1.0])
    with pytest.raises(ValueError, match=r"for the mixture \['a', 'b'\] but this run's is \['a', 'z'\]"):
        renamed.load_state_dict(mixture.state_dict())


def test_a_row_that_has_the_source_column_is_refused():
    with pytest.raises(DataConfigError, match=r"have a 'mixture_source' column"):
        tag_samples([PromptSample(prompt="x", fields={SOURCE_FIELD: "mine"})], "a", source="rows.jsonl")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"source": "arithmetic", "sources": [{"source": "arithmetic"}]}, "data.source and data.sources are exclusive"),
        (
            {"sources": [{"source": "a.jsonl"}, {"source": "b/a.jsonl"}]},
            r"sources named \['a'\] more than once; set sources\[i\].name",
        ),
        (
            {"sources": [{"source": "a", "weight": 0}, {"source": "b", "weight": {0: 0.0, 5: 1.0}}]},
            "every source's weight is 0 at step 0",
        ),
        ({"sources": [{"source": "a", "weight": -1.0}]}, "weights must be finite and >= 0"),
        ({"sources": [{"source": "a", "weight": {}}]}, "at least one"),
        ({"sources": [{"source": "a", "name": "a/b"}]}, "only letters, digits"),
        ({"sources": []}, "at least 1 item"),
    ],
)
def test_bad_mixtures_are_refused_by_field(data, message):
    with pytest.raises(ValidationError, match=message):
        DataConfig.model_validate(data)


def test_default_names():
    data = DataConfig.model_validate(
        {
            "sources": [
                {"source": "reasoning_gym:chain_sum?max_terms=3"},
                {"source": "data/rows.train.jsonl"},
                {"source": "arithmetic", "name": "arith"},
            ]
        }
    )
    assert data.source_labels() == ["chain_sum", "rows.train", "arith"]


@pytest.mark.slow
def test_a_few_training_steps_on_a_two_source_mixture(tmp_path, tiny_experiment):
    pytest.importorskip("reasoning_gym")
    from polyrl.trainer.build_arm import build_arm

    raw = tiny_experiment(
        data={
            "sources": [
                {"source": "reasoning_gym:basic_arithmetic?size=12&test_size=4&max_terms=2&max_digits=1", "weight": 3.0},
                {"source": "reasoning_gym:chain_sum?size=12&test_size=4&max_terms=2&max_digits=1", "weight": 1.0},
            ]
        },
        rewards=[{"module": "reasoning_gym", "params": {"extract": "full"}}],
        tracking={"accuracy_reward": "reasoning_gym"},
        train={"steps": 2, "micro_batch_size": 8},
        checkpoint={"dir": str(tmp_path / "runs"), "every": 1},
    )
    cfg = resolve_arms(raw)["main"]
    arm = build_arm(cfg, arm="main", arm_dir=tmp_path / "runs" / "main")
    try:
        history = arm.loop().run()
        state = arm.sampler.state_dict()
    finally:
        arm.close()
    # 4 prompts a step at 3:1 -> 3 basic_arithmetic and 1 chain_sum prompts (4 samples each) every step.
    for metrics in history:
        assert metrics["rollout/source/basic_arithmetic/share"] == 0.75
        assert metrics["rollout/source/chain_sum/share"] == 0.25
        for name in ("basic_arithmetic", "chain_sum"):
            assert 0.0 <= metrics[f"train/source/{name}/accuracy"] <= 1.0
            assert math.isfinite(metrics[f"reward/source/{name}/mean"])
        assert math.isfinite(metrics["actor/loss"])
    assert state["sources"]["basic_arithmetic"]["index"] == 6 and state["sources"]["chain_sum"]["index"] == 2
    # The checkpoint holds the mixture's position: a resumed arm continues from it.
    resumed = build_arm(cfg, arm="main", arm_dir=tmp_path / "runs" / "main", resume=True)
    try:
        assert resumed.start_step == 2 and resumed.sampler.state_dict() == state
    finally:
        resumed.close()


def test_the_collector_and_asynchronous_draws_give_the_mixture_its_step():
    from polyrl.rollout.collector import _takes_step
    from polyrl.trainer.async_partitions import OrderedDraws

    # Source a until step 2, then b: a draw that did not say its step would be refused.
    sampler = MixtureSampler(_parts({"a": 4, "b": 4}), [lambda s: float(s < 2), lambda s: float(s >= 2)], scheduled=True)
    assert _takes_step(sampler.next_batch) and not _takes_step(lambda count: [])
    draws = OrderedDraws(sampler, first_step=1, one_draw_per_step=True)
    got = []
    for step in (1, 2):
        draws.begin(step)
        got.append(_sources(draws.draw(2)))
        draws.end(step)
    assert got == [["a", "a"], ["b", "b"]]
