"""The reward protocol: a batch of samples in, one score (or ``None``) per sample out.

Training and evaluation share this protocol. A reward module is a small class with a batched
``score`` method; parameters come from the experiment YAML as constructor keyword arguments,
and heavy resources (models, lexicons) are loaded once in ``setup``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from polyrl.core.errors import PolyrlError

if TYPE_CHECKING:  # pragma: no cover
    from polyrl.core.types import PromptSample

# How much of a prompt/completion an error message quotes.
SNIPPET_CHARS = 60


class RewardConfigError(PolyrlError, ValueError):
    """A reward is configured wrongly: unknown module reference, bad parameter, duplicate label."""


class RewardModuleError(PolyrlError, RuntimeError):
    """A reward module failed while scoring: it raised, returned a wrong-length list or a
    non-number, or returned NaN/inf where that is not allowed. The message names the module
    label and, where one is to blame, the sample index and the start of its prompt and
    completion."""

    def __init__(self, message: str, *, label: str | None = None, index: int | None = None):
        super().__init__(message)
        self.label = label
        self.index = index


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """The start of ``text`` on one line, quoted, with an ellipsis when cut."""
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= limit else flat[:limit] + "…")


@dataclass
class RewardBatch:
    """Samples to score, one entry per completion (a prompt sampled G times appears G times).

    ``references``, ``images`` and ``fields`` may be omitted; they default to an empty list
    (or dict) per sample. All lists must have the same length.
    """

    prompts: list[str]
    completions: list[str]
    references: list[list[str]] = field(default_factory=list)  # zero or more per sample
    images: list[list[Any]] = field(default_factory=list)  # [] per sample when no image
    fields: list[dict[str, Any]] = field(default_factory=list)  # the row's other columns

    def __post_init__(self) -> None:
        n = len(self.completions)
        if not self.references:
            self.references = [[] for _ in range(n)]
        if not self.images:
            self.images = [[] for _ in range(n)]
        if not self.fields:
            self.fields = [{} for _ in range(n)]
        for name in ("prompts", "references", "images", "fields"):
            value = getattr(self, name)
            if len(value) != n:
                raise ValueError(f"RewardBatch.{name} has {len(value)} entries but there are {n} completions")

    def __len__(self) -> int:
        return len(self.completions)

    def sample(self, i: int) -> str:
        """A short description of sample ``i`` for error messages."""
        return f"sample {i} (prompt {snippet(self.prompts[i])}, completion {snippet(self.completions[i])})"

    def subset(self, indices: Sequence[int]) -> RewardBatch:
        """A new batch holding only the samples at ``indices`` (in that order)."""
        return RewardBatch(
            prompts=[self.prompts[i] for i in indices],
            completions=[self.completions[i] for i in indices],
            references=[self.references[i] for i in indices],
            images=[self.images[i] for i in indices],
            fields=[self.fields[i] for i in indices],
        )

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[dict[str, Any]],
        completions: Sequence[str],
        *,
        prompt_key: str = "prompt",
        reference_key: str = "references",
        image_key: str = "images",
        group_size: int = 1,
    ) -> RewardBatch:
        """Build a batch from dataset rows (dicts) and their completions.

        Each row is repeated ``group_size`` times in a row (G samples per prompt), so
        ``len(completions)`` must equal ``len(rows) * group_size``. A reference given as a
        single string becomes a one-element list; a missing one becomes ``[]``. Every other
        column goes into ``fields``.
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if len(completions) != len(rows) * group_size:
            raise ValueError(
                f"{len(completions)} completions for {len(rows)} rows × group_size {group_size}; "
                f"expected {len(rows) * group_size}"
            )
        prompts, references, images, fields = [], [], [], []
        for row_index, row in enumerate(rows):
            if prompt_key not in row:
                raise ValueError(f"row {row_index} has no {prompt_key!r} column (columns: {sorted(row)})")
            refs = row.get(reference_key) or []
            refs = [refs] if isinstance(refs, str) else [str(r) for r in refs]
            imgs = row.get(image_key) or []
            imgs = imgs if isinstance(imgs, list) else [imgs]
            other = {k: v for k, v in row.items() if k not in (prompt_key, reference_key, image_key)}
            for _ in range(group_size):
                prompts.append(str(row[prompt_key]))
                references.append(list(refs))
                images.append(list(imgs))
                fields.append(dict(other))
        return cls(
            prompts=prompts, completions=[str(c) for c in completions], references=references, images=images, fields=fields
        )

    @classmethod
    def from_samples(cls, samples: Sequence[PromptSample], completions: Sequence[str], *, group_size: int = 1) -> RewardBatch:
        """Build a batch from :class:`polyrl.core.types.PromptSample` objects."""
        if len(completions) != len(samples) * group_size:
            raise ValueError(f"{len(completions)} completions for {len(samples)} samples × group_size {group_size}")
        expanded = [s for s in samples for _ in range(group_size)]
        return cls(
            prompts=[s.prompt for s in expanded],
            completions=list(completions),
            references=[list(s.references) for s in expanded],
            images=[list(s.images) for s in expanded],
            fields=[dict(s.fields) for s in expanded],
        )


class RewardModule:
    """Base class for reward modules (any class with the same methods works too).

    Subclasses set ``name`` (or get it from ``@register_reward``), take their parameters as
    keyword arguments of ``__init__`` with defaults, describe them in the class docstring,
    load heavy resources in ``setup`` and return one float per sample from ``score`` —
    ``None`` where the sample cannot be scored (e.g. no reference), never a made-up 0.
    """

    name: ClassVar[str] = ""
    # The parameter that, when the YAML leaves it out, training fills with the policy's model
    # folder (a reward that scores with the policy's own language model); None: no such parameter.
    policy_path_param: ClassVar[str | None] = None
    # The parameter that, when the YAML leaves it out, training fills with the training prompts'
    # reference lists, one per prompt (a corpus statistic such as CIDEr's document frequencies).
    training_references_param: ClassVar[str | None] = None

    def __init__(self, **params: Any) -> None:
        if params:
            raise TypeError(f"{type(self).__name__} takes no parameters, got {sorted(params)}")

    def setup(self) -> None:
        """Load heavy resources. Called once before the first ``score``."""

    def score(self, batch: RewardBatch) -> list[float | None]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def module_label(cls: type) -> str:
    """The default label of a module class: its registered ``name``, else its class name."""
    return getattr(cls, "name", "") or cls.__name__
