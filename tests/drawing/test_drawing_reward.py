"""The drawing reward: per-cell grid score, caption F1, malformed grids, references."""

import pytest

from polyrl.rewards import RewardBatch, RewardConfigError, RewardModuleError
from polyrl.rewards.builtins.drawing import Drawing, caption_f1, parse_drawing
from polyrl.rewards.registry import load_reward_class

R, B, K, W = "<red>", "<blue>", "<black>", "<white>"


def grid(*cells, caption=""):
    text = "<img>" + "".join(cells) + "</img>"
    return f"{text} {caption}" if caption else text


# a red dot at top right on blue
DOT = grid(B, B, R, B, B, B, B, B, B)


def batch(completions, reference):
    return RewardBatch(prompts=["p"] * len(completions), completions=completions, references=[[reference]] * len(completions))


def test_registered_as_drawing():
    assert load_reward_class("drawing") is Drawing


def test_grid_share_of_correct_cells_without_caption():
    module = Drawing()  # text_weight 0.2; no caption asked: an empty text part scores 1
    scores = module.score(
        batch(
            [
                DOT,  # 9/9 cells: 0.8*1 + 0.2*1 = 1.0
                grid(B, B, B, B, B, B, B, B, B),  # 8/9 (dot missing): 0.8*8/9 + 0.2 = 0.91111
                grid(K, K, K, K, K, K, K, K, K),  # 0/9: 0.8*0 + 0.2 = 0.2
                grid(R, R, B, B, B, B, B, B, W),  # 5/9 (cells 0, 1, 2 and 8 wrong): 0.8*5/9 + 0.2 = 0.64444
                DOT + " a red dot",  # 9/9 but words not asked for: 0.8*1 + 0.2*0 = 0.8
            ],
            DOT,
        )
    )
    assert scores == pytest.approx([1.0, 0.8 * 8 / 9 + 0.2, 0.2, 0.8 * 5 / 9 + 0.2, 0.8], abs=1e-12)


def test_caption_f1_part():
    reference = grid(B, B, R, B, B, B, B, B, B, caption="a red dot at top right on blue")  # 8 words
    module = Drawing(text_weight=0.5)
    scores = module.score(
        batch(
            [
                reference,  # 1.0
                grid(B, B, R, B, B, B, B, B, B, caption="a red dot"),  # P=3/3 R=3/8: F1=2*1*0.375/1.375=0.545454...
                grid(B, B, B, B, B, B, B, B, B, caption="a blue dot at top right on blue"),
                # grid 8/9; words: pred {a,blue×2,dot,at,top,right,on} vs ref {a,red,dot,at,top,right,on,blue}: overlap 7 of 8 -> F1 7/8
                grid(B, B, R, B, B, B, B, B, B),  # caption missing: text 0 -> 0.5
            ],
            reference,
        )
    )
    assert scores == pytest.approx([1.0, 0.5 + 0.5 * (2 * 0.375 / 1.375), 0.5 * 8 / 9 + 0.5 * 7 / 8, 0.5], abs=1e-12)
    assert caption_f1("", "") == 1.0 and caption_f1("x", "") == 0.0 and caption_f1("", "x") == 0.0


@pytest.mark.parametrize(
    "completion, reason",
    [
        ("<red><blue></img>", "does not start with <img>"),
        ("<img><red><blue>", "no </img>"),
        ("<img><red></img><img><blue></img>", "one pair expected"),
        ("<img><red>x<blue></img>", "cell 1: 'x<blue>' is not a palette token"),
        ("<img><red> <blue></img>", "cell 1"),
        (grid(B, B, R, B, B, B, B, B), "grid has 8 cells, expected 9"),
        (grid(B, B, R, B, B, B, B, B, B, B), "grid has 10 cells, expected 9"),
    ],
)
def test_malformed_grid_scores_zero_with_reason(completion, reason):
    # no caption was asked and none follows: the text part alone would be 1 (F1 of two empty
    # texts), but a malformed grid scores 0 in all
    detail = Drawing(text_weight=0.2).details(batch([completion], DOT))[0]
    assert detail.score == 0.0 and detail.grid == 0.0
    assert reason in detail.reason


def test_leading_whitespace_is_allowed():
    assert Drawing().score(batch(["  " + DOT], DOT)) == [1.0]


def test_no_reference_is_unscored_and_bad_reference_is_an_error():
    module = Drawing()
    unscored = RewardBatch(prompts=["p"], completions=[DOT], references=[[]])
    assert module.score(unscored) == [None]
    assert module.details(unscored)[0].reason == "no reference answer"
    with pytest.raises(RewardModuleError, match="reference of sample 0.*is not a drawing: no </img>"):
        module.score(batch([DOT], "<img><red>"))


def test_best_of_several_references():
    other = grid(R, R, R, R, R, R, R, R, R)
    scored = RewardBatch(prompts=["p"], completions=[other], references=[[DOT, other]])
    assert Drawing().score(scored) == [1.0]


def test_custom_palette_and_prefix_tokens():
    # "<r>" is a prefix-free issue check: "<rr>" must parse as one token, not "<r>" + "r>"
    parsed = parse_drawing("<img><rr><r></img>", palette=["<r>", "<rr>"])
    assert parsed.cells == ("<rr>", "<r>")


@pytest.mark.parametrize(
    "params, message",
    [
        ({"text_weight": 1.5}, "text_weight must be in"),
        ({"palette": []}, "palette must be"),
        ({"open_marker": "<x>", "close_marker": "<x>"}, "two different"),
    ],
)
def test_bad_params(params, message):
    with pytest.raises(RewardConfigError, match=message):
        Drawing(**params)
