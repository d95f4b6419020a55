"""The tool sandbox: calls that loop, allocate 10 GB, fork, call os._exit, crash or print 10 MB come
back as ``Error: ...`` within their limits, the next call works, the worker holds no inherited
secrets, and an episode with such calls finishes with its errors counted; the Python tool and the
python_calculator environment; the settings' refusals."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import time

import pytest

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.envs import EnvConfigError, EpisodeRow, Step, Tool, ToolCall, ToolEnvironment, load_env_class, run_tool_call, tool
from polyrl.envs import sandbox as sandbox_module
from polyrl.envs.builtins.python_tool import python
from polyrl.envs.sandbox import SandboxSettings, shutdown_workers
from polyrl.envs.sandbox_seccomp import seccomp_program

LIMITS = SandboxSettings(cpu_seconds=1, memory_mb=256)
# The machine these run on is shared (2 cores, other jobs): CPU seconds take several wall seconds,
# so time bounds are the limit plus a generous margin, never the limit alone.
MARGIN_S = 10.0


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def spins() -> str:
    """Loops forever."""
    while True:
        pass


@tool
def sleeps() -> str:
    """Sleeps past any limit."""
    time.sleep(600)
    return "late"


@tool
def hogs() -> str:
    """Allocates 10 GB."""
    block = bytearray(10 * 2**30)
    return str(len(block))


@tool
def forks() -> str:
    """os.fork in a loop (a fork bomb, bounded: 100 at most, each child sleeps)."""
    for _ in range(100):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    return "forked 100"


@tool
def forks_in_c() -> str:
    """fork(2) through libc, past Python's guard, 20 times; a child exits at once."""
    libc = ctypes.CDLL(None, use_errno=True)
    results = []
    for _ in range(20):
        pid = libc.fork()
        if pid == 0:
            os._exit(0)
        results.append(pid)
    return json.dumps(results)


@tool
def exits() -> str:
    """Ends its process without a result."""
    os._exit(3)


@tool
def floods() -> str:
    """Prints 10 MB."""
    print("x" * 10_000_000)
    return "done"


@tool
def crashes() -> str:
    """Dies of SIGSEGV, as a crashing C extension does."""
    os.kill(os.getpid(), signal.SIGSEGV)
    return "alive"


@tool
def environment() -> str:
    """The worker's environment variables and folder."""
    return json.dumps({"keys": sorted(os.environ), "home": os.environ.get("HOME"), "cwd": os.getcwd()})


TOOLS = [add, spins, sleeps, hogs, forks, forks_in_c, exits, floods, crashes, environment]


@pytest.fixture(scope="module", autouse=True)
def _workers():
    yield
    shutdown_workers()


def run(name: str, timeout_s: float = 5.0, output_chars: int = 200, sandbox: SandboxSettings = LIMITS, **arguments):
    start = time.perf_counter()
    result = run_tool_call(ToolCall(name, arguments), TOOLS, timeout_s=timeout_s, output_chars=output_chars, sandbox=sandbox)
    return result, time.perf_counter() - start


def assert_next_call_works():
    result, _ = run("add", a=2, b=3)
    assert (result.ok, result.content) == (True, "5")


@pytest.mark.parametrize(
    ("name", "timeout_s", "kind", "says"),
    [
        # cpu_seconds=1 with a wall limit far above it: the CPU limit (SIGXCPU) ends it.
        ("spins", 60.0, "cpu_limit", "used more than 1 s of CPU time"),
        ("sleeps", 0.5, "timeout", "did not finish within 0.5 s"),
        ("hogs", 5.0, "memory_limit", "MemoryError: hogs went over its memory limit (256 MB)"),
        ("forks", 5.0, "exception", "PermissionError: a tool may not start processes"),
        ("exits", 5.0, "crash", "ended its process (exit code 3) without a result"),
        ("floods", 5.0, "output_limit", "printed more than 200 characters"),
        ("crashes", 5.0, "crash", "crashed (SIGSEGV)"),
    ],
)
def test_a_bad_call_is_an_error_and_the_next_call_works(name, timeout_s, kind, says):
    result, elapsed = run(name, timeout_s=timeout_s)
    assert (result.ok, result.error_kind) == (False, kind), result
    assert result.content.startswith("Error: ") and says in result.content, result.content
    bound = {"spins": 1.0, "sleeps": 0.5}.get(name, 0.0) + MARGIN_S
    assert elapsed < bound, f"{name} took {elapsed:.1f} s"
    assert_next_call_works()


