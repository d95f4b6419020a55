# Targets bootstrap the virtual environment at .venv on first use (scripts/setup_env.sh);
# the stamp file makes a second `make test` skip the install entirely.
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.polyrl-installed

.PHONY: setup test test-fast demo bench clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(VENV)/bin/polyrl run experiments/grpo_vs_drgrpo.yaml
	$(VENV)/bin/polyrl compare grpo_vs_drgrpo --out reports/grpo_vs_drgrpo

bench: $(STAMP)
	$(PY) bench/bench_rewards.py
	$(PY) bench/bench_generation.py
	$(PY) bench/bench_step.py

clean-venv:
	rm -rf $(VENV)
