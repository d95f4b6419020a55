"""An experiment's ``until_resolved:`` block: seeds are added in rounds until every stated
comparison is decided, or the budget ends.

The block is the experiment's, like ``seeds:`` (not a run setting: no arm can override it). The
stopping rule and what each decision means: :mod:`polyrl.analysis.sequential` and
docs/verdicts.md.

```yaml
until_resolved:
  comparisons:                       # each: two arms, a metric, its direction, the smallest effect of interest
    - {arms: [dr_grpo, grpo], metric: eval/arithmetic_chat_free/accuracy, higher_is_better: true, sesoi: 0.10}
  max_seeds: 12                      # per arm: the seed budget fixed before the first round
  seeds_per_round: 1
  alpha: 0.05                        # the error rate over every look and comparison
  max_hours: 3.0                     # optional: no new round starts after this much training time
```
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from polyrl.config.base import ConfigError, StrictModel
from polyrl.config.validation_errors import format_validation_error

__all__ = ["Comparison", "UntilResolvedConfig", "until_resolved_plan"]


class Comparison(StrictModel):
    arms: list[str] = Field(
        description="The two arms compared, [a, b]: the difference is a − b, paired by seed.", min_length=2, max_length=2
    )
    metric: str = Field(
        description="The metric compared: each seed run's last logged value of it (e.g. eval/<suite>/accuracy).", min_length=1
    )
    higher_is_better: bool = Field(
        True, description="The metric's direction; it only decides which arm the verdict calls better."
    )
    sesoi: float = Field(
        description="The smallest effect of interest, in the metric's units, fixed before the first round: a difference "
        "whose whole interval lies inside (−sesoi, +sesoi) is declared equivalent.",
        gt=0,
    )

    @field_validator("arms")
    @classmethod
    def _distinct(cls, arms: list[str]) -> list[str]:
        if arms[0] == arms[1]:
            raise ValueError(f"an arm compared with itself ({arms[0]!r}); for an A/A check run the arm under two seed streams")
        return arms

    @property
    def name(self) -> str:
        return f"{self.arms[0]}-vs-{self.arms[1]}:{self.metric}"


class UntilResolvedConfig(StrictModel):
    comparisons: list[Comparison] = Field(description="The comparisons that must be decided.", min_length=1)
    max_seeds: int = Field(12, description="Seeds per arm at most: the plan's last look.", ge=2, le=100)
    seeds_per_round: int = Field(1, description="Seeds added to every arm in each round.", ge=1)
    first_seed: int = Field(0, description="The rounds run seeds first_seed, first_seed+1, ...", ge=0)
    alpha: float = Field(
        0.05, description="The error rate over every look and comparison (split across comparisons).", gt=0, lt=0.5
    )
    spending: Literal["obrien_fleming", "pocock"] = Field(
        "obrien_fleming", description="The Lan–DeMets alpha-spending function of the group-sequential boundary."
    )
    max_hours: float | None = Field(
        None, description="No new round starts once the training runs of this experiment have taken this many hours.", gt=0
    )

    @model_validator(mode="after")
    def _rounds_fit(self) -> UntilResolvedConfig:
        if self.seeds_per_round > self.max_seeds:
            raise ValueError(f"seeds_per_round ({self.seeds_per_round}) is larger than max_seeds ({self.max_seeds})")
        return self

    def seeds(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.max_seeds))

    def rounds(self) -> list[list[int]]:
        """The seeds of each round, in order (the last round may be shorter)."""
        seeds = self.seeds()
        return [seeds[start : start + self.seeds_per_round] for start in range(0, len(seeds), self.seeds_per_round)]


def until_resolved_plan(raw: dict[str, Any], arms: list[str], *, source: str = "<config>") -> UntilResolvedConfig | None:
    """The experiment's ``until_resolved`` block, validated against its arms; None without one.

    Refused together with ``seeds`` (the block decides the seeds) and where a comparison names
    an arm the experiment does not have."""
    block = raw.get("until_resolved")
    if block is None:
        return None
    where = f"{source}: invalid experiment config\n  - until_resolved"
    if raw.get("seeds") is not None:
        raise ConfigError(
            f"{where}: set together with seeds; the rounds decide the seeds (until_resolved.max_seeds, first_seed), "
            "so remove seeds"
        )
    if not isinstance(block, dict):
        raise ConfigError(f"{where}: expected a mapping (comparisons, max_seeds, ...), got {type(block).__name__}")
    try:
        plan = UntilResolvedConfig.model_validate(block)
    except ValidationError as error:
        raise ConfigError(
            format_validation_error(error, source=source, prefix=("until_resolved",), model=UntilResolvedConfig)
        ) from None
    for index, comparison in enumerate(plan.comparisons):
        for arm in comparison.arms:
            if arm not in arms:
                raise ConfigError(f"{where}.comparisons[{index}].arms: no arm {arm!r}; allowed: {', '.join(arms)}")
    return plan