@pytest.mark.skipif(seccomp_program(1) is None, reason="no seccomp table for this architecture")
def test_the_kernel_refuses_fork_past_pythons_guard():
    """libc's fork(2) skips os.fork's guard; the seccomp filter refuses it (EAGAIN), even for root."""
    result, _ = run("forks_in_c")
    assert result.ok, result
    assert json.loads(result.content) == [-1] * 20  # 20 refused forks, no child


def test_a_dead_worker_is_replaced():
    assert_next_call_works()
    (worker,) = sandbox_module._POOL.idle
    worker.process.kill()
    worker.process.wait()
    assert_next_call_works()
    assert sandbox_module._POOL.idle[0] is not worker


def test_a_worker_that_stops_answering_is_killed_and_replaced(monkeypatch):
    """The worker enforces the wall limit; past it and a grace period the trainer stops waiting."""
    assert_next_call_works()
    (worker,) = sandbox_module._POOL.idle
    monkeypatch.setattr(sandbox_module, "ANSWER_GRACE_S", 0.5)
    os.kill(worker.process.pid, signal.SIGSTOP)  # a worker that hangs
    start = time.perf_counter()
    result, _ = run("add", timeout_s=0.5, a=1, b=1)
    assert time.perf_counter() - start < 1.0 + MARGIN_S
    assert (result.ok, result.error_kind) == (False, "timeout")
    assert result.content == "Error: add could not run: the tool worker did not answer within 1 s; the tool worker was replaced"
    assert worker.process.poll() is not None  # killed
    assert_next_call_works()


def test_the_worker_inherits_no_secrets(monkeypatch):
    shutdown_workers()  # a fresh worker, started with these variables in the trainer's environment
    for key in ("HF_TOKEN", "MLFLOW_TRACKING_PASSWORD", "AWS_SECRET_ACCESS_KEY", "PYTHONPATH"):
        monkeypatch.setenv(key, "secret")
    result, _ = run("environment", output_chars=2000)
    seen = json.loads(result.content)
    allowed = {
        "PATH",
        "LANG",
        "HOME",
        "TMPDIR",
        "PYTHONDONTWRITEBYTECODE",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "LC_CTYPE",
    }  # fmt: skip  (LC_CTYPE: Python may set it for a C locale)
    assert set(seen["keys"]) <= allowed, seen["keys"]
    assert seen["home"] == seen["cwd"] and os.path.basename(seen["home"]).startswith("polyrl-tool-")


def test_a_ten_megabyte_result_is_cut_in_the_worker():
    result = run_tool_call(ToolCall("huge", {}), [Tool("huge", _ten_megabytes)], timeout_s=5, output_chars=100, sandbox=LIMITS)
    assert result.ok
    assert result.content == "y" * 100 + "\n[output truncated: 10000000 characters, 100 shown]"


def _ten_megabytes() -> str:
    return "y" * 10_000_000


def test_a_function_that_cannot_cross_is_refused_with_its_reason():
    local = Tool("local", lambda: "hi")
    with pytest.raises(EnvConfigError, match="not importable by reference.*mode: thread"):
        run_tool_call(ToolCall("local", {}), [local], timeout_s=1, output_chars=100, sandbox=LIMITS)
    # mode: thread runs it (the old way)
    assert run_tool_call(ToolCall("local", {}), [local], timeout_s=1, output_chars=100,
                         sandbox=SandboxSettings(mode="thread")).content == "hi"  # fmt: skip


def python_call(code: str, output_chars: int = 200, timeout_s: float = 5.0):
    return run_tool_call(ToolCall("python", {"code": code}), [python], timeout_s=timeout_s, output_chars=output_chars,
                         sandbox=LIMITS)  # fmt: skip


def test_python_tool_returns_what_the_snippet_printed():
    assert python_call("print(48 + 30 - 12)").content == "66"  # 48 + 30 - 12 = 66
    assert python_call("x = 7\nx * 6").content == "42"  # a last bare expression is shown
    assert python_call("y = 1").content == "(no output)"
    assert python_call("print(y)").content == "Error: NameError: name 'y' is not defined"  # nothing carries over
    failed = python_call("print('before')\n1 / 0")
    assert (failed.ok, failed.error_kind, failed.content) == (
        False,
        "exception",
        "before\nError: ZeroDivisionError: division by zero",
    )
    syntax = python_call("def f(:")
    assert syntax.content.startswith("Error: SyntaxError: ") and not syntax.ok
    long = python_call("print('z' * 5000)", output_chars=100)
    # 5000 characters and print's newline: 5001 printed
    assert long.ok and long.content == "z" * 100 + "\n[output truncated: 5001 characters, 100 shown]"


