"""docs/config_reference.md is generated from the config classes and is current: regenerate and compare."""

from __future__ import annotations

import importlib
from pathlib import Path

from rl_apps.commands import COMMANDS
from rl_apps.reference import render_reference

REFERENCE = Path(__file__).parents[2] / "docs" / "config_reference.md"


def test_the_checked_in_reference_is_current():
    assert REFERENCE.read_text() == render_reference(), (
        "docs/config_reference.md is out of date: run python scripts/gen_config_reference.py")


def test_every_command_and_key_is_in_it():
    text = REFERENCE.read_text()
    for name, spec in COMMANDS.items():
        section = text.split(f"\n## rl {name}\n")[1].split("\n## ")[0]
        for key in importlib.import_module(spec.module).CONFIG_CLASS.model_fields:
            assert f"\n| `{key}` |" in section, (name, key)
    assert "\n### TrainBackendConfig\n" in text and "| `lr` | float | `1e-05` | Peak learning rate" in text
    # A command's own default for a section is shown where it differs from the section's.
    assert 'section; differs: {"task": "reward_model"}' in text.split("\n## rl rm\n")[1].split("\n## ")[0]
