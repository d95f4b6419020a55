"""What the runner prints keeps its text: a health line's '[arm]' prefix is not eaten as rich markup."""

from __future__ import annotations

import io

from rich.console import Console

from polyrl.launch.runner import plain_printer


def test_health_lines_keep_their_arm_prefix():
    console = Console(file=io.StringIO(), width=200, color_system=None)
    plain_printer(console)("[grpo] health warning at step 3: entropy_collapse: mean entropy 0.05 < 0.1")
    assert console.file.getvalue().strip() == "[grpo] health warning at step 3: entropy_collapse: mean entropy 0.05 < 0.1"
    # What the progress console did before: rich takes '[grpo]' for a style tag and drops it.
    plain = Console(file=io.StringIO(), width=200, color_system=None)
    plain.print("[grpo] health warning")
    assert plain.file.getvalue().strip() == "health warning"


def test_a_plain_line_is_not_folded_at_the_consoles_width():
    # A log file's console is 80 columns wide: the progress line used to end "· 43.5" with
    # "s/step" on a line of its own.
    console = Console(file=io.StringIO(), width=80, color_system=None)
    line = "dr_grpo/seed_0 step 12/16 · reward 0.344 · accuracy 0.344 · length 48.8 · 43.3 s/step"
    assert len(line) > 80
    plain_printer(console)(line)
    assert console.file.getvalue() == line + "\n"


def test_without_a_terminal_progress_is_a_plain_line_every_few_steps():
    from polyrl.launch.arm_runs import plain_progress_line

    lines: list[str] = []
    on_step = plain_progress_line("grpo/seed_0", 16, 2, lines.append)
    for step in range(1, 17):
        on_step(step, {"reward/mean": 0.5, "train/accuracy": 0.25, "rollout/response_length/mean": 30.0, "perf/step_s": 7.25})
    assert len(lines) == 8  # steps 2, 4, ..., 16
    assert lines[0] == "grpo/seed_0 step 2/16 · reward 0.500 · accuracy 0.250 · length 30.0 · 7.2 s/step"
    # The last step prints even off the stride; an arm without an accuracy reward shows none.
    lines.clear()
    on_step = plain_progress_line("a", 5, 2, lines.append)
    for step in range(1, 6):
        on_step(step, {"reward/mean": 1.0})
    assert lines == ["a step 2/5 · reward 1.000", "a step 4/5 · reward 1.000", "a step 5/5 · reward 1.000"]


def test_the_cli_environment_turns_datasets_progress_bars_off(monkeypatch):
    import os

    from polyrl.launch.logs import quiet_library_environment

    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    quiet_library_environment()
    assert os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"  # validate printed a "Generating train split" bar


def test_an_arms_error_is_one_readable_line_however_long_the_librarys_message():
    from polyrl.launch.arm_runs import ERROR_TEXT_CHARS, arm_error_text
    from polyrl.rewards import RewardConfigError

    # transformers' "Unrecognized configuration class" lists ~200 configs: 4,000+ characters.
    long = RewardConfigError("reward module 'fluency' failed in setup: ValueError: " + "SomeConfig, " * 400)
    text = arm_error_text(long)
    assert text.startswith("reward module 'fluency' failed in setup: ValueError: SomeConfig, ")
    # 53 + 12 x 400 = 4,853 characters; 600 kept, 4,253 announced as cut.
    assert len(str(long)) == 4853
    assert text.endswith("… [4253 more characters: the whole error is in the log file]")
    assert len(text) == ERROR_TEXT_CHARS + len("… [4253 more characters: the whole error is in the log file]")
    # A short message is kept whole; a foreign exception keeps its type and last line.
    assert arm_error_text(ValueError("first\nlast line")) == "ValueError: last line"
