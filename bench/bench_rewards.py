"""Throughput of the built-in reward modules: samples/s on 1,024 samples.

    python bench/bench_rewards.py [--samples 1024] [--repeats 3]

ppl_fluency scores with the tiny 0.3m Qwen3-architecture model (character tokenizer) built into a temporary
directory. Each module is set up, warmed up on 16 samples, then timed over the full batch;
the best of ``--repeats`` runs is reported.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from polyrl.rewards import RewardBatch, load_reward_class  # noqa: E402

WORDS = "a man dog horse rides riding on the beach near sea two dogs play in snow red bus street city plate of food".split()
CJK = "我喜欢吃苹果今天天气很好他们在北京上海猫狗"


def make_batch(n: int, seed: int = 0) -> tuple[RewardBatch, list[list[str]]]:
    rng = random.Random(seed)
    prompts, completions, references, fields = [], [], [], []
    corpus = []
    for i in range(n):
        if i % 4 == 3:  # a quarter Chinese
            refs = ["".join(rng.choices(CJK, k=rng.randint(6, 14))) for _ in range(3)]
            completion = "".join(rng.choices(CJK, k=rng.randint(4, 16)))
        else:
            refs = [" ".join(rng.choices(WORDS, k=rng.randint(6, 12))) for _ in range(3)]
            completion = " ".join(rng.choices(WORDS, k=rng.randint(4, 40)))
        answer = str(rng.randint(0, 999))
        if i % 2:
            completion += f" so the answer is #### {answer if rng.random() < 0.5 else rng.randint(0, 999)}"
        prompts.append(f"Question {i}: describe the picture and compute {answer}.")
        completions.append(completion)
        references.append(refs)
        fields.append({"answer": answer})
        corpus.append(refs)
    return RewardBatch(prompts=prompts, completions=completions, references=references, fields=fields), corpus


def time_module(module, batch: RewardBatch, repeats: int) -> float:
    module.setup()
    module.score(batch.subset(range(16)))  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        scores = module.score(batch)
        best = min(best, time.perf_counter() - start)
        assert len(scores) == len(batch)
    return len(batch) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from polyrl.policies.text import build_random_text_model_dir

    batch, corpus = make_batch(args.samples)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_random_text_model_dir(Path(tmp) / "scorer", "0.3m"))
        cases = [
            ("rouge_l", {}, ""),
            ("cider", {"corpus_references": corpus}, "df from the 1,024 reference sets"),
            ("length", {}, "chars"),
            ("length", {"unit": "tokens", "tokenizer_path": model_dir}, "tokens (char tokenizer)"),
            ("safety", {}, "default lexicons"),
            ("accuracy", {}, "extract auto"),
            ("format", {"pattern": r".*#### \d+"}, "fullmatch"),
            ("ppl_fluency", {"model_path": model_dir, "batch_size": 64, "device": "cpu"}, "0.3m Qwen3-arch, batch 64, fp32"),
        ]
        table = Table(title=f"reward modules on {len(batch)} samples (torch threads {torch.get_num_threads()})")
        for column in ("module", "setting", "samples/s"):
            table.add_column(column, justify="right" if column == "samples/s" else "left")
        for name, params, note in cases:
            rate = time_module(load_reward_class(name)(**params), batch, args.repeats)
            table.add_row(name, note, f"{rate:,.0f}")
        Console().print(table)


if __name__ == "__main__":
    main()
