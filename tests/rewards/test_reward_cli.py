"""`polyrl rewards list | new | check` through typer's CliRunner (and a pytest subprocess)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from polyrl.cli.rewards import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


ROWS = [
    {"prompt": "2+2?", "completion": "The answer is 4", "answer": "4", "references": ["4"]},
    {"prompt": "3+3?", "completion": "#### 7", "answer": "6", "references": ["6"]},
    {"prompt": "Say hi", "completion": "hi", "references": ["hi there"]},
    {"prompt": "Explode?", "completion": "this one goes boom", "answer": "1", "references": ["no"]},
]

BAD_MODULES = textwrap.dedent(
    """
    import random
    from polyrl.rewards import RewardModule

    class Exploding(RewardModule):
        name = "exploding"

        def score(self, batch):
            out = []
            for c in batch.completions:
                if "boom" in c:
                    raise ValueError("cannot handle boom")
                out.append(1.0)
            return out

    class Noisy(RewardModule):
        def score(self, batch):
            return [random.random() for _ in batch.completions]

    class Short(RewardModule):
        def score(self, batch):
            return [0.0] * (len(batch) - 1)

    class NaNs(RewardModule):
        def score(self, batch):
            return [float("nan") if "hi" == c else 0.0 for c in batch.completions]

    class Strings(RewardModule):
        def score(self, batch):
            return ["1"] * len(batch)
    """
)


def test_list_shows_builtins_and_parameters():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    for text in ("rouge_l", "ppl_fluency", "cider", "overlong_max_length", "corpus_references", "built-in"):
        assert text in result.output


def test_new_scaffold_passes_its_own_tests(tmp_path):
    result = runner.invoke(app, ["new", "keyword_bonus", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "keyword_bonus.py").exists() and (tmp_path / "test_keyword_bonus.py").exists()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "3 passed" in completed.stdout
    # the scaffolded module also passes `check`
    data = write_rows(tmp_path / "rows.jsonl", ROWS[:3])
    result = runner.invoke(app, ["check", f"{tmp_path}/keyword_bonus.py:KeywordBonus", "--data", str(data)])
    assert result.exit_code == 0, result.output
    # refuses to overwrite, and rejects a bad name
    assert runner.invoke(app, ["new", "keyword_bonus", "--dir", str(tmp_path)]).exit_code == 2
    assert runner.invoke(app, ["new", "Bad-Name", "--dir", str(tmp_path)]).exit_code == 2


def test_check_builtin_passes(tmp_path):
    data = write_rows(tmp_path / "rows.jsonl", ROWS)
    result = runner.invoke(app, ["check", "accuracy", "--data", str(data)])
    assert result.exit_code == 0, result.output
    assert "all checks passed" in result.output
    assert "unscored" in result.output and "samples/s" in result.output
    # params as JSON reach the constructor; a bad one is a usage error (exit 2)
    result = runner.invoke(app, ["check", "length", "--data", str(data), "--params", '{"target": 5}'])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["check", "length", "--data", str(data), "--params", '{"targt": 5}'])
    assert result.exit_code == 2 and "targt" in result.output


def test_check_custom_completion_field(tmp_path):
    rows = [{"prompt": "p", "output": "hello"}]
    data = write_rows(tmp_path / "rows.jsonl", rows)
    result = runner.invoke(app, ["check", "length", "--data", str(data), "--completion-field", "output"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["check", "length", "--data", str(data)])
    assert result.exit_code == 2 and "no 'completion' field" in result.output


def test_check_names_the_failing_sample(tmp_path):
    (tmp_path / "bad.py").write_text(BAD_MODULES)
    data = write_rows(tmp_path / "rows.jsonl", ROWS)
    result = runner.invoke(app, ["check", f"{tmp_path}/bad.py:Exploding", "--data", str(data)])
    assert result.exit_code == 1, result.output
    assert "FAILED exceptions: exploding: raised ValueError: cannot handle boom on sample 3" in result.output
    assert "'Explode?'" in result.output and "'this one goes boom'" in result.output


def test_check_catches_nondeterminism_length_nan_and_types(tmp_path):
    (tmp_path / "bad.py").write_text(BAD_MODULES)
    data = write_rows(tmp_path / "rows.jsonl", ROWS)
    expectations = {
        "Noisy": "FAILED deterministic: Noisy: two calls on the same batch disagree on 4 sample(s)",
        "Short": "FAILED contract: Short: returned 3 scores for 4 samples",
        "NaNs": "FAILED finite: NaNs: 1 NaN/inf score(s), first nan for sample 2",
        "Strings": "FAILED contract: Strings: 4 score(s) are not float/None, first '1' (str)",
    }
    for cls, message in expectations.items():
        result = runner.invoke(app, ["check", f"{tmp_path}/bad.py:{cls}", "--data", str(data)])
        assert result.exit_code == 1, (cls, result.output)
        assert message in result.output, (cls, result.output)


def test_check_unknown_module(tmp_path):
    data = write_rows(tmp_path / "rows.jsonl", ROWS)
    result = runner.invoke(app, ["check", "rogue_l", "--data", str(data)])
    assert result.exit_code == 2
    assert "unknown reward module 'rogue_l'" in result.output and "rouge_l" in result.output
