"""The base class of every config section: unknown keys are errors, never silently ignored."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """A config section. Subclasses declare fields with a docstring under each one.

    Floats must be finite: ``lr: inf`` or ``nan`` is a config error, not a crash steps later. A field
    that means infinity on purpose opts in with ``Field(allow_inf_nan=True)``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True,
                              allow_inf_nan=False)


MAX_SEED = 2**32 - 1
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
"""A random seed: 0 to 2**32 - 1, the range NumPy's generators accept (torch takes 64 bits, Python any
int); seeds derived from it per step and prompt stay within torch's 64 bits."""
