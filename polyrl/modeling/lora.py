"""LoRA adapters on the policy (``model.lora``), through PEFT.

PEFT injects its LoRA layers into the Hugging Face model in place; polyrl's learner keeps
working on that model (``PeftModel.get_base_model()``: the same class, decoder and output head,
so log-probs, shared prompts, oneDNN linears and compilation see what they see without LoRA),
and a :class:`LoraPolicy` holds the ``PeftModel`` for what only it knows:

* **the KL reference** is the same model with the adapter switched off
  (:meth:`LoraPolicy.adapter_disabled`, PEFT's ``disable_adapter``): exactly the base model's
  log-probs, no second copy of the weights in memory;
* **the rollout engine** receives merged weights, ``W + (alpha/r) B A`` per adapted layer under
  the base model's own parameter names (:meth:`LoraPolicy.merged_weights`), computed into new
  tensors: the learner's base weights and adapter stay unmerged, so nothing drifts from
  repeated merge/unmerge rounding;
* **checkpoints** hold the adapter only, as a PEFT adapter folder (``adapter_config.json`` +
  ``adapter_model.safetensors``) that PEFT and vLLM load as they are (:func:`write_adapter`);
* **export** folds the adapter into the base model (:func:`merged_model`).

Only the adapter trains: the optimizer gets the trainable parameters only, so its state is the
adapter's too. LoRA dropout is refused by the schema: the learner runs with dropout off in every
pass (π_old and π_θ must be the same function of the weights), so a dropout rate would do
nothing.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor

from polyrl.core.errors import PolyrlError

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "LoraError",
    "LoraPolicy",
    "add_lora",
    "linear_module_names",
    "load_adapter",
    "merged_model",
    "write_adapter",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_NAME = "default"


class LoraError(PolyrlError):
    """``model.lora`` cannot apply to this policy."""


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of ``model``'s Linear layers (what ``target_modules`` matches)."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)})


def _check_targets(model: torch.nn.Module, target_modules: str | Sequence[str]) -> None:
    if target_modules == "all-linear":
        return
    present = linear_module_names(model)
    missing = [name for name in target_modules if name not in present]
    if missing:
        raise LoraError(
            f"model.lora.target_modules: {', '.join(map(repr, missing))} match no Linear layer of "
            f"{type(model).__name__}; its Linear layers: {', '.join(present)} (or 'all-linear')"
        )


def add_lora(model: torch.nn.Module, *, r: int, alpha: float, target_modules: str | Sequence[str]) -> "LoraPolicy":
    """Freeze ``model`` and inject trainable LoRA adapters into its ``target_modules``.

    ``'all-linear'`` is PEFT's: every Linear layer but the output head. B starts at zero, so the
    adapted model computes exactly the base model's function until the first update.
    """
    from peft import LoraConfig, get_peft_model

    _check_targets(model, target_modules)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=0.0,
        bias="none",
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
    )
    return LoraPolicy(get_peft_model(model, config))


@dataclass
class LoraPolicy:
    """A policy with LoRA adapters: ``model`` is what the learner trains (the base model with
    the LoRA layers in it), ``peft`` the PEFT wrapper that manages them."""

    peft: Any  # peft.PeftModel

    @property
    def model(self) -> torch.nn.Module:
        return self.peft.get_base_model()

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def adapter_disabled(self) -> contextlib.AbstractContextManager:
        """The base model's function, for the KL reference (PEFT's ``disable_adapter``)."""
        return self.peft.disable_adapter()

    def adapter_state(self) -> dict[str, Tensor]:
        from peft import get_peft_model_state_dict

        return {
            k: v.detach().contiguous().clone()
            for k, v in get_peft_model_state_dict(self.peft, save_embedding_layers=False).items()
        }

    def load_adapter_state(self, tensors: dict[str, Tensor]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.peft, tensors)
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing or result.unexpected_keys:
            raise LoraError(
                f"the adapter does not fit this policy's LoRA layers: missing {missing[:4]}, unexpected "
                f"{list(result.unexpected_keys)[:4]} (was it trained with other model.lora settings?)"
            )

    def merged_weights(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
        """The base model's state dict with each adapted layer's weight replaced by
        ``W + scale * B A`` (PEFT's ``get_delta_weight``), as new tensors: nothing in the learner
        changes. Names are the base model's own (``model.layers.0.self_attn.q_proj.weight``)."""
        from peft.tuners.lora import LoraLayer

        model = self.model
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                if ".lora_" in name:
                    continue  # the adapter's own tensors: folded into their base weights below
                if ".base_layer." not in name:
                    yield name, tensor.detach() if dtype is None else tensor.detach().to(dtype)
                    continue
                owner, _, leaf = name.rpartition(".base_layer.")
                layer = model.get_submodule(owner)
                value = tensor.detach()
                if (
                    leaf == "weight"
                    and isinstance(layer, LoraLayer)
                    and ADAPTER_NAME in layer.lora_A
                    and not layer.disable_adapters
                ):
                    value = _merged(layer, value)
                yield f"{owner}.{leaf}", value if dtype is None else value.to(dtype)


def _merged(layer: Any, weight: Tensor) -> Tensor:
    """``W + scale * B A`` as one fused product-and-add (``addmm``) for a plain LoRA Linear;
    PEFT's ``get_delta_weight`` (which builds B A, scales it, then adds) for anything else."""
    from peft.tuners.lora import Linear as LoraLinear

    plain = (
        isinstance(layer, LoraLinear)
        and not layer.fan_in_fan_out
        and not layer.use_dora.get(ADAPTER_NAME, False)
        and layer.lora_A[ADAPTER_NAME].weight.dtype == weight.dtype
    )
    if plain:
        return torch.addmm(
            weight, layer.lora_B[ADAPTER_NAME].weight, layer.lora_A[ADAPTER_NAME].weight, alpha=layer.scaling[ADAPTER_NAME]
        )
    return weight + layer.get_delta_weight(ADAPTER_NAME).to(weight.dtype)


def write_adapter(
    lora: LoraPolicy, folder: str | Path, save_tensors: Callable[[dict[str, Tensor], Path], None] | None = None
) -> Path:
    """A PEFT adapter folder (``adapter_config.json``, ``adapter_model.safetensors``);
    ``save_tensors(tensors, path)`` writes the weights (default: safetensors' ``save_file``)."""
    from safetensors.torch import save_file

    save_tensors = save_tensors or (lambda tensors, path: save_file(tensors, str(path)))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = lora.peft.peft_config[ADAPTER_NAME].to_dict()
    config["base_model_name_or_path"] = None  # a local folder: the checkpoint's policy_path names it
    (folder / ADAPTER_CONFIG).write_text(json.dumps(_jsonable(config), indent=2))
    save_tensors(lora.adapter_state(), folder / ADAPTER_WEIGHTS)
    return folder


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, tuple, list)):
        return [_jsonable(v) for v in sorted(value, key=str)] if isinstance(value, set) else [_jsonable(v) for v in value]
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def load_adapter(lora: LoraPolicy, folder: str | Path) -> None:
    """Load a :func:`write_adapter` folder's weights into ``lora``'s adapter."""
    from safetensors.torch import load_file

    lora.load_adapter_state(load_file(str(Path(folder) / ADAPTER_WEIGHTS)))


def merged_model(base: torch.nn.Module, adapter_folder: str | Path) -> torch.nn.Module:
    """``base`` with the adapter of ``adapter_folder`` folded into its weights (a plain
    transformers model again, ready for ``save_pretrained``)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(adapter_folder), is_trainable=False).merge_and_unload()
