"""The rollout inspector page: small, self-contained, and, opened in headless Chromium from a
finished run's folder, it shows the figures the run logged for that step."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

from polyrl.launch.runner import run_experiment
from polyrl.tracking.inspector import figures, inspector_html, inspector_rows

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _page(n_samples: int, n_tokens: int) -> str:
    samples = [
        {
            "prompt": f"prompt {i // 8}",
            "completion": "x" * n_tokens,
            "reward": i / 7,
            "length": n_tokens,
            "finish_reason": "length",
        }
        for i in range(n_samples)
    ]
    tokens = [[f"t{k}" for k in range(n_tokens)] for _ in range(n_samples)]
    # Every quantity a learner step records, at full float precision (the page rounds them).
    values = [
        {
            "sampler_logprob": [-0.1234567 * k for k in range(n_tokens)],
            "learner_logprob": [-0.1234 * k for k in range(n_tokens)],
            "entropy": [1.23456789 + k / 7 for k in range(n_tokens)],
            "advantage": [(i - 31.5) / 17.123456 for _ in range(n_tokens)],
            "ratio": [1 + (k - 32) / 3001.0 for k in range(n_tokens)],
            "clipped": [k % 5 == 0 for k in range(n_tokens)],
            "masked": [k % 9 == 0 for k in range(n_tokens)],
        }
        for i in range(n_samples)
    ]
    rows = inspector_rows(samples, tokens=tokens, token_values=values, parts={"judge": [1.0] * n_samples})
    return inspector_html(rows, title="t", prompts=[f"prompt {g}" for g in range(n_samples // 8)])


def test_a_step_of_64_samples_by_64_tokens_stays_small_and_offline():
    page = _page(64, 64)
    assert len(page.encode()) < 300_000  # well under 1 MB with every quantity (eight) at 4 significant digits
    assert "http://" not in page and "https://" not in page  # no CDN, nothing fetched


def test_rows_add_the_logprob_difference_and_figures_skip_unscored():
    rows = inspector_rows(
        [
            {"prompt": "p", "completion": "a", "reward": 1.0, "length": 2, "finish_reason": "stop"},
            {"prompt": "p", "completion": "b", "reward": None, "length": 4, "finish_reason": "length"},
        ],  # fmt: skip
        tokens=[["a", "b"], ["c", "d", "e", "f"]],
        token_values=[{"sampler_logprob": [-1.0, -2.0], "learner_logprob": [-1.5, -2.0]}, {}],
    )
    assert rows[0]["v"]["logprob_diff"] == [-0.5, 0.0]
    # reward over the scored sample only (1.0); length (2 + 4) / 2 = 3; one of two truncated.
    shown = figures(rows)
    assert {k: shown[k] for k in ("samples", "reward_mean", "length_mean", "truncated")} == {
        "samples": 2.0, "reward_mean": 1.0, "length_mean": 3.0, "truncated": 0.5}  # fmt: skip
    # |learner − sampler| over the two tokens that have both: (0.5 + 0) / 2; no ratio, clip or advantage recorded.
    assert shown["logprob_gap"] == 0.25 and all(math.isnan(shown[k]) for k in ("ratio_mean", "clipped", "advantage_mean"))


def _dump_dom(path: Path, tmp_path: Path) -> str:
    return _dump_dom_url(path.resolve().as_uri(), tmp_path)


def _dump_dom_url(url: str, tmp_path: Path) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is installed by scripts/setup_env.sh (apt-get install chromium)"
    result = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.browser
@pytest.mark.slow
def test_inspector_from_a_finished_run_shows_the_logged_figures_in_chromium(tmp_path, tiny_experiment, write_experiment):
    config = tiny_experiment(
        rollout={"prompts_per_step": 2, "samples_per_prompt": 4, "max_tokens": 8},
        train={"steps": 1},
        tracking={"sample_table_every": 1},
    )
    result = run_experiment(write_experiment(tmp_path, config), console=Console(quiet=True), show_progress=False)
    arm, run_id = next(iter(result.arm_run_ids.items()))
    page = next((tmp_path / "runs").rglob("inspector/step_00001.html"))
    client = MlflowClient(result.tracking_uri)
    keys = ("reward/mean", "rollout/response_length/mean", "actor/ratio_mean", "actor/clip_frac_low", "actor/clip_frac_high",
            "actor/entropy", "advantage/mean", "rollout/logprob_gap")  # fmt: skip
    logged = {key: client.get_metric_history(run_id, key)[0].value for key in keys}
    assert [a.path for a in client.list_artifacts(run_id, "inspector")] == ["inspector/step_00001.html"]

    dom = _dump_dom(page, tmp_path)
    assert 'data-ready="1"' in dom  # the script ran to its end

    def shown(key: str) -> float:
        return float(re.search(rf'id="fig-{key}" data-value="([^"]+)"', dom).group(1))

    assert shown("samples") == 8
    assert shown("reward_mean") == pytest.approx(logged["reward/mean"], rel=1e-3)
    assert shown("length_mean") == pytest.approx(logged["rollout/response_length/mean"], rel=1e-6)
    assert dom.count('class="card"') == 8 and "sampler log-prob" in dom
    # Every completion token, shaded by the sampler's log-prob (the first quantity), hover text included.
    shaded = re.findall(r'<span title="sampler log-prob: (-?[0-9.e-]+)" style="background: rgba', dom)
    assert len(shaded) == round(8 * logged["rollout/response_length/mean"])
    # The learner's side: its figures are the logged ones (4-digit rounding of each token's value).
    assert shown("ratio_mean") == pytest.approx(logged["actor/ratio_mean"], rel=1e-3)
    assert shown("clipped") == pytest.approx(logged["actor/clip_frac_low"] + logged["actor/clip_frac_high"], abs=1e-6)
    assert shown("advantage_mean") == pytest.approx(logged["advantage/mean"], abs=1e-3)
    assert shown("logprob_gap") == pytest.approx(logged["rollout/logprob_gap"], rel=0.05, abs=1e-5)
    # A learner quantity selected by the link: every trained token shaded by its entropy, whose
    # token mean is actor/entropy (one mini-batch: every token trains once).
    dom = _dump_dom_url(page.resolve().as_uri() + "#quantity=entropy", tmp_path)
    assert 'data-ready="1"' in dom
    entropies = [float(x) for x in re.findall(r'<span title="entropy: ([0-9.e+-]+)" style="background: rgba', dom)]
    assert len(entropies) == len(shaded)
    assert sum(entropies) / len(entropies) == pytest.approx(logged["actor/entropy"], rel=2e-3)
    assert len(set(re.findall(r'title="entropy: [^"]+" style="background: (rgba\([^)]*\))', dom))) > 1  # shades differ


def test_hook_writes_the_page_locally_and_drops_a_misaligned_quantity(tmp_path, random_policy_dir):
    import json

    from transformers import AutoTokenizer

    from polyrl.trainer.hooks import StepReport
    from polyrl.trainer.inspector_hook import InspectorHook

    tokenizer = AutoTokenizer.from_pretrained(random_policy_dir)
    ids = tokenizer.encode("ab", add_special_tokens=False)
    samples = [{"prompt": "p", "completion": "ab", "reward": 1.0, "length": len(ids), "finish_reason": "stop"}] * 2
    tokens = [{"ids": ids, "sampler_logprob": [-1.0] * len(ids)}, {"ids": ids, "sampler_logprob": [-1.0]}]  # second misaligned
    hook = InspectorHook(None, every=5, tokenizer=tokenizer, local_dir=tmp_path / "inspector")
    hook.observe(StepReport(3, {}, samples, tokens=tokens))
    assert not (tmp_path / "inspector").exists()  # step 3: not a sample-table step
    hook.observe(StepReport(5, {}, samples, tokens=tokens))
    page = (tmp_path / "inspector" / "step_00005.html").read_text()
    data = json.loads(page.split("id='data'>", 1)[1].split("</script>", 1)[0])
    assert data["rows"][0]["v"] == {"sampler_logprob": [-1.0] * len(ids)} and data["rows"][1]["v"] == {}
    assert "".join(data["rows"][0]["t"]) == "ab"


@pytest.mark.browser
def test_filters_and_the_group_view_from_the_link(tmp_path):
    samples = [
        {"prompt": f"p{i // 4}", "completion": f"c{i}", "reward": float(i), "length": 3, "advantage": i - 3.5,
         "finish_reason": "length" if i % 3 == 0 else "stop"}
        for i in range(8)
    ]  # fmt: skip
    # Samples 2 and 5 have a token the clip removed (None: a token out of the loss); 6 one a correction masked.
    values = [
        {"entropy": [0.1, 0.2, 0.3], "clipped": [None, i in (2, 5), False], "masked": [False, False, i == 6]} for i in range(8)
    ]
    rows = inspector_rows(samples, tokens=[["a", "b", "c"]] * 8, token_values=values)
    page = tmp_path / "page.html"
    page.write_text(inspector_html(rows, title="t", prompts=["p0", "p1"]))

    def cards(fragment: str) -> list[int]:
        dom = _dump_dom_url(page.resolve().as_uri() + fragment, tmp_path)
        return [int(i) for i in re.findall(r'class="card" data-index="(\d+)"', dom)]

    assert cards("") == list(range(8))
    assert cards("#filter=truncated") == [0, 3, 6]  # finish_reason "length"
    assert cards("#filter=high_adv&group=1") == [7, 6, 5, 4]  # the group's samples, highest advantage first
    assert cards("#filter=low_adv") == list(range(8))  # at most eight, lowest advantage first
    assert cards("#filter=clipped") == [2, 5, 6]  # a token removed by the clip or by the correction


@pytest.mark.browser
def test_judge_and_rule_disagreement_filter(tmp_path):
    # Rule 0/1; the judge (1..5) agrees on samples 0-3 and contradicts it on 4 and 5. After min-max
    # scaling: judge 1 → 0, 5 → 1; a disagreement is a scaled gap above 0.5.
    rule = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    judge = [5.0, 1.0, 4.0, 2.0, 1.0, 5.0]
    samples = [{"prompt": "p", "completion": f"c{i}", "reward": rule[i], "length": 1, "finish_reason": "stop"} for i in range(6)]
    rows = inspector_rows(samples, parts={"judge": judge, "exact": rule})
    page = tmp_path / "page.html"
    page.write_text(inspector_html(rows, title="t", prompts=["p"], judge_rule_pairs={"judge": "exact"}))
    dom = _dump_dom_url(page.resolve().as_uri() + "#filter=disagree", tmp_path)
    assert [int(i) for i in re.findall(r'class="card" data-index="(\d+)"', dom)] == [4, 5]
    assert "reward 1 · 1 tokens · stop · judge 1 · exact 1" in dom  # sample 4: its components beside it
