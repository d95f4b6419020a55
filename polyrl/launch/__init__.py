"""Running experiments: ``polyrl run`` (arms, seeds, rounds until resolved), resume, locks,
interrupts, logs, pre-flight checks, and ``polyrl submit`` on Ray."""
