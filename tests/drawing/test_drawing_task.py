"""The drawing task generator: geometry, answers, determinism, disjoint splits, shipped files."""

import json

import pytest

from polyrl.rewards import RewardBatch
from polyrl.rewards.builtins.drawing import Drawing
from polyrl.tasks import drawing


def geometry(description):
    return next(g for g in drawing.all_geometries() if g.description == description)


def test_geometries_render_by_hand():
    assert len(drawing.all_geometries()) == 21  # 9 dots + 3 rows + 3 columns + 4 squares + cross + frame
    r, b = "red", "blue"
    assert drawing.render(geometry("dot at top right"), r, b) == [b, b, r, b, b, b, b, b, b]
    assert drawing.render(geometry("row at bottom"), r, b) == [b, b, b, b, b, b, r, r, r]
    assert drawing.render(geometry("column at center"), r, b) == [b, r, b, b, r, b, b, r, b]
    assert drawing.render(geometry("square at bottom left"), r, b) == [b, b, b, r, r, b, r, r, b]
    assert drawing.render(geometry("cross"), r, b) == [b, r, b, r, r, r, b, r, b]
    assert drawing.render(geometry("frame"), r, b) == [r, r, r, r, b, r, r, r, r]


def test_prompt_and_answer_format():
    dot = geometry("dot at top right")
    assert drawing.format_prompt(dot, "red", "blue", caption=False) == "draw a red dot at top right on blue:"
    assert drawing.format_prompt(dot, "red", "blue", caption=True) == "draw a red dot at top right on blue and caption it:"
    colours = drawing.render(dot, "red", "blue")
    assert drawing.format_answer(colours) == "<img><blue><blue><red>" + "<blue>" * 6 + "</img>"
    assert drawing.format_answer(colours, "a red dot at top right on blue").endswith("</img> a red dot at top right on blue")


def test_rows_are_deterministic_distinct_and_split_disjoint():
    train = drawing.make_drawing_rows(300, seed=3, split="train")
    assert train == drawing.make_drawing_rows(300, seed=3, split="train")
    assert train != drawing.make_drawing_rows(300, seed=4, split="train")
    test = drawing.make_drawing_rows(100, seed=3, split="test")
    assert len({r["prompt"] for r in train}) == 300 and len({r["prompt"] for r in test}) == 100

    def combo(row):
        return (row["shape"], row["position"], row["foreground"], row["background"])

    assert not {combo(r) for r in train} & {combo(r) for r in test}
    assert all(r["foreground"] != r["background"] for r in train + test)
    assert 0.3 < sum(bool(r["caption"]) for r in train) / len(train) < 0.7
    # every split's prompts: 2 caption variants of each (geometry, colours) combination
    everything = drawing.make_drawing_rows(len(drawing._combinations("test")) * 2, seed=0, split="test")
    assert len({r["prompt"] for r in everything}) == len(everything)
    with pytest.raises(ValueError, match="distinct prompts; asked for"):
        drawing.make_drawing_rows(len(everything) + 1, seed=0, split="test")
    with pytest.raises(ValueError, match="unknown split"):
        drawing.make_drawing_rows(1, seed=0, split="dev")


def test_every_reference_scores_one_and_asks_what_it_answers():
    rows = drawing.make_drawing_rows(200, seed=0, split="train")
    answers = [r["answer"] for r in rows]
    batch = RewardBatch(prompts=[r["prompt"] for r in rows], completions=answers, references=[r["references"] for r in rows])
    assert Drawing().score(batch) == [1.0] * len(rows)
    for row in rows:
        assert row["prompt"].endswith("and caption it:") == bool(row["caption"])
        assert row["answer"].count("<") == 2 + 9  # two markers and nine palette tokens


def test_shipped_files_are_the_generator_output():
    for split, size in drawing.SHIPPED_SIZES.items():
        shipped = [json.loads(line) for line in drawing.shipped_path(split).read_text().splitlines()]
        assert shipped == drawing.make_drawing_rows(size, seed=drawing.SHIPPED_SEED, split=split)


def test_the_prompt_loader_knows_the_builtin_source():
    from polyrl.data.prompt_samples import rows_to_prompt_samples
    from polyrl.data.prompts import DataConfigError, check_prompt_source, load_prompt_dataset

    dataset = load_prompt_dataset("drawing", "test")
    assert len(dataset) == drawing.SHIPPED_SIZES["test"]
    sample = rows_to_prompt_samples(dataset.select(range(1)))[0]
    first = drawing.read_rows("test")[0]
    assert sample.prompt == first["prompt"] and sample.references == [first["answer"]]
    check_prompt_source("drawing", "train")
    with pytest.raises(DataConfigError, match="unknown split 'dev'; allowed: \\['train', 'test'\\]"):
        load_prompt_dataset("drawing", "dev")
