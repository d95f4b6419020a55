"""The warm-up recipe the three built-in families share (polyrl/policies/recipe.py): the cache keys
of each family's defaults are the ones the families computed before they shared it, so existing
caches (and the demo's figures, built from them) are found again; the schedule's arithmetic."""

from __future__ import annotations

import pytest

from polyrl.policies import drawing, recipe, vlm, warmup
from polyrl.policies.recipe import WarmupRecipe, lr_at

# Computed with the families' own settings dictionaries, before the shared recipe (commit
# fc64da3). A change here means every cached warm-up is rebuilt and the demo's starting
# policies change: only with a deliberate code_version bump or new shipped data.
KEYS_BEFORE = {
    "arith": "arith-0.3m-s0-c0757e8b7c0e",
    "arith_s3_steps50": "arith-0.3m-s3-961f4bc68300",
    "draw": "draw-0.3m-s0-8c0bd4cd9ebd",
    "draw_s2": "draw-0.3m-s2-b7683b33fa1d",
    "vlm_vqa": "vlm-0.7m-s0-5656c2be862c",
    "vlm_caption": "vlm-0.7m-s0-e26460d94369",
    "vlm_caption_s1": "vlm-0.7m-s1-76eec0792d7f",
}


def test_each_familys_default_key_is_unchanged(monkeypatch, tmp_path):
    built = []
    monkeypatch.setattr(recipe, "build_cached", lambda final, write, force=False: built.append(final) or final)
    keys = {
        "arith": warmup.build_warm_policy(tmp_path),
        "arith_s3_steps50": warmup.build_warm_policy(tmp_path, seed=3, steps=50),
        "draw": drawing.build_drawing_policy(tmp_path),
        "draw_s2": drawing.build_drawing_policy(tmp_path, seed=2, steps=7),
        "vlm_vqa": vlm.warm_vlm_policy(tmp_path),
        "vlm_caption": vlm.warm_vlm_policy(tmp_path, task="caption"),
        "vlm_caption_s1": vlm.warm_vlm_policy(tmp_path, task="caption", seed=1, steps=3, eval_prompts=5),
    }
    assert {name: path.name for name, path in keys.items()} == KEYS_BEFORE
    assert len(built) == len(KEYS_BEFORE)  # nothing was cached there: every call reached the build


def test_settings_keep_each_familys_fields_and_order():
    common = dict(size="0.3m", seed=0, steps=5, lr=1e-3, batch_size=8, eval_prompts=4)
    versions = dict(data_version="d", model_fingerprint="m", code_version="2")
    arith = WarmupRecipe("arith", "arithmetic", **common, **versions, warmup_steps=10, max_new_tokens=48)
    assert list(arith.settings()) == [
        "task", "size", "seed", "steps", "lr", "batch_size", "warmup_steps", "eval_prompts",
        "max_new_tokens", "data_version", "model_fingerprint", "code_version",
    ]  # fmt: skip
    image = WarmupRecipe("vlm", "scenes-vqa", **common, **versions)
    assert "warmup_steps" not in image.settings() and "max_new_tokens" not in image.settings()
    assert (
        image.key().startswith("vlm-0.3m-s0-")
        and image.key() != WarmupRecipe("vlm", "scenes-caption", **common, **versions).key()
    )
    with pytest.raises(ValueError, match="steps must be >= 0, got -1"):
        WarmupRecipe("vlm", "scenes-vqa", **{**common, "steps": -1}, **versions)


def test_learning_rate_warms_up_linearly_then_holds_or_decays():
    # Warm-up over 4 steps at lr 1e-3: (step + 1) / 4 of it: 2.5e-4, 5e-4, 7.5e-4, 1e-3.
    assert [lr_at(s, steps=10, lr=1e-3, warmup_steps=4, min_lr_ratio=1.0) for s in range(4)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3]
    )
    # No warm-up, ratio 1: lr exactly at every step (the image family's constant rate).
    assert {lr_at(s, steps=10, lr=1e-3, warmup_steps=0, min_lr_ratio=1.0) for s in range(10)} == {1e-3}
    # Cosine to 0.1 * lr: half-way (progress 3/6) is lr * (0.1 + 0.9 * 0.5 * (1 + cos(pi/2))) = 0.55 lr.
    assert lr_at(7, steps=10, lr=1.0, warmup_steps=4, min_lr_ratio=0.1) == pytest.approx(0.55)
