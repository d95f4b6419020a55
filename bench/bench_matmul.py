"""The machine's measured fp32 matmul peak: the learner's shapes and a large square, on 1 and 2
threads, in GFLOP/s (2·M·N·K per product), through both GEMM libraries torch can call on CPU:
its default BLAS (``torch.matmul``; MKL in PyPI's wheels) and oneDNN (the inner product that
``train.cpu_matmul: onednn`` and vLLM's CPU backend use). The peak is the best of the two: on
an AMD Zen 5 MKL runs its AVX2 kernels (~200 GFLOP/s on two threads) and oneDNN
its AVX-512 ones (~420–470), so a peak measured with ``torch.matmul`` alone understates the
machine by half there. On an Intel Xeon the two measured alike (~220–290 GFLOP/s, noisy).

Run: ``python bench/bench_matmul.py`` (``--size 3m`` for the 3m policy's shapes; ``--threads 1 2 4``).
``bench/bench_step.py`` imports :func:`measure_peaks` to put the update's achieved FLOP/s against it.

The learner's shapes are those of one micro-batch of the policy (``tokens`` rows = micro-batch
size × padded length): forward ``X @ Wᵀ`` for the attention and MLP projections, and the two
backward products (input grad ``dY @ W``, weight grad ``dYᵀ @ X``). On a loaded machine the
figures move with the load: interleave runs you compare and report ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polyrl.policies.text import MODEL_SIZES  # noqa: E402


def learner_shapes(size: str, tokens: int) -> list[tuple[str, int, int, int]]:
    """(name, M, K, N) of the products one layer of the ``size`` policy runs per micro-batch."""
    dims = MODEL_SIZES[size]
    hidden, inter = dims["hidden_size"], dims["intermediate_size"]
    kv = hidden * dims["num_key_value_heads"] // dims["num_attention_heads"]
    return [
        ("q/o proj fwd", tokens, hidden, hidden),
        ("k/v proj fwd", tokens, hidden, kv),
        ("gate/up fwd", tokens, hidden, inter),
        ("down fwd", tokens, inter, hidden),
        ("gate/up input grad", tokens, inter, hidden),
        ("gate/up weight grad", inter, tokens, hidden),
    ]


LIBRARIES = ("torch", "onednn")


def product(library: str, m: int, k: int, n: int, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """A zero-argument callable computing one ``m×k @ k×n`` product with ``library`` in ``dtype`` on ``device``."""
    a = torch.randn(m, k, dtype=dtype, device=device)
    if library == "torch":
        b, out = torch.randn(k, n, dtype=dtype, device=device), torch.empty(m, n, dtype=dtype, device=device)
        return lambda: torch.matmul(a, b, out=out)
    if torch.device(device).type != "cpu":
        raise ValueError(f"library {library!r} is a CPU library; on {device} only torch's matmul is timed")
    from polyrl.runtime.cpu_matmul import onednn_linear

    weight = torch.randn(n, k)  # a Linear layer's [out, in] weight: a @ weightᵀ
    return lambda: onednn_linear(a, weight)


def gflops(
    m: int,
    k: int,
    n: int,
    *,
    library: str = "torch",
    seconds: float = 0.25,
    repeats: int = 3,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> float:
    """Median GFLOP/s of ``a @ b`` with ``a: m×k``, ``b: k×n``, each repeat timed over ~``seconds``."""
    run = product(library, m, k, n, dtype, device)
    # A GPU runs products asynchronously: time up to the point where they are done, not queued.
    done = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    run()  # first call: allocation, kernel selection
    done()
    start = time.perf_counter()
    run()
    done()
    once = max(time.perf_counter() - start, 1e-6)
    iterations = max(1, int(seconds / once))
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            run()
        done()
        rates.append(2 * m * k * n * iterations / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def available_libraries(dtype: torch.dtype = torch.float32, device: str = "cpu") -> list[str]:
    """The GEMM libraries to time; for bf16 only torch's (its bf16 CPU matmul already runs in oneDNN), and
    off the CPU only torch's."""
    from polyrl.runtime.cpu_matmul import onednn_available

    on_cpu = torch.device(device).type == "cpu"
    return [library for library in LIBRARIES if library == "torch" or (on_cpu and onednn_available() and dtype == torch.float32)]


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` for the block, then set back."""
    previous = torch.get_num_threads()
    torch._C.set_num_threads(threads)  # the real setter: vLLM may have replaced torch.set_num_threads
    try:
        yield
    finally:
        torch._C.set_num_threads(previous)


def measure(
    size: str,
    tokens: int,
    threads: int,
    square: int = 2048,
    library: str = "torch",
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> dict[str, float]:
    with torch_threads(threads):
        rows = {
            name: gflops(m, k, n, library=library, dtype=dtype, device=device) for name, m, k, n in learner_shapes(size, tokens)
        }
        rows[f"square {square}"] = gflops(square, square, square, library=library, seconds=0.5, dtype=dtype, device=device)
        return rows


def measure_peaks(
    size: str = "30m", tokens: int = 16 * 53, threads: int | None = None, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> dict[str, float]:
    """Per GEMM library, the best GFLOP/s of the learner's shapes and a large square at ``threads``
    on ``device`` (the learner's: an update on a GPU is put against that GPU's peak, not the CPU's)."""
    return {
        library: max(
            measure(size, tokens, threads or torch.get_num_threads(), library=library, dtype=dtype, device=device).values()
        )
        for library in available_libraries(dtype, device)
    }


def measure_peak(size: str = "30m", tokens: int = 16 * 53, threads: int | None = None) -> float:
    """The machine's fp32 matmul peak: the best of :func:`measure_peaks` over the libraries."""
    return max(measure_peaks(size, tokens, threads).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="30m", choices=sorted(MODEL_SIZES))
    parser.add_argument(
        "--tokens", type=int, default=16 * 53, help="Rows of a micro-batch (default 16 sequences × 53 positions)."
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--square", type=int, default=2048)
    args = parser.parse_args()
    print(
        f"# fp32 matmul GFLOP/s, torch {torch.__version__}, {args.size} learner shapes at {args.tokens} rows, "
        f"square {args.square}"
    )
    columns = [(library, t) for library in available_libraries() for t in args.threads]
    results = {column: measure(args.size, args.tokens, column[1], args.square, library=column[0]) for column in columns}
    names = list(next(iter(results.values())))
    print("\n| product | " + " | ".join(f"{library}, {t} thread{'s' if t > 1 else ''}" for library, t in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{results[column][name]:.1f}" for column in columns) + " |")
    print("| **peak** | " + " | ".join(f"**{max(results[column].values()):.1f}**" for column in columns) + " |")
    for t in args.threads:
        best = {library: max(results[(library, t)].values()) for library in available_libraries()}
        print(
            f"\n{t} thread{'s' if t > 1 else ''}: machine peak {max(best.values()):.1f} GFLOP/s ("
            + ", ".join(f"{library} {value:.1f}" for library, value in best.items())
            + ")"
        )


if __name__ == "__main__":
    main()
