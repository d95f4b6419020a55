"""A model routed through oneDNN (``train.cpu_matmul``) that is copied (``copy.deepcopy``, pickle,
``torch.save``: a teacher built by copying, a Ray actor's argument) computes with the copy's own
weights, stays routed, and sends gradients to the copy's own parameters; the source is unchanged."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from polyrl.runtime import cpu_matmul
from polyrl.runtime.cpu_matmul import linear_library, route_linears_through_onednn

pytestmark = pytest.mark.skipif(not cpu_matmul.onednn_available(), reason="this torch build has no oneDNN")


def _deepcopy(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)


def _pickled(model: torch.nn.Module) -> torch.nn.Module:
    return pickle.loads(pickle.dumps(model))


def _torch_saved(model: torch.nn.Module) -> torch.nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)  # a whole module, not a state dict


COPIES = [_deepcopy, _pickled, _torch_saved]


def _routed_pair(traceable: bool) -> torch.nn.Sequential:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    assert route_linears_through_onednn(model, traceable=traceable) == 2
    return model


@pytest.mark.parametrize("traceable", [False, True], ids=["autograd_function", "custom_op"])
@pytest.mark.parametrize("copied", COPIES, ids=["deepcopy", "pickle", "torch_save"])
def test_a_copied_routed_model_computes_with_its_own_weights(copied, traceable):
    source = _routed_pair(traceable)
    x = torch.randn(3, 8)
    with torch.no_grad():
        want_source = torch.nn.functional.linear(
            torch.nn.functional.linear(x, source[0].weight, source[0].bias), source[1].weight, source[1].bias
        )
    clone = copied(source)
    with torch.no_grad():
        clone[0].weight.zero_()
        clone[0].bias.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        clone[1].weight.copy_(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]]))
        clone[1].bias.zero_()
    # The copy's first layer gives its bias whatever x is: h = 0·x + [1, 2, 3, 4]; the second
    # picks h₁ and h₂ + h₃: [1, 2 + 3] = [1, 5] for every row.
    assert clone(x).tolist() == [[1.0, 5.0]] * 3
    # The source computes with its own weights, untouched by the copy's.
    assert torch.allclose(source(x), want_source, atol=1e-6)
    assert linear_library(clone) == "onednn"  # still routed, with the same flavour
    assert all(layer._traceable is traceable for layer in clone)


@pytest.mark.parametrize("copied", COPIES, ids=["deepcopy", "pickle", "torch_save"])
def test_gradients_of_a_copied_routed_model_reach_the_copys_own_parameters(copied):
    source = _routed_pair(traceable=False)
    clone = copied(source)
    assert all(c is not s for c, s in zip(clone.parameters(), source.parameters()))
    x = torch.tensor([[1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]])
    layer = clone[0]
    layer(x).sum().backward()
    # y = x Wᵀ + b summed over its 4 outputs: ∂W = 1ᵀ x (each of the 4 rows gets x), ∂b = [1, 1, 1, 1].
    assert layer.weight.grad.tolist() == [x[0].tolist()] * 4
    assert layer.bias.grad.tolist() == [1.0] * 4
    assert all(p.grad is None for p in source.parameters())  # nothing reached the source


def test_routing_keeps_parameters_state_dict_and_isinstance():
    torch.manual_seed(0)
    plain = torch.nn.Linear(5, 3)
    weight, state = plain.weight, dict(plain.state_dict())
    route_linears_through_onednn(plain)
    assert isinstance(plain, torch.nn.Linear) and plain.weight is weight
    assert plain.state_dict().keys() == state.keys()
    # Routing again (e.g. traceable for a compiled module) changes the flavour, not the base class.
    route_linears_through_onednn(plain, traceable=True)
    assert plain._traceable and plain._unrouted is torch.nn.Linear


def test_a_linear_with_a_forward_of_its_own_is_not_routed():
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Scaled(2, 2))
    assert route_linears_through_onednn(model) == 1
    assert type(model[1]) is Scaled and linear_library(model) == "mixed"
    x = torch.ones(1, 2)
    assert torch.allclose(model[1](x), 2 * torch.nn.functional.linear(x, model[1].weight, model[1].bias))
