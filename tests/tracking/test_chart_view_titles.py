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
