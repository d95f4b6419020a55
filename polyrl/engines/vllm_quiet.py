"""vLLM's weight-reload warnings: the ones that mean nothing is dropped, the others are escalated.

After ``model_runner.reload_weights`` vLLM's layer-wise reloader warns "<Layer>: Failed to load
weights" for every layer that holds loadable tensors none of which came in the iterator. A
rotary embedding's only tensor is ``cos_sin_cache``, a buffer computed from the config (rope
theta, positions) that no Hugging Face state dict carries; vLLM puts its own tensor back
(``_place_kernel_tensors``), so the cache is right and the warning fires at every sync for
nothing (115 times in one demo). Not sending it cannot avoid it: the model's ``load_weights``
has no name for that buffer. The same holds for any layer whose only own tensors are
non-persistent buffers computed at start-up (Gemma 3's embedding ``normalizer``), and for a
*tied* output head (``ParallelLMHead`` sharing the embedding): no tensor is sent under its name,
and the engine re-runs its post-load processing after every reload. The engine names those
layers for the duration of a reload (:func:`expected_misses`). Any *other* layer in that message kept stale weights — the sampler
then differs from the learner — so it is re-emitted on the ``polyrl.weight_sync`` logger, which
the CLI shows on the terminal, and counted in :data:`WEIGHT_SYNC_FAILURES` (the log-prob gap
health check measures its effect).
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
FAILED_LOAD_MESSAGE = "%s: Failed to load weights"
WEIGHT_SYNC_FAILURES: Counter[str] = Counter()

_escalation = logging.getLogger("polyrl.weight_sync")
# Layer class names that the reload in progress is known not to load by name (see above).
_expected_misses: frozenset[str] = frozenset()


@contextmanager
def expected_misses(layer_names: set[str]) -> Iterator[None]:
    """During one reload: these layers' "Failed to load weights" records are dropped, not escalated."""
    global _expected_misses
    before, _expected_misses = _expected_misses, frozenset(layer_names)
    try:
        yield
    finally:
        _expected_misses = before


def _layer_of(record: logging.LogRecord) -> str | None:
    if record.msg != FAILED_LOAD_MESSAGE or not record.args:
        return None
    args = record.args if isinstance(record.args, tuple) else (record.args,)
    return str(args[0])


class WeightSyncFilter(logging.Filter):
    """Drops the rotary-cache record; turns any other failed layer into a polyrl warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        layer = _layer_of(record)
        if layer is None:
            return True
        if "RotaryEmbedding" in layer or layer in _expected_misses:
            return False
        WEIGHT_SYNC_FAILURES[layer] += 1
        _escalation.warning(
            "weight sync left vLLM layer %s with its previous weights (none of its tensors were sent); "
            "the sampler no longer matches the learner",
            layer,
        )
        return False


_FILTER = WeightSyncFilter()


def install_weight_sync_filter() -> None:
    """Idempotent; the logger object exists before vLLM imports, and vLLM reuses it by name."""
    logger = logging.getLogger(RELOAD_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
