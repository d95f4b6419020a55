"""An experiment's seed axis: ``seeds:`` in the file or ``--seeds`` makes one run per arm × seed."""

from __future__ import annotations

from typing import Any

from polyrl.config.schema import ConfigError

SEEDS_ALLOWED = "a count (seeds: 3 means seeds 0, 1, 2) or a list of distinct non-negative integers (seeds: [0, 1, 2])"


def normalise_seeds(value: Any, *, where: str) -> list[int]:
    """``3`` → ``[0, 1, 2]``; ``[4, 7]`` → ``[4, 7]``; anything else is a ConfigError at ``where``."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(f"{where}: a seed count must be >= 1 (got {value!r}); allowed: {SEEDS_ALLOWED}")
        return list(range(value))
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        if len(set(value)) != len(value):
            raise ConfigError(f"{where}: seeds repeat (got {value!r}); allowed: {SEEDS_ALLOWED}")
        return list(value)
    raise ConfigError(f"{where}: got {value!r}; allowed: {SEEDS_ALLOWED}")


def parse_seeds_option(text: str) -> list[int]:
    """``--seeds 3`` (a count) or ``--seeds 0,1,2`` (a list; ``--seeds 7,`` is the one seed 7)."""
    raw = text.strip()
    try:
        if "," in raw:
            value: Any = [int(part) for part in raw.split(",") if part.strip()]
        else:
            value = int(raw)
    except ValueError:
        raise ConfigError(f"--seeds {text!r}: allowed: {SEEDS_ALLOWED}, e.g. --seeds 3 or --seeds 0,1,2") from None
    return normalise_seeds(value, where=f"--seeds {text!r}")


def experiment_seeds(raw: dict[str, Any], *, source: str = "<config>", option: str | None = None) -> list[int] | None:
    """The seeds every arm runs with, or None for one run per arm (the file's ``seed``).

    ``--seeds`` wins over the file's ``seeds`` and ``seed``. In the file, ``seeds`` with a
    ``seed`` (top level or in an arm) is refused: one of the two would be silently ignored.
    """
    if option is not None:
        return parse_seeds_option(option)
    if raw.get("seeds") is None:
        return None
    seeds = normalise_seeds(raw["seeds"], where=f"{source}: invalid experiment config\n  - seeds")
    arms: dict[str, Any] = raw["arms"] if isinstance(raw.get("arms"), dict) else {}
    clashes = ["seed"] if "seed" in raw else []
    clashes += [f"arms.{arm}.seed" for arm, body in arms.items() if isinstance(body, dict) and "seed" in body]
    if clashes:
        raise ConfigError(
            f"{source}: invalid experiment config\n  - {clashes[0]}: set together with seeds; each run's seed comes "
            "from seeds, so remove it (or remove seeds for a single run)"
        )
    return seeds


SEEDS_AT_ONCE_ALLOWED = "auto (two at once on a CPU-only machine of two or more cores, else one) or a whole number >= 1"


def seeds_at_once_setting(raw: dict[str, Any], *, source: str = "<config>", option: str | None = None) -> int | str:
    """``seeds_at_once`` (or ``--seeds-at-once``): how many seed runs of the experiment train side
    by side, ``"auto"`` when unset; :func:`polyrl.launch.units_at_once.resolve_at_once` decides
    what auto means here."""
    if option is not None:
        value: Any = option.strip()
        where = f"--seeds-at-once {option!r}"
        if isinstance(value, str) and value.isdigit():
            value = int(value)
    else:
        value = raw.get("seeds_at_once", "auto")
        where = f"{source}: invalid experiment config\n  - seeds_at_once"
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigError(f"{where}: got {value!r}; allowed: {SEEDS_AT_ONCE_ALLOWED}")
