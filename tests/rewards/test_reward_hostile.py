"""Hostile reward files (docs/bad-input.md): each is one message naming the module, and a non-zero exit.

- a file that ends the process while imported (``sys.exit(main())`` without the ``__main__``
  guard, ``os._exit(0)``): before, ``polyrl run``/``validate``/``rewards check`` exited 0 having
  done nothing;
- a score past float32's range (1e308, or 1e160 on some samples): before, a traceback from the
  reward summary (``math.fsum`` overflow);
- a score that never returns: before, the run blocked forever.

The CLI runs in a subprocess: an ``os._exit`` in the file would end pytest itself if imported
here before the fix.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from run_control import child_env

from polyrl.core.user_code import TimeBudgetError, call_with_time_budget, import_user_file, probe_import
from polyrl.rewards import CompositeReward, RewardBatch, RewardConfigError, RewardModuleError, load_reward_class
from polyrl.rewards.summary import SCORE_LIMIT, mean_and_std

HEADER = "import os, sys, time\nfrom polyrl.rewards import RewardModule\n\n\nclass R(RewardModule):\n"

EXITS = {
    # the file, the line its message names (None: no line, the process ended), what the message says
    "sys_exit": (
        HEADER
        + "    def score(self, batch):\n        return [1.0] * len(batch)\n\n\ndef main():\n    return 0\n\n\nsys.exit(main())\n",
        14,
        "it called sys.exit(0) while being imported",
    ),
    "os_exit": (
        HEADER + "    def score(self, batch):\n        return [1.0] * len(batch)\n\n\nos._exit(0)\n",
        None,
        "importing it ended the process (exit status 0) before the import returned",
    ),
}

SCORES = HEADER + (
    "    def __init__(self, value: float = 1.0, every: int = 1, sleep: float = 0.0):\n"
    "        self.value, self.every, self.sleep = value, every, sleep\n\n"
    "    def score(self, batch):\n"
    "        time.sleep(self.sleep)\n"
    "        return [self.value if i % self.every == 0 else 0.5 for i in range(len(batch))]\n"
)

ROWS = [{"prompt": "2+2?", "completion": "4"}, {"prompt": "3+3?", "completion": "6"}]


def batch(n: int = 4) -> RewardBatch:
    return RewardBatch(prompts=["p"] * n, completions=[str(i) for i in range(n)])


def cli(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "polyrl.cli.main", *args],
        cwd=folder,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    for fragment in fragments:
        assert fragment in output, (fragment, output)


def write_experiment(folder: Path, random_policy_dir: Path, rewards: list[dict]) -> Path:
    config = {
        "name": "hostile",
        "model": {"path": str(random_policy_dir)},
        "rollout": {"engine": "hf", "prompts_per_step": 2, "samples_per_prompt": 2, "max_tokens": 4},
        "rewards": rewards,
        "train": {"steps": 1, "micro_batch_size": 4},
        "tracking": {"uri": f"sqlite:///{folder / 'mlflow.db'}", "progress": False},
        "checkpoint": {"dir": str(folder / "runs")},
    }
    path = folder / "exp.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# --- a file that ends the process while it is imported -----------------------------------------


@pytest.mark.parametrize("kind", sorted(EXITS))
def test_a_file_that_exits_while_imported_is_that_files_failure(tmp_path, kind):
    source, line, says = EXITS[kind]
    path = tmp_path / "exits.py"
    path.write_text(source)
    with pytest.raises(RewardConfigError) as info:
        load_reward_class(f"{path}:R")
    where = f"{path}, line {line}" if line else f"{path}: importing it"
    assert f"reward module '{path}:R' failed to load: {where}" in str(info.value)
    assert says in str(info.value) and 'if __name__ == "__main__"' in str(info.value)


def test_the_probe_names_a_signal_and_a_file_that_returns_passes(tmp_path):
    killed = tmp_path / "killed.py"
    killed.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert "killed by signal SIGKILL" in probe_import("file", str(killed))
    fine = tmp_path / "fine.py"
    fine.write_text("X = 1\n")
    assert probe_import("file", str(fine)) is None
    assert import_user_file(fine, "polyrl_test_fine").X == 1
    raises = tmp_path / "raises.py"  # an exception is not the probe's to report: the import names its line
    raises.write_text("X = 1\nraise KeyError('k')\n")
    assert probe_import("file", str(raises)) is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(EXITS))
def test_run_validate_and_rewards_check_exit_non_zero_on_a_file_that_exits(tmp_path, random_policy_dir, kind):
    source, _, says = EXITS[kind]
    (tmp_path / "exits.py").write_text(source)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    config = write_experiment(tmp_path, random_policy_dir, [{"module": "exits.py:R"}])
    # Before: exit 0 and no message from all three.
    for args in (
        ["validate", str(config)],
        ["run", str(config), "--no-progress"],
        ["rewards", "check", "exits.py:R", "--data", "rows.jsonl"],
    ):
        result = cli(tmp_path, *args)
        assert_one_error(result, "reward module 'exits.py:R' failed to load", str(tmp_path / "exits.py"), says)
        assert result.returncode == 2
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


# --- scores past float32's range -----------------------------------------------------------------


def test_mean_and_std_never_overflow():
    # math.fsum([1e308, 1e308]) raises OverflowError; the scaled sums give mean 1e308, std 0.
    assert mean_and_std([1e308, 1e308]) == (1e308, 0.0)
    # [1e160, 1]: mean (1e160 + 1) / 2 = 5e159 (the 1 is lost in rounding); deviations ±5e159,
    # so the std is 5e159, though squaring a deviation overflows.
    assert mean_and_std([1e160, 1.0]) == pytest.approx((5e159, 5e159))
    # ordinary values take the direct sums: mean 2, std sqrt(((1-2)^2 + 0 + (3-2)^2) / 3) = sqrt(2/3)
    assert mean_and_std([1.0, 2.0, 3.0]) == (2.0, math.sqrt(2 / 3))


@pytest.mark.parametrize("value, every", [(1e308, 1), (1e160, 2)], ids=["1e308", "1e160-on-some"])
def test_a_score_past_float32_is_a_named_error_of_the_module(tmp_path, value, every):
    (tmp_path / "scores.py").write_text(SCORES)
    reward = CompositeReward(
        [{"module": f"{tmp_path / 'scores.py'}:R", "name": "huge", "params": {"value": value, "every": every}}]
    )
    with pytest.raises(
        RewardModuleError, match=r"reward module 'huge' returned 1e\+(308|160) for sample 0 .*float32 range"
    ) as info:
        reward.score(batch())  # before: OverflowError from the summary's math.fsum
    assert info.value.label == "huge" and info.value.index == 0


def test_a_total_past_float32_is_refused_naming_the_terms(tmp_path):
    (tmp_path / "scores.py").write_text(SCORES)
    ref = f"{tmp_path / 'scores.py'}:R"
    # 1e38 is within float32 (max ~3.40e38), but 1e38 × 2 + 1e38 × 2 = 4e38 is not.
    reward = CompositeReward(
        [
            {"module": ref, "name": "a", "weight": 2.0, "params": {"value": 1e38}},
            {"module": ref, "name": "b", "weight": 2.0, "params": {"value": 1e38}},
        ]
    )
    with pytest.raises(RewardModuleError, match=r"total reward of sample 0 .* is 4e\+38 \(a 2 × 1e\+38, b 2 × 1e\+38\)"):
        reward.score(batch())
    assert SCORE_LIMIT == pytest.approx(3.4028234663852886e38)


@pytest.mark.slow
def test_rewards_check_and_run_name_a_score_past_float32(tmp_path, random_policy_dir):
    (tmp_path / "scores.py").write_text(SCORES)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    checked = cli(tmp_path, "rewards", "check", "scores.py:R", "--data", "rows.jsonl", "--params", '{"value": 1e308}')
    assert_one_error(checked, "FAILED finite: R: 2 score(s) beyond the float32 range", "first 1e+308 for sample 0")
    config = write_experiment(tmp_path, random_policy_dir, [{"module": "scores.py:R", "params": {"value": 1e160, "every": 2}}])
    ran = cli(tmp_path, "run", str(config), "--no-progress")
    assert_one_error(ran, "reward module 'R' returned 1e+160 for sample 0", "float32 range")


# --- a score that never returns ------------------------------------------------------------------


def test_call_with_time_budget_returns_raises_and_stops_waiting():
    assert call_with_time_budget(lambda x: x + 1, 1, timeout_s=5, what="f") == 2
    with pytest.raises(KeyError):
        call_with_time_budget(lambda: {}["k"], timeout_s=5, what="f")
    started = time.perf_counter()
    with pytest.raises(TimeBudgetError, match=r"^slow thing did not return within 0.2 s"):
        call_with_time_budget(time.sleep, 30, timeout_s=0.2, what="slow thing")
    assert time.perf_counter() - started < 5


def test_a_reward_past_its_time_budget_is_a_named_error(tmp_path):
    (tmp_path / "scores.py").write_text(SCORES)
    spec = {"module": f"{tmp_path / 'scores.py'}:R", "name": "stuck", "params": {"sleep": 30}, "timeout_s": 0.3}
    reward = CompositeReward([spec])
    started = time.perf_counter()
    with pytest.raises(RewardModuleError, match=r"reward module 'stuck' did not return within 0.3 s.*rewards\[\]\.timeout_s"):
        reward.score(batch())  # before: blocked for the full sleep, and forever for a hung module
    assert time.perf_counter() - started < 5  # not retried sample by sample (4 × 30 s)
    assert CompositeReward([{"module": "length"}]).specs[0].timeout_s == 300.0


@pytest.mark.slow
def test_run_and_rewards_check_stop_on_a_stuck_reward(tmp_path, random_policy_dir):
    (tmp_path / "hang.py").write_text(HEADER + "    def score(self, batch):\n        while True:\n            time.sleep(0.05)\n")
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    checked = cli(tmp_path, "rewards", "check", "hang.py:R", "--data", "rows.jsonl", "--timeout", "1", timeout=300)
    assert_one_error(checked, "FAILED exceptions: reward module 'R' did not return within 1 s")
    config = write_experiment(tmp_path, random_policy_dir, [{"module": "hang.py:R", "timeout_s": 2}])
    ran = cli(tmp_path, "run", str(config), "--no-progress", timeout=300)  # before: never ended
    assert_one_error(ran, "reward module 'R' did not return within 2 s")
