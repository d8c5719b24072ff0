"""The one error type the converter raises for bad input; the CLI prints it on one line and exits 2."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A user-facing problem with a checkpoint: the message says what, where and what to do.

    A ``ValueError``, so callers that report bad input (config errors, model resolution) catch it too."""
