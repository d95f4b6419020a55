"""Tools: calls parsed from text, run under a time limit and an output cap; every failure an observation."""

from __future__ import annotations

import time

import pytest

from polyrl.envs import EnvConfigError, EpisodeRow, ToolEnvironment, load_env_class, parse_tool_calls, run_tool_call, tool
from polyrl.envs.safe_arithmetic import evaluate


@tool
def raises(x: int) -> str:
    """Always fails."""
    raise RuntimeError(f"boom {x}")


@tool
def hangs() -> str:
    """Never returns in time."""
    time.sleep(30)
    return "late"


@tool
def huge() -> str:
    """Returns 10 MB."""
    return "x" * 10_000_000


@tool
def exits() -> str:
    """Calls sys.exit."""
    raise SystemExit(3)


TOOLS = [raises, hangs, huge, exits]


def call(text: str, timeout_s: float = 0.5, output_chars: int = 100):
    (parsed,) = parse_tool_calls(text)
    return run_tool_call(parsed, TOOLS, timeout_s=timeout_s, output_chars=output_chars)


def test_schema_from_signature():
    assert raises.schema() == {
        "type": "function",
        "function": {
            "name": "raises",
            "description": "Always fails.",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        },
    }


def test_exception_becomes_an_observation():
    result = call('<tool_call>{"name": "raises", "arguments": {"x": 7}}</tool_call>')
    assert (result.ok, result.error_kind) == (False, "exception")
    assert result.content == "Error: RuntimeError: boom 7"


def test_sys_exit_in_a_tool_becomes_an_observation():
    result = call('<tool_call>{"name": "exits", "arguments": {}}</tool_call>')
    assert (result.ok, result.error_kind) == (False, "exception")
    assert "SystemExit" in result.content


def test_hang_times_out():
    start = time.perf_counter()
    result = call('<tool_call>{"name": "hangs", "arguments": {}}</tool_call>', timeout_s=0.2)
    assert time.perf_counter() - start < 2.0
    assert (result.ok, result.error_kind) == (False, "timeout")
    assert "did not finish within 0.2 s" in result.content


def test_ten_megabytes_are_capped():
    result = call('<tool_call>{"name": "huge", "arguments": {}}</tool_call>', output_chars=100)
    assert result.ok
    assert result.content.startswith("x" * 100 + "\n[output truncated: 10000000 characters, 100 shown]")
    assert len(result.content) < 200


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("<tool_call>{not json</tool_call>", "malformed"),
        ('<tool_call>["a list"]</tool_call>', "malformed"),
        ('<tool_call>{"name": "raises", "arguments": 5}</tool_call>', "malformed"),
        ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "unknown_tool"),
        ('<tool_call>{"name": "raises", "arguments": {"y": 1}}</tool_call>', "bad_arguments"),
    ],
)
def test_bad_calls_become_observations(text, kind):
    result = call(text)
    assert (result.ok, result.error_kind) == (False, kind)
    assert result.content.startswith("Error: ")


def test_arithmetic_allow_list():
    assert evaluate("123 * 45") == 5535  # 123*45 = 5535
    assert evaluate("(2 + 3) x 4 - -1") == 21  # 5*4 + 1
    for bad in ("__import__('os')", "a * 2", "(1).real", "'1' * 3", "[1]"):
        with pytest.raises(ArithmeticError):
            evaluate(bad)
    with pytest.raises(ArithmeticError):
        evaluate("9 ** 9 ** 9")  # exponent 387420489 > 64: refused, not computed


def test_calculator_env_scores_final_answer():
    env = load_env_class("calculator")()
    assert env.start(EpisodeRow("What is 123 * 45?", fields={"answer": 5535})) == [
        {"role": "user", "content": "What is 123 * 45?"}
    ]
    step = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 45"}}</tool_call>')
    assert (step.done, step.tool_calls, step.tool_errors, step.observation[0]["content"]) == (False, 1, 0, "5535")
    right, wrong = env.step("The answer is 5,535."), env.step("The answer is 5534.")
    assert (right.reward, right.solved, wrong.reward, wrong.solved) == (1.0, True, 0.0, False)
    assert step.solved is False  # not solved yet: the episode's verdict if it is cut here
    shaped = load_env_class("calculator")(format_reward=0.1)
    shaped.start(EpisodeRow("What is 123 * 45?", fields={"answer": 5535}))
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 45"}}</tool_call>'
    assert shaped.step(call).reward == 0.1  # the first turn whose calls all ran
    assert shaped.step(call).reward is None  # once per episode
    bad = load_env_class("calculator")(format_reward=0.1)
    bad.start(EpisodeRow("What is 123 * 45?", fields={"answer": 5535}))
    assert bad.step('<tool_call>{"name": "calculator", "arguments": {"expression": "x"}}</tool_call>').reward is None


