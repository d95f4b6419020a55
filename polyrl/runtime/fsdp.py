"""FSDP2 on a policy, and its full state taken from and put back into its ranks.

A learner rank (:mod:`polyrl.learner.ranks`) shards its model here and hands the driver
full, unsharded state in the single-process layout the driver's mirror and the checkpoints use;
without sharding the same functions are plain ``state_dict`` copies.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def shard_model(model: torch.nn.Module) -> None:
    """FSDP2 on ``model``: each decoder layer, then the root (torchtitan's layout); gradients are
    reduce-scattered as SUMS (divide factor 1, plain sum reductions: gloo has no pre-multiplied
    sum), since the loss normaliser is already global. The learner runs its forwards through the
    root (runtime/data_parallel.through_root) and evens its micro-batch counts over the ranks.
    Run over gloo on the CPU in the suite (tests/training/test_learner_fsdp.py); on CUDA experimental."""
    from torch.distributed.fsdp import fully_shard

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    units = [*getattr(decoder, "layers", []), model]
    for unit in units:
        fully_shard(unit)
    for unit in units:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)


def full_model_state(model: torch.nn.Module, sharded: bool) -> dict[str, Tensor] | None:
    """The full state dict (on the CPU); with FSDP2 a collective whose result only rank 0 keeps."""
    if not sharded:
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_model_state(model: torch.nn.Module, state: dict[str, Tensor], sharded: bool) -> None:
    if not sharded:
        model.load_state_dict(state, strict=True)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def _trainable_names(model: torch.nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> dict[str, Any]:
    """The optimizer's full state in the single-process (parameter-index) layout the driver's
    mirror and the checkpoints use. FSDP2's full state is keyed by parameter name; its index is
    the parameter's place among the trainable ones (the order the learner builds its AdamW with)."""
    if not sharded:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    index = {name: i for i, name in enumerate(_trainable_names(model))}
    groups = [{**group, "params": [index[name] for name in group["params"]]} for group in by_name["param_groups"]]
    return {"state": {index[name]: value for name, value in by_name["state"].items()}, "param_groups": groups}


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], sharded: bool
) -> None:
    if not sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _trainable_names(model)
    by_name = {
        "state": {names[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [{**group, "params": [names[int(i)] for i in group["params"]]} for group in state["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
