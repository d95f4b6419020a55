"""The evaluation harness: eval suites (YAML), the runner, reports and periodic evaluation.

    from polyrl.evals import SuiteRunner
    result = SuiteRunner("arithmetic", limit=32).run(engine)   # any RolloutEngine
    result.metrics["arithmetic/accuracy"], result.rows          # metrics and the per-sample table

``polyrl eval`` is :func:`polyrl.cli.evaluate.eval_command`; ``evaluate_models`` is the same
without the command line; ``make_periodic_evaluator`` serves ``eval.every`` inside training.
"""

from polyrl.evals.harness import EvalResult, SuiteRunner, run_suite
from polyrl.evals.passk import mean_pass_at_k, pass_at_k
from polyrl.evals.suite import DatasetSpec, EvalError, EvalSuite, GenerationSpec, MetricsSpec, load_suite, parse_suite

__all__ = [
    "DatasetSpec",
    "EvalError",
    "EvalResult",
    "EvalSuite",
    "GenerationSpec",
    "MetricsSpec",
    "SuiteRunner",
    "load_suite",
    "mean_pass_at_k",
    "parse_suite",
    "pass_at_k",
    "run_suite",
]
