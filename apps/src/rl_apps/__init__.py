"""The `rl` command line: one subcommand per recipe, each a StrictModel config plus a run function."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

RECIPES_DIR = Path(__file__).parent / "recipes"
"""The recipe YAML files shipped inside the package."""


def recipe_path(name: str) -> str:
    """Path of a packaged recipe, e.g. ``recipe_path("grpo_arithmetic.yaml")`` (``.yaml`` optional)."""
    path = RECIPES_DIR / name
    if not path.suffix:
        path = path.with_suffix(".yaml")
    return str(path)


def list_recipes() -> list[str]:
    """File names of the packaged recipes, sorted."""
    return sorted(p.name for p in RECIPES_DIR.glob("*.yaml"))


__all__ = ["RECIPES_DIR", "__version__", "list_recipes", "recipe_path"]
