"""The ``polyrl`` command line: one module per command or command group; user-facing errors become
one message and a non-zero exit."""
