"""The saved chart view ``polyrl compare`` links to, rendered by MLflow's own UI in headless
Chromium: every card of the comparison section is titled with its full metric key (none cut
with an ellipsis: the title element's scrollWidth fits its clientWidth) and each arm's line is
drawn in its arm's colour. MLflow titles these cards by metric key and ignores ``displayName``
(polyrl.tracking.chart_view, SECTION_COLUMNS), so the card width is what is checked."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from polyrl.analysis.compare_views import write_chart_view
from polyrl.analysis.report_metrics import headline_keys
from polyrl.tracking.chart_view import ARM_COLOURS
from polyrl.tracking.mlflow_runs import ExperimentTracker
from tests.tracking.chart_browser import ChromiumPage

pytestmark = [pytest.mark.browser, pytest.mark.mlflow_server, pytest.mark.slow]

EVAL_KEYS = ["eval/arithmetic_chat/accuracy", "eval/arithmetic_chat/length/mean", "eval/arithmetic_chat/length/wrong_mean"]
TRAINING = {"reward/mean": 0.5, "train/accuracy": 0.5, "rollout/response_length/mean": 30.0, "actor/entropy": 1.0}
# Metrics outside the comparison section: the UI puts them in sections named by their prefix.
OTHER = {"actor/clip_frac_high": 0.1, "rollout/response_length/clipped_ratio": 0.0}
# A title cut by the UI's ellipsis is narrower on screen than its text.
TITLES_JS = """Array.from(document.querySelectorAll('[data-testid=experiment-view-compare-runs-card] h4'))
  .map(h => ({text: h.textContent, scroll: h.scrollWidth, client: h.clientWidth}))"""
STROKES_JS = """Array.from(new Set(Array.from(document.querySelectorAll(
  '[data-testid=experiment-view-compare-runs-card] path.js-line')).map(p => p.style.stroke)))"""


def _rgb(colour: str) -> str:
    return "rgb({}, {}, {})".format(*(int(colour[i : i + 2], 16) for i in (1, 3, 5)))


def _serve(uri: str, port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", uri, "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return process
        except OSError:
            time.sleep(0.5)
    process.kill()
    pytest.fail("mlflow server did not come up")


def test_chart_titles_show_the_whole_metric_key_and_arms_their_colours(tmp_path):
    import socket

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = ExperimentTracker(uri, "titles")
    parent = tracker.start_parent("titles")
    run_ids = []
    for offset, arm in enumerate(("grpo", "dr_grpo")):
        run = tracker.start_arm(parent.run_id, arm)
        for step in range(3):
            run.log_step(step, {**TRAINING, **OTHER, **{key: 0.1 * step + offset for key in EVAL_KEYS}})
        run.finish()
        run_ids.append(run.run_id)
    parent.finish()
    client = MlflowClient(uri)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = write_chart_view(
        client, experiment_id=client.get_run(parent.run_id).info.experiment_id, parent_run_id=parent.run_id,
        run_ids=run_ids, eval_keys=EVAL_KEYS, grouped=True, base_url=f"http://127.0.0.1:{port}",
    )  # fmt: skip
    expected = headline_keys(EVAL_KEYS)  # the section's cards, in order
    server = _serve(uri, port)
    try:
        # 1400 px wide, with MLflow's Assistant panel open as a fresh browser shows it: the narrowest
        # chart area a laptop reader gets. Tall, because the UI renders a card (its title included)
        # only once it is scrolled into view.
        with ChromiumPage(tmp_path / "chromium", width=1400, height=3000) as page:
            page.open(url)
            drawn = page.wait_for(
                f"({TITLES_JS}).length >= {len(expected) + len(OTHER)} && ({STROKES_JS}).length >= 2", timeout=300
            )
            page.screenshot(tmp_path / "chart_view.png")
            assert drawn, f"the chart view did not draw its cards; screenshot {tmp_path / 'chart_view.png'}"
            titles = page.evaluate(TITLES_JS)
            strokes = page.evaluate(STROKES_JS)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    # The comparison section comes first, then the sections of the other logged keys. Left to the UI
    # those were three a row and cut their titles ("train/step": 29 of its 59 px).
    assert [title["text"] for title in titles][: len(expected)] == expected
    assert set(OTHER) <= {title["text"] for title in titles[len(expected) :]}
    cut = [title for title in titles if title["scroll"] > title["client"]]
    assert not cut, f"titles cut with an ellipsis (scrollWidth > clientWidth): {cut}"
    assert min(title["client"] for title in titles) > 0
    assert {_rgb(ARM_COLOURS[0]), _rgb(ARM_COLOURS[1])} <= set(strokes), strokes


def _far_apart(first: str, second: str) -> float:
    """Euclidean distance of two ``rgb(r, g, b)`` strings (0 to 441)."""
    import re

    a, b = ([int(v) for v in re.findall(r"\d+", colour)[:3]] for colour in (first, second))
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5


def _seeded_step(score: float, length: float) -> dict[str, float]:
    """One step of a plausible run (scores in [0, 1], lengths in tokens), for docs/mlflow_compare.png."""
    return {
        **TRAINING,
        "reward/mean": score,
        "train/accuracy": score,
        "rollout/response_length/mean": length,
        EVAL_KEYS[0]: score - 0.05,
        EVAL_KEYS[1]: length,
        EVAL_KEYS[2]: length + 8,
    }


def test_seeded_arms_are_drawn_in_two_distinct_polyrl_colours(tmp_path):
    """2 arms x 2 seeds. Grouped by arm (the view before), the UI coloured each group from a hash of
    the group (grey and dark blue); the view now draws the arm runs (the mean over their seeds) in
    their arm colours."""
    import os
    import socket

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = ExperimentTracker(uri, "seeded")
    parent = tracker.start_parent("seeded")
    run_ids = []
    for offset, arm in enumerate(("grpo", "dr_grpo")):
        arm_run = tracker.start_arm(parent.run_id, arm)
        for seed in range(2):
            run = tracker.start_arm(arm_run.run_id, arm, seed=seed)
            for step in range(6):
                score = 0.3 + 0.04 * step * (1 + offset) + 0.03 * seed  # dr_grpo climbs twice as fast
                length = 60.0 - 3 * step * (1 + offset) + seed  # and shortens its answers faster
                run.log_step(step, _seeded_step(score, length))
            run.finish()
            run_ids.append(run.run_id)
        arm_run.finish()
    parent.finish()
    client = MlflowClient(uri)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = write_chart_view(
        client, experiment_id=client.get_run(parent.run_id).info.experiment_id, parent_run_id=parent.run_id,
        run_ids=run_ids, eval_keys=EVAL_KEYS, grouped=True, base_url=f"http://127.0.0.1:{port}",
    )  # fmt: skip
    server = _serve(uri, port)
    try:
        with ChromiumPage(tmp_path / "chromium", width=1400, height=3000) as page:
            page.open(url)
            drawn = page.wait_for(f"({STROKES_JS}).length >= 2 && ({TITLES_JS}).length >= 3", timeout=300)
            time.sleep(1)  # the last cards' lines
            page.screenshot(tmp_path / "chart_view.png")
            page.screenshot(tmp_path / "chart_view_top.png", height=1100)  # docs/mlflow_compare.png
            assert drawn, f"the chart view did not draw its cards; screenshot {tmp_path / 'chart_view.png'}"
            strokes = page.evaluate(STROKES_JS)
            names = page.evaluate("document.body.innerText")
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    if os.environ.get("POLYRL_CHART_SCREENSHOT"):  # regenerate the docs' picture
        Path(os.environ["POLYRL_CHART_SCREENSHOT"]).write_bytes((tmp_path / "chart_view_top.png").read_bytes())
    # Only the two arm colours are drawn (a group would be drawn in a colour hashed from the group).
    assert set(strokes) == {_rgb(ARM_COLOURS[0]), _rgb(ARM_COLOURS[1])}, strokes
    # Far apart: (34, 114, 180) and (222, 121, 33) are sqrt(188² + 7² + 147²) ≈ 239 apart (of 441).
    assert _far_apart(_rgb(ARM_COLOURS[0]), _rgb(ARM_COLOURS[1])) > 150
    # One line per arm: the arm runs, not their seed runs (which are the second saved view).
    seed_names = [client.get_run(run_id).info.run_name for run_id in run_ids]
    assert "grpo" in names and not any(name in names for name in seed_names), (seed_names, names[:2000])