def test_python_tool_is_held_to_the_limits():
    refused = python_call("import subprocess\nsubprocess.run(['ls'])")
    assert not refused.ok and "may not start processes" in refused.content
    # Root may raise a hard limit, and any process may signal its parent: the filter refuses both.
    raised = python_call("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))")
    assert raised.content == "Error: ValueError: not allowed to raise maximum limit", raised  # Python's words for EPERM
    killed = python_call("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert killed.content == "Error: PermissionError: [Errno 1] Operation not permitted", killed
    assert python_call("import resource\nresource.getrlimit(resource.RLIMIT_AS)[0] > 0").content == "True"
    start = time.perf_counter()
    looped = python_call("while True:\n    pass", timeout_s=60)
    assert looped.error_kind == "cpu_limit" and time.perf_counter() - start < 1 + MARGIN_S
    assert python_call("print(sum(range(10)))").content == "45"  # 0 + 1 + ... + 9


def test_python_tool_is_refused_in_thread_mode():
    with pytest.raises(EnvConfigError, match="must not run in the trainer process"):
        run_tool_call(ToolCall("python", {"code": "print(1)"}), [python], timeout_s=1, output_chars=100,
                      sandbox=SandboxSettings(mode="thread"))  # fmt: skip


def test_python_calculator_episode_solved_with_the_tool():
    env = load_env_class("python_calculator")()
    env.start(EpisodeRow("Tom has 12 pencils. He buys 12 more. How many pencils does Tom have now?", fields={"answer": "24"}))
    call = '<tool_call>{"name": "python", "arguments": {"code": "12 + 12"}}</tool_call>'
    step = env.step(call)
    assert (step.done, step.tool_calls, step.tool_errors, step.observation[0]["content"]) == (False, 1, 0, "24")
    final = env.step("Answer: 24")
    assert (final.done, final.reward, final.solved) == (True, 1.0, True)


def test_python_calculator_rows_offer_the_tool():
    from polyrl.data.prompts import load_prompt_dataset
    from polyrl.tasks.word_problems import read_rows

    rows = load_prompt_dataset("python_calculator", "test", limit=3)
    originals = read_rows("test")[:3]
    for row, original in zip(rows, originals):
        assert row["answer"] == original["answer"]
        assert row["prompt"].endswith(
            'You may run Python code with the python tool. End with the final answer as "Answer: <number>".'
        )
        assert row["messages"] == [{"role": "user", "content": row["prompt"]}]


# --- the settings --------------------------------------------------------------------------------


def test_env_config_refuses_what_a_mode_cannot_do():
    from pydantic import ValidationError

    from polyrl.config.episodes import EnvConfig

    assert EnvConfig(module="python_calculator").tool_sandbox.mode == "process"  # the default
    with pytest.raises(ValidationError, match="cpu_seconds cannot be enforced with mode: thread"):
        EnvConfig(module="calculator", tool_sandbox={"mode": "thread", "cpu_seconds": 2})
    with pytest.raises(ValidationError, match="'python' runs code the policy wrote.*allowed: process"):
        EnvConfig(module="python_calculator", tool_sandbox={"mode": "thread"})
    with pytest.raises(ValidationError, match="memory_mb"):
        EnvConfig(module="calculator", tool_sandbox={"memory_mb": 1})
    with pytest.raises(ValidationError, match="mode"):
        EnvConfig(module="calculator", tool_sandbox={"mode": "container"})
    assert EnvConfig(module="calculator", tool_sandbox={"mode": "thread"}).tool_sandbox.settings() == SandboxSettings("thread")


def test_env_config_refuses_a_tool_that_cannot_cross(tmp_path, monkeypatch):
    from pydantic import ValidationError

    from polyrl.config.episodes import EnvConfig

    (tmp_path / "lambda_env.py").write_text(
        "from polyrl.envs import Tool, ToolEnvironment\n\n"
        "class LambdaEnv(ToolEnvironment):\n"
        "    tools = [Tool('shout', lambda text: text.upper())]\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError, match="tool 'shout'.*not importable by reference"):
        EnvConfig(module="lambda_env.py:LambdaEnv")
    EnvConfig(module="lambda_env.py:LambdaEnv", tool_sandbox={"mode": "thread"})


def test_a_tool_in_an_environment_file_crosses_by_its_path(tmp_path):
    """An environment loaded as file.py:Class: the worker loads the same file by path."""
    (tmp_path / "file_env.py").write_text(
        "from polyrl.envs import ToolEnvironment, tool\n\n"
        "@tool\ndef double(n: int) -> int:\n    '''Twice n.'''\n    return 2 * n\n\n"
        "class FileEnv(ToolEnvironment):\n    tools = [double]\n"
    )
    env = load_env_class(f"{tmp_path / 'file_env.py'}:FileEnv")()
    step = env.step('<tool_call>{"name": "double", "arguments": {"n": 21}}</tool_call>')
    assert (step.tool_errors, step.observation[0]["content"]) == (0, "42")


# --- an episode through the runner ---------------------------------------------------------------


class ProbeEnv(ToolEnvironment):
    """Offers the probes; a turn without calls ends the episode with reward 1."""

    tools = [add, exits, floods, hogs, sleeps]

    def start(self, row: EpisodeRow):
        return [{"role": "user", "content": row.prompt}]

    def answer(self, text: str) -> float:
        return 1.0


class ScriptedEngine:
    """Returns the scripted turns' ids in order (no sampling), with made-up log-probs."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns = tokenizer, list(turns)

    def generate(self, prompts, settings):
        out = []
        for prompt in prompts:
            text = self.turns.pop(0)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append([Completion(list(prompt.prompt_ids), ids, text.removesuffix("<|im_end|>"), [-0.5] * len(ids), "stop")])
        return out


def _calls(*calls: str | tuple[str, dict]) -> str:
    """One assistant turn holding these calls (a name, or a name and its arguments)."""
    calls = [(c, {}) if isinstance(c, str) else c for c in calls]
    text = "".join(f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>" for name, arguments in calls)
    return text + "<|im_end|>"


def test_an_episode_with_bad_tools_finishes_and_counts_the_errors(tiny_arch_dir):
    from transformers import AutoTokenizer

    from polyrl.rollout.episodes import EpisodeRunner, EpisodeSettings, episode_metrics

    tokenizer = AutoTokenizer.from_pretrained(tiny_arch_dir("qwen2"))
    turns = [
        _calls("exits", "floods", "hogs"),  # three errors: a crash, 10 MB printed, 10 GB asked for
        _calls("sleeps", ("add", {"a": 1, "b": 2})),  # one error (out of time), then 1 + 2 = 3
        "Done.<|im_end|>",
    ]
    settings = EpisodeSettings(max_turns=4, max_episode_tokens=4000, tool_timeout_s=0.5, tool_output_chars=200,
                               tool_sandbox=LIMITS, tool_format="text")  # fmt: skip
    runner = EpisodeRunner(ProbeEnv, tokenizer, settings)
    start = time.perf_counter()
    (group,) = runner.run(ScriptedEngine(tokenizer, turns), [PromptSample("Go.")], SamplingSettings(n=1))
    assert time.perf_counter() - start < 0.5 + MARGIN_S
    (episode,) = group
    assert (episode.episode["end"], episode.episode["return"]) == ("done", 1.0)
    # Turn 1: 3 calls, 3 errors; turn 2: sleeps timed out (an error), add ran: 5 calls, 4 errors.
    assert (episode.episode["tool_calls"], episode.episode["tool_errors"]) == (5, 4)
    metrics = episode_metrics(group)
    assert (metrics["episode/tool_calls_mean"], metrics["episode/tool_errors_mean"]) == (5.0, 4.0)
    observations = [t["content"] for t in episode.episode["turns"] if t["role"] == "tool"]
    assert observations[-1] == "3" and all(o.startswith("Error: ") for o in observations[:-1]), observations


def test_step_counts_match_a_direct_step():
    """ToolEnvironment.step hands its sandbox settings to every call (here: the limits of LIMITS)."""
    env = ProbeEnv()
    env.tool_sandbox, env.tool_timeout_s = LIMITS, 2.0
    step = env.step(_calls("hogs", ("add", {"a": 4, "b": 5})))
    assert isinstance(step, Step)
    assert (step.tool_calls, step.tool_errors) == (2, 1)
    assert "256 MB" in step.observation[0]["content"] and step.observation[1]["content"] == "9"
