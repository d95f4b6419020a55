"""Sample tables of image prompts: an HTML artifact with the images, in a real MLflow store."""

from __future__ import annotations

import base64
import io
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from polyrl.core.types import Completion, PromptSample, SamplingSettings
from polyrl.evals.harness import SuiteRunner
from polyrl.evals.periodic import PeriodicEvaluator
from polyrl.tasks import scenes
from polyrl.tracking.run_logger import RunLogger
from polyrl.tracking.sample_html import MAX_EMBEDDED_SIDE, samples_html
from polyrl.trainer.hooks import PeriodicEvalHook, SampleTableHook, StepReport

EVIL = "<script>alert('x')</script> & \"quotes\""


class Table(HTMLParser):
    """The rows of a sample table: each row's cell texts and decoded images."""

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []
        self.cell: list[str] | None = None
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if tag == "tr" and attrs.get("class") == "sample":
            self.rows.append({"cells": [], "images": []})
        elif tag == "td" and self.rows:
            self.cell = []
            self.rows[-1]["cells"].append(self.cell)
        elif tag == "br" and self.cell is not None:
            self.cell.append("\n")
        elif tag == "img" and self.rows:
            prefix = "data:image/png;base64,"
            assert attrs["src"].startswith(prefix)
            self.rows[-1]["images"].append(Image.open(io.BytesIO(base64.b64decode(attrs["src"][len(prefix) :]))))

    def handle_endtag(self, tag):
        if tag == "td":
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def parse(text: str) -> Table:
    table = Table()
    table.feed(text)
    for row in table.rows:
        row["text"] = ["".join(cell) for cell in row["cells"]]
    return table


def scene_samples(n: int) -> list[PromptSample]:
    rows = scenes.split_rows("test")[:n]
    return [
        PromptSample(
            prompt=r["prompt"],
            references=list(r["references"]),
            images=[scenes.render(scenes.make_scene(r["scene_id"]))],
            fields={"answer": r["answer"]},
        )
        for r in rows
    ]


