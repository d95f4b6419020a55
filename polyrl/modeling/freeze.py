"""``model.freeze``: named parts of the policy that do not train (``requires_grad`` off).

The learner's optimizer takes only parameters that require grad (polyrl/learner/policy_learner.py), so a
frozen parameter has no AdamW state and never moves; weight syncs still send it (unchanged).
Parts are found by what they are, not by one architecture's names:

- ``embeddings``: the input token embedding (``get_input_embeddings()``); with tied embeddings the
  output head is the same tensor and freezes with it.
- ``lm_head``: the output head (``get_output_embeddings()``).
- ``vision_tower`` and ``projector``: a vision-language model's image encoder and the module that
  maps its features into the text model (Idefics3 ``vision_model`` / ``connector``, LLaVA-style
  ``vision_tower`` / ``multi_modal_projector``, Qwen2-VL ``visual``), by module name.
- ``first_layers: N``: the decoder's first N layers (``get_decoder().layers``).
- ``patterns``: shell-style patterns (``fnmatch``) over parameter names, e.g. ``model.layers.0.*``.

Whatever names nothing is refused, listing what the model has, so a typo never trains the part
it meant to freeze.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

import torch

from polyrl.core.errors import PolyrlError

__all__ = ["FreezeError", "PARTS", "freeze_parameters"]

# The module names each part goes by in transformers' vision-language models.
VISION_TOWER_NAMES = ("vision_model", "vision_tower", "visual", "vision_encoder", "image_encoder")
PROJECTOR_NAMES = ("connector", "multi_modal_projector", "mm_projector", "visual_projection", "merger")
PARTS = ("embeddings", "lm_head", "vision_tower", "projector")


class FreezeError(PolyrlError, ValueError):
    """model.freeze names something the policy does not have."""


def _modules_named(model: torch.nn.Module, names: tuple[str, ...]) -> list[torch.nn.Module]:
    found = [(n, m) for n, m in model.named_modules() if n and n.rsplit(".", 1)[-1] in names]
    # The outermost only: a vision tower's own submodule called e.g. "visual" is inside it already.
    outer = [(n, m) for n, m in found if not any(n.startswith(f"{o}.") for o, _ in found if o != n)]
    return [m for _, m in outer]


def _part_modules(model: torch.nn.Module, part: str) -> list[torch.nn.Module]:
    if part == "embeddings":
        module = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        return [module] if module is not None else []
    if part == "lm_head":
        module = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        return [module] if module is not None else []
    return _modules_named(model, VISION_TOWER_NAMES if part == "vision_tower" else PROJECTOR_NAMES)


def _module_prefixes(model: torch.nn.Module, depth: int = 3) -> list[str]:
    return sorted({".".join(name.split(".")[:depth]) for name, _ in model.named_parameters()})


def freeze_parameters(
    model: torch.nn.Module, *, parts: list[str] = (), first_layers: int = 0, patterns: list[str] = ()
) -> dict[str, Any]:
    """Turn ``requires_grad`` off for the named parts; returns ``{"frozen": [names], "frozen_params":
    count, "trainable_params": count}``. Raises :class:`FreezeError` (naming the field and what the
    model has) when a part, a layer count or a pattern selects nothing, or when nothing would train."""
    frozen: set[int] = set()
    name_of = {id(p): n for n, p in model.named_parameters()}
    present = [part for part in PARTS if _part_modules(model, part)]
    for part in parts:
        modules = _part_modules(model, part)
        if not modules:
            raise FreezeError(
                f"model.freeze.parts: this policy ({type(model).__name__}) has no {part}; parts it has: {', '.join(present)}"
            )
        frozen.update(id(p) for m in modules for p in m.parameters())
    if first_layers:
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        layers = getattr(decoder, "layers", None)
        if layers is None:
            raise FreezeError(f"model.freeze.first_layers: no decoder layers found in {type(model).__name__}; use patterns")
        if first_layers > len(layers):
            raise FreezeError(f"model.freeze.first_layers: {first_layers}, but the decoder has {len(layers)} layers")
        frozen.update(id(p) for layer in layers[:first_layers] for p in layer.parameters())
    for pattern in patterns:
        matched = [id(p) for n, p in model.named_parameters() if fnmatchcase(n, pattern)]
        if not matched:
            raise FreezeError(
                f"model.freeze.patterns: {pattern!r} matches no parameter; parameter names start with: "
                f"{', '.join(_module_prefixes(model))}"
            )
        frozen.update(matched)
    params = list(model.parameters())
    if params and all(id(p) in frozen for p in params):
        raise FreezeError("model.freeze freezes every parameter of the policy: nothing would train")
    for p in params:
        if id(p) in frozen:
            p.requires_grad_(False)
    return {
        "frozen": sorted(name_of[i] for i in frozen if i in name_of),
        "frozen_params": sum(p.numel() for p in params if id(p) in frozen),
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
    }
