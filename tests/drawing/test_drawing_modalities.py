"""Per-token modality: the rule, its file in the model directory, the drawing tokenizer."""

import json

import pytest

from polyrl.core.errors import PolyrlError
from polyrl.engines.modality_marks import (
    MODALITY_FILE,
    ImageSpanRule,
    ModalityRuleError,
    load_modality_rule,
    modality_string,
    rule_from_tokens,
    token_modalities,
    write_modality_rule,
)
from polyrl.policies.drawing import DRAWING_TOKENS, build_drawing_tokenizer
from polyrl.rewards.builtins.drawing import IMAGE_CLOSE, IMAGE_OPEN, PALETTE_TOKENS


def test_rule_marks_palette_tokens_between_markers_only():
    # open 1, close 2, palette {7, 8}; 9 is not palette
    rule = ImageSpanRule(open_id=1, close_id=2, image_ids=frozenset({7, 8}))
    ids = [7, 5, 1, 7, 8, 9, 8, 2, 7, 5, 1, 8]
    expected = [
        "text",
        "text",  # palette token before any marker is text
        "text",
        "image",
        "image",  # <img> itself is text
        "text",
        "image",  # a non-palette token inside stays text
        "text",
        "text",
        "text",  # </img> and what follows
        "text",
        "image",
    ]  # an unclosed span still marks its palette tokens
    assert rule.modalities(ids) == tuple(expected)
    assert token_modalities(None, ids) == ("text",) * len(ids)
    assert modality_string(rule.modalities(ids)) == "TTTIITITTTTI"
    assert modality_string(["text", "audio"]) == "TA"


def test_drawing_tokenizer_has_single_tokens_and_keeps_them_in_text():
    tokenizer = build_drawing_tokenizer()
    answer = "<img><red><blue></img> a red dot"
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    assert len(ids) == 4 + len(" a red dot")  # 4 drawing tokens, then one token per character
    assert tokenizer.decode(ids, skip_special_tokens=True) == answer
    for token in DRAWING_TOKENS:
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1
    rule = rule_from_tokens(tokenizer, IMAGE_OPEN, IMAGE_CLOSE, PALETTE_TOKENS)
    assert modality_string(rule.modalities(ids)) == "TIIT" + "T" * len(" a red dot")


def test_rule_file_round_trip(tmp_path):
    tokenizer = build_drawing_tokenizer()
    assert load_modality_rule(tmp_path, tokenizer) is None  # no file: text only
    write_modality_rule(tmp_path, open_marker=IMAGE_OPEN, close_marker=IMAGE_CLOSE, image_tokens=PALETTE_TOKENS)
    rule = load_modality_rule(tmp_path, tokenizer)
    assert rule == rule_from_tokens(tokenizer, IMAGE_OPEN, IMAGE_CLOSE, PALETTE_TOKENS)
    assert len(rule.image_ids) == 8


@pytest.mark.parametrize(
    "payload, message",
    [
        ("not json", "not valid JSON"),
        ({"audio": {}}, "expected one key 'image'"),
        ({"image": {"open": "<img>", "close": "</img>"}}, "missing \\['tokens'\\]"),
        ({"image": {"open": "<img>", "close": "</img>", "tokens": "<red>"}}, "must be a list of strings"),
        ({"image": {"open": "<img>", "close": "</img>", "tokens": []}}, "image.tokens is empty"),
        ({"image": {"open": "<image>", "close": "</img>", "tokens": ["<red>"]}}, "image.open: '<image>' is 7 tokens"),
        ({"image": {"open": "<img>", "close": "</img>", "tokens": ["<pink>"]}}, "image.tokens: '<pink>' is 6 tokens"),
        ({"image": {"open": "<img>", "close": "<img>", "tokens": ["<red>"]}}, "same token"),
    ],
)
def test_bad_rule_files_name_the_file_and_field(tmp_path, payload, message):
    (tmp_path / MODALITY_FILE).write_text(payload if isinstance(payload, str) else json.dumps(payload))
    with pytest.raises(ModalityRuleError, match=message) as caught:
        load_modality_rule(tmp_path, build_drawing_tokenizer())
    assert MODALITY_FILE in str(caught.value)
    assert isinstance(caught.value, PolyrlError)


def test_sample_tables_show_each_tokens_modality():
    import torch

    from polyrl.core.types import Completion, PromptSample
    from polyrl.rollout.batches import Rollout, Scores
    from polyrl.trainer.loop import sample_rows

    drawn = Completion(
        prompt_ids=[1],
        completion_ids=[10, 11, 12, 13, 2],
        text="<img><red><blue></img>",
        sampling_logprobs=[0.0] * 5,
        finish_reason="stop",
        completion_token_modalities=("text", "image", "image", "text", "text"),
    )
    plain = Completion(prompt_ids=[1], completion_ids=[5, 6], text="ab", sampling_logprobs=[0.0, 0.0], finish_reason="length")
    rollout = Rollout([PromptSample(prompt="draw:")] * 2, [drawn, plain], torch.tensor([0, 0]))
    rows = sample_rows(rollout, Scores([1.0, 0.0], {}))
    assert [row["modalities"] for row in rows] == ["TIITT", "TT"]
