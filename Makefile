# Targets bootstrap the virtual environment at .venv on first use (scripts/setup_env.sh);
# the stamp file makes a second `make test` skip the install entirely.
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.polyrl-installed

.PHONY: setup lint typecheck test test-other-matmul test-fast test-gpu test-serial demo bench docs docs-serve clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh
	@touch $(STAMP)

# Style, import layers and types; CI (.ci/run) runs `make lint typecheck` before `make test`.
# ruff is the linter and the formatter ([tool.ruff] in pyproject.toml: style is the tool's job, not
# a reviewer's); lint-imports checks the layers of .importlinter (tests/test_layers.py does too);
# mypy checks what [tool.mypy] lists, strictly. `ruff format <files>` fixes what format --check finds.
LINT_PATHS := polyrl tests bench scripts experiments docs/hooks

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Three workers on the 2-core CI machine (a third fills the time the others wait on subprocesses,
# servers and start-up); tests of one file stay on one worker so
# module fixtures (a vLLM engine, a built policy) are built once, and Ray tests share one worker.
PYTEST_WORKERS ?= 3
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadgroup

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_PARALLEL) --durations=25
	$(MAKE) test-other-matmul

# Training tests that build the learner from a config (forward, backward, critic, resume, the
# loop, async episodes) on the CPU matmul path train.cpu_matmul: auto does NOT take on this
# machine (POLYRL_CPU_MATMUL, polyrl/runtime/cpu_matmul.py): auto routes the learner's Linear
# layers through oneDNN on every CPU that is not Intel's and keeps torch's BLAS on Intel, so the
# suite runs one path and this target the other, whichever machine CI lands on.
MATMUL_TESTS := tests/runtime/test_cpu_matmul.py tests/runtime/test_cpu_matmul_copies.py \
	tests/training/test_learner_batches.py tests/training/test_learner_numerics.py tests/envs/test_episode_async.py
OTHER_MATMUL = $(shell POLYRL_CPU_MATMUL= $(PY) -c "import torch; from polyrl.runtime.cpu_matmul import resolve_cpu_matmul as r; print('torch' if r('auto', device=torch.device('cpu'), compute_dtype=torch.float32) == 'onednn' else 'onednn')")

test-other-matmul: $(STAMP)
	@echo "the learner's other CPU matmul path: POLYRL_CPU_MATMUL=$(OTHER_MATMUL)"
	POLYRL_CPU_MATMUL=$(OTHER_MATMUL) $(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not vllm and not ray and not mlflow_server" $(MATMUL_TESTS)

# The quick tier: every package's unit tests, without what is slow or starts a real vLLM engine,
# Ray cluster or MLflow server (those run in make test, which CI runs).
FAST_TIER := not slow and not vllm and not ray and not mlflow_server

test-fast: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_PARALLEL) -m "$(FAST_TIER)"

# The CUDA paths (tests/gpu, marker gpu): on a machine whose torch sees a GPU; skipped elsewhere,
# so make test and make test-fast pass over them.
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests/gpu

# One process, in file order: for a debugger, or to time a single test without a neighbour.
test-serial: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/polyrl run experiments/grpo_vs_drgrpo.yaml
	$(VENV)/bin/polyrl compare grpo_vs_drgrpo --out reports/grpo_vs_drgrpo

bench: $(STAMP)
	$(PY) bench/bench_rewards.py
	$(PY) bench/bench_generation.py
	$(PY) bench/bench_step.py

# The documentation site (mkdocs.yml, docs/): reference pages are generated from the code at build
# time; --strict makes every warning (a broken link, a missing page) an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8000

clean-venv:
	rm -rf $(VENV)
