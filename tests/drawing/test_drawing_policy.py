"""The cached warm-up of the drawing policy: partial correctness, modality rule, cache reuse."""

import json

from transformers import AutoTokenizer

from polyrl.engines.modality_marks import MODALITY_FILE, load_modality_rule
from polyrl.policies.drawing import build_drawing_policy
from polyrl.policies.warmup import INFO_FILE


def test_warm_up_leaves_room_for_rl_and_declares_image_tokens(drawing_policy_dir):
    info = json.loads((drawing_policy_dir / INFO_FILE).read_text())
    assert info["task"] == "drawing" and info["steps"] == 60 and info["eval_num_prompts"] == 16
    assert info["losses"][-1] < info["losses"][0] / 3  # it learned something
    # partial correctness: mostly well-formed grids, right in places, rarely right everywhere
    assert info["greedy_well_formed"] >= 0.8
    assert 0.3 < info["greedy_cell_accuracy"] < 0.95
    assert info["greedy_exact_grid"] < 0.5
    assert 0.0 < info["sampled_cell_accuracy"] < 0.95
    tokenizer = AutoTokenizer.from_pretrained(drawing_policy_dir)
    rule = load_modality_rule(drawing_policy_dir, tokenizer)
    assert rule is not None and len(rule.image_ids) == 8
    assert (drawing_policy_dir / MODALITY_FILE).is_file()


def test_cached_build_is_returned_as_is(drawing_policy_dir):
    stamp = (drawing_policy_dir / INFO_FILE).stat().st_mtime_ns
    again = build_drawing_policy(drawing_policy_dir.parent, steps=60, eval_prompts=16)
    assert again == drawing_policy_dir
    assert (again / INFO_FILE).stat().st_mtime_ns == stamp


def test_builtin_task_drawing_resolves_to_the_drawing_policy(tmp_path):
    from polyrl.config.schema import ModelConfig
    from polyrl.policies.paths import resolve_policy_path

    model = ModelConfig(builtin={"task": "drawing", "warmup_steps": 2, "warmup_learning_rate": 2e-3}, cache_dir=str(tmp_path))
    path = resolve_policy_path(model)
    info = json.loads((path / INFO_FILE).read_text())
    assert path.name.startswith("draw-") and info["task"] == "drawing" and info["steps"] == 2 and info["lr"] == 2e-3
    assert (path / MODALITY_FILE).is_file()
    # the default stays the arithmetic policy
    assert ModelConfig().builtin.task == "arithmetic"
