"""Synthetic scenes: coloured shapes on a 2×2 grid, drawn with PIL into 32×32 RGB images.

A scene holds one to three objects, each a (colour, shape) in a distinct cell of the grid.
From a scene come

* several templated reference captions (``captions``), for the captioning task; and
* VQA questions with one verifiable answer each (``questions``): colour ("What color is the
  circle?"), shape ("What shape is at top left?"), position ("Where is the red square?") and
  count ("How many shapes are there?"). A question is asked only when its answer is unique
  (no "What color is the circle?" with two circles).

Everything is a pure function of an integer seed (``random.Random``), so the shipped data can be
regenerated bit for bit (``python -m polyrl.tasks.scenes --write``, VQA and caption files) and a test checks the
shipped files against the generator.

Splits are disjoint by content, not by seed: a scene's split is a hash of what it shows
(:func:`scene_split`; one in ``TEST_BUCKETS`` of the 7,824 possible scenes, per number of
objects, is a test scene), so
no test image, caption set or VQA row is also a train one. (Splitting by seed alone let 28 of
the 100 test scenes repeat a train scene exactly: there are only 48 one-object scenes.)

Storage: ``polyrl/tasks/data/scenes/{train,test}.parquet``, one VQA row per question with the
columns ``prompt`` (``"<image>Q: ...\\nA:"``), ``answer``, ``kind``, ``scene_id``,
``references`` (the scene's captions) and ``images`` (a list of one image, a ``datasets``
``Image`` feature stored as PNG bytes). ``datasets.load_dataset("parquet", ...)`` decodes it to
PIL images; 32×32 PNGs are ~100 bytes each, so the files stay a few hundred KB.

Captioning is a second built-in source over the same scenes, ``scenes_captions``: one row per
scene (not per question), so a scene is not weighted by how many questions it has and the
CIDEr document frequencies count each image once. Its files are
``polyrl/tasks/data/scenes/captions_{train,test}.parquet`` (same scene seeds per split as the
VQA files) with the columns ``prompt`` (``"<image>Caption:"``), ``scene_id``, ``references``
(the scene's four captions) and ``images``; ``--write`` regenerates them too, and
``CAPTIONS`` gives the prompt loader their splits and paths. A separate source rather than a
selector on ``scenes`` keeps ``data.source`` the one setting that names a task's rows.
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

IMAGE_SIZE = 32
GRID = 2
CELL = IMAGE_SIZE // GRID
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 180, 40),
    "blue": (40, 60, 220),
    "yellow": (230, 210, 20),
}
SHAPES = ("square", "circle", "triangle")
POSITIONS = ("top left", "top right", "bottom left", "bottom right")  # row-major cells
NUMBER_WORDS = {1: "one", 2: "two", 3: "three"}
MAX_OBJECTS = 3
QUESTION_KINDS = ("color", "shape", "position", "count")
IMAGE_PLACEHOLDER = "<image>"
SPLITS = ("train", "test")
# Scenes per split, and the first seed each split draws from (distinct ranges keep scene_id
# unique across splits). Disjoint seeds are not disjoint content: there are only 48 one-object
# scenes, so a split is decided by the scene's content (``scene_split``), not by its seed.
SPLIT_SIZES = {"train": 400, "test": 100}
SPLIT_FIRST_SEED = {"train": 0, "test": 100_000}
# One in TEST_BUCKETS of all possible scenes (7,824: 48 one-object, 864 two-, 6,912
# three-object) belongs to the test split, stratified by the number of objects.
TEST_BUCKETS = 5
BACKGROUND = (245, 245, 245)


@dataclass(frozen=True)
class SceneObject:
    color: str
    shape: str
    cell: int  # index into POSITIONS

    @property
    def position(self) -> str:
        return POSITIONS[self.cell]


@dataclass(frozen=True)
class Scene:
    seed: int
    objects: tuple[SceneObject, ...]


def make_scene(seed: int) -> Scene:
    """A scene of 1–3 objects in distinct cells, a pure function of ``seed``."""
    rng = random.Random(f"polyrl-scene-{seed}")
    count = rng.randint(1, MAX_OBJECTS)
    cells = sorted(rng.sample(range(GRID * GRID), count))
    objects = tuple(SceneObject(rng.choice(list(COLORS)), rng.choice(SHAPES), cell) for cell in cells)
    return Scene(seed=seed, objects=objects)


def render(scene: Scene) -> Image.Image:
    """The scene as a 32×32 RGB image (no anti-aliasing: PIL draws the same pixels everywhere)."""
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)
    draw = ImageDraw.Draw(image)
    margin = 2
    for obj in scene.objects:
        row, col = divmod(obj.cell, GRID)
        left, top = col * CELL + margin, row * CELL + margin
        right, bottom = (col + 1) * CELL - margin - 1, (row + 1) * CELL - margin - 1
        fill = COLORS[obj.color]
        if obj.shape == "square":
            draw.rectangle((left, top, right, bottom), fill=fill)
        elif obj.shape == "circle":
            draw.ellipse((left, top, right, bottom), fill=fill)
        else:
            draw.polygon([((left + right) // 2, top), (right, bottom), (left, bottom)], fill=fill)
    return image


def _describe(obj: SceneObject) -> str:
    return f"a {obj.color} {obj.shape} at {obj.position}"


def captions(scene: Scene) -> list[str]:
    """Templated reference captions; content words (colours, shapes, positions) carry meaning."""
    parts = [_describe(o) for o in scene.objects]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    n = len(scene.objects)
    noun = "shape" if n == 1 else "shapes"
    return [
        listed,
        f"there is {listed}",
        f"{NUMBER_WORDS[n]} {noun}: " + ", ".join(f"{o.color} {o.shape} {o.position}" for o in scene.objects),
        "the image shows " + " and ".join(f"a {o.color} {o.shape}" for o in scene.objects),
    ]


def questions(scene: Scene) -> list[dict[str, str]]:
    """Questions with a unique, verifiable answer: ``{"kind", "question", "answer"}``."""
    out: list[dict[str, str]] = []
    shapes = [o.shape for o in scene.objects]
    for obj in scene.objects:
        if shapes.count(obj.shape) == 1:
            out.append({"kind": "color", "question": f"What color is the {obj.shape}?", "answer": obj.color})
        out.append({"kind": "shape", "question": f"What shape is at {obj.position}?", "answer": obj.shape})
        same = [o for o in scene.objects if (o.color, o.shape) == (obj.color, obj.shape)]
        if len(same) == 1:
            out.append({"kind": "position", "question": f"Where is the {obj.color} {obj.shape}?", "answer": obj.position})
    out.append({"kind": "count", "question": "How many shapes are there?", "answer": str(len(scene.objects))})
    return out


def vqa_prompt(question: str) -> str:
    return f"{IMAGE_PLACEHOLDER}Q: {question}\nA:"


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def scene_content_key(scene: Scene) -> str:
    """What a scene shows, independent of its seed: its objects (colour, shape, cell) in cell
    order. Two scenes with the same key render the same image and have the same captions and
    questions."""
    return ";".join(f"{o.color}-{o.shape}-{o.cell}" for o in sorted(scene.objects, key=lambda o: o.cell))


def _content_hash(key: str) -> bytes:
    return hashlib.sha256(f"polyrl-scene-content|{key}".encode()).digest()


@functools.lru_cache(maxsize=1)
def test_scene_keys() -> frozenset[str]:
    """The content keys of the test split: per number of objects, the ``1/TEST_BUCKETS`` of all
    possible scenes with the smallest content hash (stratified, so the test split has as many
    one-, two- and three-object scenes as the generator draws; an unstratified hash put 14 of
    the 48 one-object scenes, not ~10, in test, and the test split became half one-object)."""
    keys: set[str] = set()
    objects = [(color, shape) for color in COLORS for shape in SHAPES]
    for count in range(1, MAX_OBJECTS + 1):
        contents = [
            ";".join(f"{c}-{s}-{cell}" for (c, s), cell in zip(chosen, cells))
            for cells in itertools.combinations(range(GRID * GRID), count)
            for chosen in itertools.product(objects, repeat=count)
        ]
        ranked = sorted(contents, key=_content_hash)
        keys.update(ranked[: round(len(ranked) / TEST_BUCKETS)])
    return frozenset(keys)


def scene_split(scene: Scene) -> str:
    """The split of a scene's content (as ``arithmetic`` and ``drawing`` split on their prompts):
    a test image is never a train image, whatever the seeds."""
    return "test" if scene_content_key(scene) in test_scene_keys() else "train"


def _split_scenes(split: str) -> list[Scene]:
    """The first ``SPLIT_SIZES[split]`` scenes from ``SPLIT_FIRST_SEED[split]`` on whose content
    belongs to ``split``; each keeps its seed as ``scene_id``."""
    if split not in SPLITS:
        raise ValueError(f"unknown scenes split {split!r}; allowed: {list(SPLITS)}")
    found: list[Scene] = []
    seed = SPLIT_FIRST_SEED[split]
    while len(found) < SPLIT_SIZES[split]:
        scene = make_scene(seed)
        if scene_split(scene) == split:
            found.append(scene)
        seed += 1
    return found


def split_rows(split: str) -> list[dict[str, Any]]:
    """The VQA rows of ``split`` (one per question), images as ``{"bytes", "path"}`` dicts."""
    rows = []
    for scene in _split_scenes(split):
        shared = {"scene_id": scene.seed, "references": captions(scene), "images": [_image_cell(scene)]}
        rows += [
            {"prompt": vqa_prompt(q["question"]), "answer": q["answer"], "kind": q["kind"], **shared} for q in questions(scene)
        ]
    return rows


def _image_cell(scene: Scene) -> dict[str, Any]:
    return {"bytes": png_bytes(render(scene)), "path": None}


def data_dir() -> Path:
    return Path(__file__).resolve().parent / "data" / "scenes"


def shipped_path(split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown scenes split {split!r}; allowed: {list(SPLITS)}")
    return data_dir() / f"{split}.parquet"


def _files_version(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def shipped_data_version() -> str:
    """A hash of the shipped files (part of the VLM warm-up cache key)."""
    return _files_version([shipped_path(split) for split in SPLITS])


def _write_parquet(rows: list[dict[str, Any]], text_columns: tuple[str, ...], path: Path) -> Path:
    """``rows`` as parquet: string ``text_columns``, then ``scene_id``, ``references`` and an
    ``images`` column of ``List(Image())``."""
    import datasets

    features = datasets.Features(
        {
            **{name: datasets.Value("string") for name in text_columns},
            "scene_id": datasets.Value("int64"),
            "references": datasets.List(datasets.Value("string")),
            "images": datasets.List(datasets.Image()),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))
    return path


def write_split(split: str, directory: Path | None = None) -> Path:
    """Write ``split``'s VQA rows as parquet."""
    return _write_parquet(split_rows(split), ("prompt", "answer", "kind"), (directory or data_dir()) / f"{split}.parquet")


