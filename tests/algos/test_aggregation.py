import math

import pytest
import torch

from polyrl.algos.aggregation import AGGREGATION_MODES, aggregate, global_loss_normalizer

F64 = torch.float64
NAN = math.nan

# Row 0 has response tokens 0 and 1, row 1 has token 0; masked positions hold garbage.
LOSS = torch.tensor([[1.0, 2.0, NAN], [4.0, math.inf, -math.inf]], dtype=F64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


def _loss(mode: str, max_response_length: int | None = None) -> float:
    normalizer = global_loss_normalizer(MASK, mode=mode, max_response_length=max_response_length)
    return float(aggregate(LOSS, MASK, mode=mode, loss_normalizer=normalizer))


def test_token_mean_by_hand():
    # (1 + 2 + 4) / 3 tokens
    assert _loss("token_mean") == pytest.approx(7 / 3, abs=1e-12, rel=0)


def test_seq_mean_token_mean_by_hand():
    # row means (1 + 2) / 2 = 1.5 and 4 / 1 = 4; (1.5 + 4) / 2 sequences = 2.75
    assert _loss("seq_mean_token_mean") == pytest.approx(2.75, abs=1e-12, rel=0)


def test_seq_mean_token_sum_by_hand():
    # row sums 3 and 4; (3 + 4) / 2 sequences = 3.5
    assert _loss("seq_mean_token_sum") == pytest.approx(3.5, abs=1e-12, rel=0)


def test_seq_sum_constant_norm_by_hand():
    # (1 + 2 + 4) / (2 sequences * L_max 4) = 7 / 8
    assert _loss("seq_sum_constant_norm", max_response_length=4) == pytest.approx(0.875, abs=1e-12, rel=0)
    # without L_max the mask width T = 3 stands in: 7 / (2 * 3)
    assert _loss("seq_sum_constant_norm") == pytest.approx(7 / 6, abs=1e-12, rel=0)


def test_empty_rows_are_not_counted_as_sequences_by_the_sequence_means():
    mask = torch.tensor([[1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    assert global_loss_normalizer(mask, mode="seq_mean_token_mean") == 1.0
    assert global_loss_normalizer(mask, mode="seq_mean_token_sum") == 1.0
    # An empty batch still divides by 1, not 0.
    assert global_loss_normalizer(torch.zeros(2, 3, dtype=torch.bool), mode="token_mean") == 1.0


def test_unknown_mode_names_the_allowed_modes():
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        aggregate(LOSS, MASK, mode="mean", loss_normalizer=1.0)
    with pytest.raises(ValueError, match="token_mean"):
        global_loss_normalizer(MASK, mode="sum")


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_garbage_under_mask_leaks_into_neither_loss_nor_gradient(mode):
    clean = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]], dtype=F64, requires_grad=True)
    dirty = LOSS.clone().requires_grad_(True)
    normalizer = global_loss_normalizer(MASK, mode=mode, max_response_length=3)
    clean_loss = aggregate(clean * 2.0, MASK, mode=mode, loss_normalizer=normalizer)
    dirty_loss = aggregate(dirty * 2.0, MASK, mode=mode, loss_normalizer=normalizer)
    clean_loss.backward()
    dirty_loss.backward()
    assert torch.equal(clean_loss, dirty_loss)
    assert torch.isfinite(dirty.grad).all()
    assert torch.equal(clean.grad, dirty.grad)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_one_batch_of_8_equals_8_accumulated_micro_batches_of_1(mode):
    torch.manual_seed(0)
    lengths = [1, 2, 3, 4, 5, 6, 2, 5]
    mask = torch.zeros(8, 6, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = True
    features = torch.randn(8, 6, 3, dtype=F64)
    weight = torch.randn(3, dtype=F64, requires_grad=True)
    normalizer = global_loss_normalizer(mask, mode=mode, max_response_length=6)

    def per_token_loss(rows: slice) -> torch.Tensor:
        return torch.tanh(features[rows] @ weight) ** 2

    full_loss = aggregate(per_token_loss(slice(0, 8)), mask, mode=mode, loss_normalizer=normalizer)
    full_loss.backward()
    full_grad = weight.grad.clone()
    weight.grad = None
    total = 0.0
    for row, length in enumerate(lengths):
        # Each micro-batch is trimmed to its own length, as a padding collator would do.
        micro_loss = per_token_loss(slice(row, row + 1))[:, :length]
        micro = aggregate(micro_loss, mask[row : row + 1, :length], mode=mode, loss_normalizer=normalizer)
        micro.backward()
        total += float(micro.detach())
    torch.testing.assert_close(weight.grad, full_grad, atol=1e-12, rtol=0)
    assert total == pytest.approx(float(full_loss.detach()), abs=1e-12, rel=0)


def test_dr_grpo_normaliser_stays_constant_when_rows_are_masked():
    # Dr.GRPO (arXiv 2503.20783): sum of token losses / (sampled sequences * L_max), a constant.
    # 4 rows of per-token loss 1, L_max 5; rows 2 and 3 are masked out (unscored, mask_truncated).
    loss = torch.ones(4, 3, dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    normalizer = global_loss_normalizer(mask, mode="seq_sum_constant_norm", max_response_length=5)
    # 4 rows * 5 = 20 (before: 2 rows with tokens * 5 = 10, so masking rows doubled the others' weight)
    assert normalizer == 20.0
    # (1 + 1 + 1) / 20 = 0.15
    assert float(aggregate(loss, mask, mode="seq_sum_constant_norm", loss_normalizer=normalizer)) == pytest.approx(0.15)
    unmasked = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert global_loss_normalizer(unmasked, mode="seq_sum_constant_norm", max_response_length=5) == normalizer
