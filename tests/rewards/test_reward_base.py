"""RewardBatch, the registry and module references."""

import textwrap

import pytest

from polyrl.core.types import PromptSample
from polyrl.rewards import (
    RewardBatch,
    RewardConfigError,
    RewardModule,
    load_reward_class,
    register_reward,
    registered_rewards,
)
from polyrl.rewards.builtins import Length, RougeL


def test_batch_defaults_and_length_check():
    batch = RewardBatch(prompts=["a", "b"], completions=["x", "y"])
    assert len(batch) == 2
    assert batch.references == [[], []] and batch.images == [[], []] and batch.fields == [{}, {}]
    with pytest.raises(ValueError, match="references has 1 entries but there are 2 completions"):
        RewardBatch(prompts=["a", "b"], completions=["x", "y"], references=[["r"]])


def test_sample_description_quotes_the_start_of_prompt_and_completion():
    batch = RewardBatch(prompts=["p" * 100], completions=["line one\nline two"])
    text = batch.sample(0)
    assert text.startswith("sample 0 (prompt 'pppp")
    assert "p" * 60 + "…" in text and "p" * 61 not in text  # cut at 60 characters
    assert "'line one line two'" in text  # newlines flattened


def test_from_rows_groups_and_fields():
    rows = [{"prompt": "2+2?", "references": "4", "answer": "4", "id": 7}, {"prompt": "3+3?", "answer": "6"}]
    batch = RewardBatch.from_rows(rows, ["4", "5", "6", "six"], group_size=2)
    assert batch.prompts == ["2+2?", "2+2?", "3+3?", "3+3?"]
    assert batch.references == [["4"], ["4"], [], []]  # a string reference becomes a list
    assert batch.fields[0] == {"answer": "4", "id": 7} and batch.fields[3] == {"answer": "6"}
    with pytest.raises(ValueError, match="expected 4"):
        RewardBatch.from_rows(rows, ["4", "5", "6"], group_size=2)
    with pytest.raises(ValueError, match="no 'question' column"):
        RewardBatch.from_rows(rows, ["a", "b"], prompt_key="question")


def test_from_samples():
    samples = [PromptSample(prompt="p", references=["r"], fields={"answer": "1"})]
    batch = RewardBatch.from_samples(samples, ["a", "b"], group_size=2)
    assert batch.prompts == ["p", "p"] and batch.references == [["r"], ["r"]] and batch.fields[1] == {"answer": "1"}


def test_subset():
    batch = RewardBatch(prompts=["a", "b", "c"], completions=["x", "y", "z"], references=[["1"], ["2"], ["3"]])
    sub = batch.subset([2, 0])
    assert sub.prompts == ["c", "a"] and sub.completions == ["z", "x"] and sub.references == [["3"], ["1"]]


def test_builtins_are_registered_by_name():
    names = registered_rewards()
    assert {"rouge_l", "ppl_fluency", "safety", "length", "cider", "accuracy", "format"} <= set(names)
    assert load_reward_class("rouge_l") is RougeL
    assert RougeL.name == "rouge_l"


def test_module_colon_class_reference():
    assert load_reward_class("polyrl.rewards.builtins.length:Length") is Length
    with pytest.raises(RewardConfigError, match="has no attribute 'Nope'"):
        load_reward_class("polyrl.rewards.builtins.length:Nope")
    with pytest.raises(RewardConfigError, match="cannot import 'no_such_pkg.mod'"):
        load_reward_class("no_such_pkg.mod:Thing")


def test_file_reference_relative_to_base_dir(tmp_path):
    (tmp_path / "my_reward.py").write_text(
        textwrap.dedent(
            """
            from polyrl.rewards import RewardModule

            class Shouty(RewardModule):
                def score(self, batch):
                    return [float(c.isupper()) for c in batch.completions]
            """
        )
    )
    cls = load_reward_class("my_reward.py:Shouty", base_dir=tmp_path)
    assert cls.__name__ == "Shouty"
    assert load_reward_class(f"{tmp_path}/my_reward.py:Shouty") is cls  # loaded once, cached by path
    with pytest.raises(RewardConfigError, match="does not exist"):
        load_reward_class("missing.py:Shouty", base_dir=tmp_path)


def test_unknown_reference_lists_registered_names():
    with pytest.raises(RewardConfigError) as info:
        load_reward_class("rouge_k")
    message = str(info.value)
    assert "unknown reward module 'rouge_k'" in message
    assert "rouge_l" in message and "cider" in message and "ppl_fluency" in message


def test_entry_point_reference(tmp_path, monkeypatch):
    # A minimal installed distribution: importlib.metadata finds *.dist-info on sys.path.
    (tmp_path / "plug_reward_mod.py").write_text(
        "from polyrl.rewards import RewardModule\n"
        "class Plugged(RewardModule):\n"
        "    def score(self, batch):\n"
        "        return [2.0] * len(batch)\n"
    )
    info = tmp_path / "plug_reward-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plug-reward\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[polyrl.rewards]\nplugged = plug_reward_mod:Plugged\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = load_reward_class("plugged")
    assert cls.__name__ == "Plugged"
    assert cls().score(RewardBatch(prompts=["p"], completions=["c"])) == [2.0]


def test_register_clash_is_an_error():
    @register_reward("test_reward_base_clash")
    class First(RewardModule):
        pass

    with pytest.raises(RewardConfigError, match="already registered"):

        @register_reward("test_reward_base_clash")
        class Second(RewardModule):
            pass


def test_base_module_rejects_unknown_params():
    with pytest.raises(TypeError, match="takes no parameters"):
        RewardModule(foo=1)


def test_module_that_fails_while_importing_names_its_file_and_line(tmp_path, monkeypatch):
    # The module exists (so not "cannot import") but its line 3 raises while it is imported.
    (tmp_path / "polyrl_test_failing_mod.py").write_text("import os\n\nVALUE = {}['missing']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardConfigError) as info:
        load_reward_class("polyrl_test_failing_mod:Reward")
    assert str(info.value) == (
        f"reward module 'polyrl_test_failing_mod:Reward' failed to load: "
        f"{tmp_path / 'polyrl_test_failing_mod.py'}, line 3: KeyError: 'missing'"
    )