def test_calculator_format_reward_on_answer_pays_only_an_episode_that_answers_after_a_call():
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 45"}}</tool_call>'

    def started(**params):
        env = load_env_class("calculator")(format_reward=0.1, **params)
        env.start(EpisodeRow("What is 123 * 45?", fields={"answer": 5535}))
        return env

    # The hack the study found: calls until max_turns cuts the episode. Paid per call: 0.1 on the
    # first call; paid on the answer: nothing, since no turn answers.
    per_call, on_answer = started(), started(format_reward_on="answer")
    assert [per_call.step(call).reward, per_call.step(call).reward] == [0.1, None]
    assert [on_answer.step(call).reward, on_answer.step(call).reward] == [None, None]
    # Call, then a right answer: 1.0 (accuracy) + 0.1 (format) = 1.1 on the answer turn.
    right = started(format_reward_on="answer")
    assert right.step(call).reward is None
    answer = right.step("The answer is 5535.")
    assert (answer.reward, answer.solved) == (1.1, True)
    # Call, then a wrong answer: 0.0 + 0.1 = 0.1, still unsolved.
    wrong = started(format_reward_on="answer")
    wrong.step(call)
    assert (lambda s: (s.reward, s.solved))(wrong.step("It is 5534.")) == (0.1, False)
    # An answer without any call earns the accuracy alone: 1.0.
    assert started(format_reward_on="answer").step("5535").reward == 1.0
    with pytest.raises(ValueError, match=r"format_reward_on: 'end' is not one of call, answer"):
        load_env_class("calculator")(format_reward_on="end")


def test_guess_number_feedback():
    env = load_env_class("guess_number")()
    env.start(EpisodeRow("Guess", fields={"target": 6}))
    first = env.step("3")
    assert (first.observation, first.solved) == ([{"role": "user", "content": "Higher."}], False)
    assert env.step("I guess 9").observation == [{"role": "user", "content": "Lower."}]
    assert env.step("no idea").observation == [{"role": "user", "content": "Please answer with a number."}]
    step = env.step("6")
    assert (step.done, step.reward, step.solved) == (True, 1.0, True)


ONE_FILE_ENV = '''
from polyrl.envs import Step, ToolEnvironment, tool

@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text

class EchoEnv(ToolEnvironment):
    tools = [echo]
    def start(self, row):
        return [{"role": "user", "content": row.prompt}]
    def answer(self, text):
        return float("done" in text)
'''


def test_load_from_file_and_errors(tmp_path):
    (tmp_path / "my_env.py").write_text(ONE_FILE_ENV)
    cls = load_env_class("my_env.py:EchoEnv", base_dir=tmp_path)
    assert issubclass(cls, ToolEnvironment)
    with pytest.raises(EnvConfigError, match="unknown environment 'nope'.*calculator"):
        load_env_class("nope")
    with pytest.raises(EnvConfigError, match="has no attribute 'Missing'"):
        load_env_class("my_env.py:Missing", base_dir=tmp_path)
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(EnvConfigError, match=r"environment 'broken.py:X' failed to load: .*broken.py, line 1"):
        load_env_class("broken.py:X", base_dir=tmp_path)
    with pytest.raises(EnvConfigError, match="not a class with start"):
        load_env_class("polyrl.envs.tools:tool")


def test_a_file_that_exits_at_import_is_reported_not_obeyed(tmp_path):
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\n")
    with pytest.raises(EnvConfigError, match=r"environment 'exits.py:X' failed to load: .*exits.py"):
        load_env_class("exits.py:X", base_dir=tmp_path)
