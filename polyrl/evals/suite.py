"""Eval suites: which data, how to generate, what to measure — a typed, validated YAML.

    name: arithmetic
    kind: text                      # or caption: also the COCO caption metrics
    datasets:                       # one mapping or a list
      - name: arithmetic
        source: arithmetic          # built-in task, a .jsonl/.parquet path, or a datasets name
        split: test
        limit: 128
    generation:
      decoding: sample              # greedy (n must be 1) or sample
      n: 4                          # samples per prompt (pass@k needs k <= n)
      temperature: 1.0
      max_tokens: 48
    metrics:
      accuracy: {extract: auto}     # params of the `accuracy` reward module; false disables;
                                    # {module: reasoning_gym}: another reward module counts right
      pass_at_k: [1, 2, 4]
      length: true
      rewards:                      # the same RewardSpec list as an experiment's `rewards`
        - module: length
          params: {unit: tokens}

Suites are found by path, or by name as ``<name>.yaml`` in ``$POLYRL_EVAL_SUITES`` (an
``os.pathsep`` list of folders), ``./experiments/evals`` and the repository's
``experiments/evals``. Every validation error names the field path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from polyrl.config.schema import check_safe_name
from polyrl.config.validation_errors import format_validation_error
from polyrl.config.yaml_files import YAMLFileError, safe_load_unique
from polyrl.core.errors import PolyrlError
from polyrl.core.types import SamplingSettings
from polyrl.rewards import RewardSpec

REPO_SUITES = Path(__file__).resolve().parents[2] / "experiments" / "evals"


class EvalError(PolyrlError, ValueError):
    """A user-caused eval failure (bad suite, missing model, empty split, failing metric)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def field_error(model: str, loc: tuple[Any, ...], message: str, value: Any) -> ValidationError:
    """A model-level check's failure reported at the field it is about (``generation.n``),
    so the shared formatter names that path."""
    detail = InitErrorDetails(type=PydanticCustomError("value_error", "{message}", {"message": message}), loc=loc, input=value)
    return ValidationError.from_exception_data(model, [detail])