def same_pixels(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and a.convert("RGB").tobytes() == b.convert("RGB").tobytes()


@pytest.fixture
def logger(mlflow_uri):
    client = MlflowClient(mlflow_uri)
    experiment = client.create_experiment("samples")
    return RunLogger(client, client.create_run(experiment).info.run_id)


def download(logger: RunLogger, path: str, tmp_path: Path) -> str:
    return Path(logger.client.download_artifacts(logger.run_id, path, str(tmp_path / "dl"))).read_text()


def test_image_samples_are_logged_as_html_beside_the_json_table(logger, tmp_path):
    prompts = scene_samples(4)
    prompts[1].prompt = f"<image>{EVIL}"
    # Rows as the loop's sample_rows makes them; two reward modules score each row.
    samples = [
        {
            "prompt": p.prompt,
            "completion": f" answer {i}",
            "reward": float(i),
            "length": 3,
            "finish_reason": "stop",
            "modalities": "TTT",
        }
        for i, p in enumerate(prompts)
    ]
    parts = {"accuracy": [1.0, 0.0, None, 1.0], "length": [0.25, 0.5, 0.75, 1.0]}
    report = StepReport(10, {}, samples, prompts=prompts, reward_parts=parts)
    SampleTableHook(logger, every=10, rows=3).observe(report)

    names = {a.path for a in logger.client.list_artifacts(logger.run_id, "samples")}
    assert names == {"samples/step_00010.json", "samples/step_00010.html"}
    text = download(logger, "samples/step_00010.html", tmp_path)
    table = parse(text)
    assert len(table.rows) == 3 and table.scripts == 0  # rows: the hook's 3, not the step's 4
    assert "<script>alert" not in text and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quotes&quot;" in text
    for row, prompt, sample in zip(table.rows, prompts, samples):
        assert len(row["images"]) == 1 and row["images"][0].format == "PNG"
        assert same_pixels(row["images"][0], prompt.images[0])  # 32x32, embedded at its own size
        index, _, shown_prompt, completion, references, rewards = row["text"]
        assert shown_prompt == prompt.prompt  # the parser unescapes: the user's text, exactly
        assert completion.startswith(sample["completion"])
        assert (
            all(reference in references for reference in prompt.references) and f"answer: {prompt.fields['answer']}" in references
        )
    scores = [dict(line.split(": ") for line in row["text"][5].splitlines()) for row in table.rows]
    assert scores == [
        {"reward": "0", "reward/accuracy": "1", "reward/length": "0.25"},
        {"reward": "1", "reward/accuracy": "0", "reward/length": "0.5"},
        {"reward": "2", "reward/accuracy": "unscored", "reward/length": "0.75"},
    ]
    # The JSON table is unchanged: the text columns only.
    json_table = json.loads(download(logger, "samples/step_00010.json", tmp_path))
    assert json_table["columns"] == ["step", "prompt", "completion", "reward", "length", "finish_reason", "modalities"]


def test_text_prompts_log_only_the_json_table(logger, tmp_path):
    """Drawing and arithmetic prompts have no images: nothing changes for them."""
    prompts = [PromptSample(prompt="draw a red square at top left"), PromptSample(prompt="2+2=")]
    samples = [{"prompt": p.prompt, "completion": "<img>…</img>", "reward": 0.5} for p in prompts]
    SampleTableHook(logger, every=5, rows=8).observe(StepReport(5, {}, samples, prompts=prompts))
    assert {a.path for a in logger.client.list_artifacts(logger.run_id, "samples")} == {"samples/step_00005.json"}


class FixedAnswers:
    """A rollout engine that answers every prompt with the same texts (logic test of the table)."""

    name = "fixed"

    def __init__(self, texts: list[str]):
        self.texts = texts

    def generate(self, prompts: list[PromptSample], settings: SamplingSettings) -> list[list[Completion]]:
        return [
            [
                Completion(
                    prompt_ids=[0], completion_ids=[1] * len(t), text=t, sampling_logprobs=[0.0] * len(t), finish_reason="stop"
                )
                for t in self.texts[: settings.n]
            ]
            for _ in prompts
        ]


def test_periodic_eval_of_an_image_suite_logs_its_html_table(logger, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    rows = scenes.split_rows("test")[:3]
    pictures = [scenes.render(scenes.make_scene(r["scene_id"])) for r in rows]
    for i, picture in enumerate(pictures):
        picture.save(folder / f"{i}.png")
    (folder / "vqa.jsonl").write_text(
        "".join(
            json.dumps({"prompt": r["prompt"], "answer": r["answer"], "images": [f"{i}.png"]}) + "\n" for i, r in enumerate(rows)
        )
    )
    (folder / "suite.yaml").write_text(
        json.dumps(
            {
                "name": "img",
                "datasets": {"name": "img", "source": "vqa.jsonl", "image_field": "images"},
                "generation": {"decoding": "sample", "n": 2, "max_tokens": 4},
                "metrics": {"accuracy": {"extract": "full"}},
            }
        )
    )
    answer = rows[0]["answer"]
    hook = PeriodicEvalHook(
        PeriodicEvaluator(SuiteRunner(folder / "suite.yaml")), FixedAnswers([answer, "nope"]), every=2, logger=logger
    )
    hook.observe(StepReport(2, {}))

    table = parse(download(logger, "eval_samples/step_00002.html", tmp_path))
    assert len(table.rows) == 6  # 3 prompts x n=2
    for index, row in enumerate(table.rows):
        assert len(row["images"]) == 1 and same_pixels(row["images"][0], pictures[index // 2])  # row i shows prompt i // n
        assert row["text"][2] == rows[index // 2]["prompt"]
    # Each prompt's first sample is prompt 0's answer: correct 1 wherever a prompt has that same
    # answer (prompt 0 always; others by chance of the split); "nope" is wrong everywhere.
    scores = [dict(line.split(": ") for line in row["text"][5].splitlines()) for row in table.rows]
    expected = [flag for r in rows for flag in ("1" if r["answer"] == answer else "0", "0")]
    assert expected[:2] == ["1", "0"] and [s["correct"] for s in scores] == expected


def test_large_images_are_shrunk_and_sizes_stay_honest():
    big = Image.new("RGB", (1024, 512), (10, 200, 30))
    table = parse(samples_html([{"prompt": "p", "completion": "c"}], [[big]], title="t"))
    (image,) = table.rows[0]["images"]
    assert image.size == (MAX_EMBEDDED_SIDE, MAX_EMBEDDED_SIDE // 2)
    with pytest.raises(ValueError, match="2 rows but 1 image lists"):
        samples_html([{}, {}], [[]], title="t")


def test_the_answer_shown_comes_from_the_configured_answer_field(logger, tmp_path):
    """data.answer_field: solution — the table shows the row's solution, not a missing 'answer'."""
    prompts = scene_samples(1)
    prompts[0].fields = {"solution": "blue"}
    samples = [{"prompt": prompts[0].prompt, "completion": " blue", "reward": 1.0}]
    SampleTableHook(logger, every=1, rows=1, answer_field="solution").observe(StepReport(1, {}, samples, prompts=prompts))
    references = parse(download(logger, "samples/step_00001.html", tmp_path)).rows[0]["text"][4]
    assert "answer: blue" in references
