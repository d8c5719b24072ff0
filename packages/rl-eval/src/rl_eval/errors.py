"""The error rl-eval raises for bad input (the CLI prints it on one line and exits 2)."""


class EvalError(Exception):
    """What went wrong, where (file, row, key) and what to do."""