class DatasetSpec(_Strict):
    """One split of one prompt dataset (see :func:`polyrl.data.prompts.load_prompt_dataset`)."""

    name: str | None = Field(None, description="prefix of this dataset's metrics; default '<source stem>-<split>'")
    source: str = Field(
        ...,
        min_length=1,
        description="'arithmetic', a .jsonl/.json/.parquet path (relative to the suite file) or a datasets name",
    )
    split: str = Field(
        "test",
        description="the split to evaluate; a single local file that names no split in its file name is "
        "taken whole when this is left out, and refuses a split it cannot honour when it is given",
    )
    holdout: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="split a single local file by a fixed hash of each row: this "
        "fraction is 'test' (as data.holdout does for training)",
    )
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    references_field: str = "references"
    # Images are carried per prompt already (PromptSample.images); an image modality reads
    # this column when image rollouts exist. Text-only suites leave it unset.
    image_field: str | None = Field(None, description="column holding the prompt's image(s), passed as PromptSample.images")
    limit: int | None = Field(None, ge=1, description="first N rows")
    chat_template: bool | None = Field(
        None,
        description="format prompts through the model's chat template (polyrl/data/chat.py); default: on when the rows "
        "carry messages_field; inside training, unset means the run's data.chat_template",
    )
    system_prompt: str | None = Field(None, description="a system message before each prompt (chat formatting only)")
    messages_field: str = Field("messages", description="the column of chat rows' messages ([{role, content}])")
    accuracy: bool | dict[str, Any] | None = Field(
        None,
        description="this dataset's accuracy, in the forms metrics.accuracy takes (a suite whose datasets need "
        "different rules: reasoning_gym:<task> rows scored by {module: reasoning_gym} beside arithmetic); "
        "default: metrics.accuracy",
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        return None if value is None else check_safe_name(value, "it prefixes MLflow metric names")

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        stem = Path(self.source).stem if self.source.endswith((".jsonl", ".json", ".parquet")) else self.source
        return re.sub(r"[^A-Za-z0-9_.\-]+", "-", f"{stem}-{self.split}").strip("-")


class GenerationSpec(_Strict):
    """How completions are generated: greedy, or sampled ``n`` times per prompt (for pass@k)."""

    decoding: Literal["greedy", "sample"] = "greedy"
    n: int = Field(1, ge=1, description="samples per prompt")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (decoding: sample)")
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(64, ge=1)
    seed: int = 0
    stop: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _greedy_single(self) -> "GenerationSpec":
        # Greedy decoding returns n identical samples: pass@k would be pass@1 dressed up.
        if self.decoding == "greedy" and self.n != 1:
            raise field_error(
                "GenerationSpec",
                ("n",),
                f"greedy decoding gives {self.n} identical samples; use decoding: sample for n > 1",
                self.n,
            )
        return self

    def sampling_settings(self) -> SamplingSettings:
        return SamplingSettings(
            n=self.n,
            temperature=0.0 if self.decoding == "greedy" else self.temperature,
            top_p=1.0 if self.decoding == "greedy" else self.top_p,
            max_tokens=self.max_tokens,
            seed=self.seed,
            stop=list(self.stop),
        )


class MetricsSpec(_Strict):
    """What to measure. Reward modules are the training ones (one reward protocol)."""

    # None: on for text suites, off for caption suites; true: on with default params;
    # a mapping: on, with these params of the `accuracy` reward module, or of the reward module its
    # `module` key names (a sample is right when that module scores it above 0); false: off.
    accuracy: bool | dict[str, Any] | None = None
    pass_at_k: list[int] = Field(default_factory=list, description="k values; each k <= generation.n")
    length: bool = True
    rewards: list[RewardSpec] = Field(default_factory=list)
    coco: bool | None = Field(None, description="COCO caption metrics (pycocoevalcap); default: on for kind caption")

    @field_validator("pass_at_k")
    @classmethod
    def _positive_k(cls, values: list[int]) -> list[int]:
        bad = [k for k in values if k < 1]
        if bad:
            raise ValueError(f"every k must be >= 1, got {bad}")
        return sorted(set(values))


class EvalSuite(_Strict):
    name: str = Field(..., min_length=1)
    description: str = ""
    kind: Literal["text", "caption"] = "text"
    datasets: list[DatasetSpec] = Field(..., min_length=1)
    generation: GenerationSpec = GenerationSpec()
    metrics: MetricsSpec = MetricsSpec()

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return check_safe_name(value, "it names report folders")

    @field_validator("datasets", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _consistent(self) -> "EvalSuite":
        pass_at_k = self.metrics.pass_at_k
        too_big = [k for k in pass_at_k if k > self.generation.n]
        if too_big:
            raise field_error(
                "EvalSuite",
                ("metrics", "pass_at_k"),
                f"k={too_big} exceeds generation.n={self.generation.n}; "
                "the unbiased estimator needs at least k samples per prompt",
                pass_at_k,
            )
        without = [d.label for d in self.datasets if self.accuracy_params(d) is None]
        if pass_at_k and without:
            raise field_error(
                "EvalSuite",
                ("metrics", "pass_at_k"),
                f"needs metrics.accuracy (pass@k counts correct samples); datasets without it: {without}",
                pass_at_k,
            )
        labels = [d.label for d in self.datasets]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise field_error("EvalSuite", ("datasets",), f"duplicate dataset name(s) {duplicates}; set datasets[i].name", labels)
        return self

    def accuracy_params(self, dataset: DatasetSpec | None = None) -> dict[str, Any] | None:
        """Params of the accuracy module (of ``dataset``: its own ``accuracy`` when set), or
        ``None`` when accuracy is off; a ``module`` key names a module other than ``accuracy``."""
        value = self.metrics.accuracy if dataset is None or dataset.accuracy is None else dataset.accuracy
        if value is None:
            value = self.kind == "text"
        if value is False:
            return None
        return {} if value is True else dict(value)

    def coco_enabled(self) -> bool:
        return self.kind == "caption" if self.metrics.coco is None else self.metrics.coco


def format_suite_error(error: ValidationError, source: str) -> str:
    """One line per problem, each starting with the field path (e.g. ``generation.n``)."""
    return format_validation_error(error, source=source, model=EvalSuite, what="eval suite")


def suite_search_dirs() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("POLYRL_EVAL_SUITES", "").split(os.pathsep) if p]
    dirs += [Path.cwd() / "experiments" / "evals", REPO_SUITES]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def find_suite_file(ref: str | Path) -> Path:
    """The YAML file a suite reference names (a path, or a name in the search folders)."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    if path.suffix in (".yaml", ".yml") or os.sep in str(ref):
        raise EvalError(f"suite {str(ref)!r}: no such file ({path.resolve()})")
    for folder in suite_search_dirs():
        for suffix in (".yaml", ".yml"):
            candidate = folder / f"{ref}{suffix}"
            if candidate.is_file():
                return candidate
    known = sorted({p.stem for d in suite_search_dirs() if d.is_dir() for p in d.glob("*.y*ml")})
    raise EvalError(
        f"suite {str(ref)!r}: not a file and not a suite name; looked in {[str(d) for d in suite_search_dirs()]}; "
        f"known suites: {', '.join(known) or '(none)'}"
    )


def parse_suite(raw: Any, source: str = "<suite>") -> EvalSuite:
    if not isinstance(raw, dict):
        raise EvalError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return EvalSuite.model_validate(raw)
    except ValidationError as error:
        raise EvalError(format_suite_error(error, source)) from None


def load_suite(ref: str | Path | EvalSuite) -> tuple[EvalSuite, Path | None]:
    """The validated suite and the folder relative data paths are resolved against."""
    if isinstance(ref, EvalSuite):
        return ref, None
    path = find_suite_file(ref)
    try:
        raw = safe_load_unique(path.read_text(), str(path))  # a repeated key is refused, not silently dropped
    except YAMLFileError as error:
        raise EvalError(str(error)) from None
    return parse_suite(raw, str(path)), path.parent


def resolve_source(source: str, base_dir: Path | None) -> str:
    """A relative data path in a suite is relative to the suite file (when it exists there)."""
    if base_dir is None or Path(source).is_absolute():
        return source
    candidate = base_dir / source
    return str(candidate) if candidate.exists() else source