# -- captioning ------------------------------------------------------------------------------

CAPTION_PROMPT = f"{IMAGE_PLACEHOLDER}Caption:"


def caption_rows(split: str) -> list[dict[str, Any]]:
    """The captioning rows of ``split``: one per scene, its captions as ``references``."""
    return [
        {"prompt": CAPTION_PROMPT, "scene_id": scene.seed, "references": captions(scene), "images": [_image_cell(scene)]}
        for scene in _split_scenes(split)
    ]


def caption_path(split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown scenes split {split!r}; allowed: {list(SPLITS)}")
    return data_dir() / f"captions_{split}.parquet"


def caption_data_version() -> str:
    """A hash of the shipped caption files (part of the caption warm-up cache key)."""
    return _files_version([caption_path(split) for split in SPLITS])


def write_caption_split(split: str, directory: Path | None = None) -> Path:
    """Write ``split``'s caption rows as parquet."""
    return _write_parquet(caption_rows(split), ("prompt",), (directory or data_dir()) / f"captions_{split}.parquet")


class _CaptionFiles:
    """The ``scenes_captions`` source as the prompt loader sees a task module."""

    SPLITS = SPLITS

    @staticmethod
    def shipped_path(split: str) -> Path:
        return caption_path(split)


CAPTIONS = _CaptionFiles()


def answer_matches(completion: str, answer: str) -> bool:
    """The VQA check: the completion's first line, trimmed and lower-cased, equals the answer."""
    lines = completion.strip().splitlines()
    return bool(lines) and lines[0].strip().rstrip(".").lower() == answer.strip().lower()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the shipped scenes parquet files.")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.write:
        for name in SPLITS:
            print(write_split(name))
            print(write_caption_split(name))
