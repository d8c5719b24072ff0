"""Config errors that say what is wrong, where it came from, and what to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a config: where it came from, the dotted key, and what is wrong."""

    where: str
    """``file.yaml:12``, ``command-line override 'a.b=3'`` or a file name without a line."""
    key: str
    """Dotted key, e.g. ``policy.optimizer.lr``; empty for problems with a whole file."""
    message: str
    """What is wrong and what was expected."""

    def __str__(self) -> str:
        if self.key:
            return f"{self.where}: {self.key}: {self.message}"
        return f"{self.where}: {self.message}"


class ConfigError(ValueError):
    """A config could not be loaded or validated. ``problems`` lists every problem found."""

    def __init__(self, problems: list[ConfigProblem] | ConfigProblem | str):
        if isinstance(problems, str):
            problems = [ConfigProblem(where="config", key="", message=problems)]
        elif isinstance(problems, ConfigProblem):
            problems = [problems]
        self.problems: list[ConfigProblem] = list(problems)
        super().__init__(self._format())

    def __reduce__(self):
        # Rebuilt from its problems (not its message) when it crosses a process boundary (a Ray worker).
        return _rebuild, (type(self), self.problems)

    def _format(self) -> str:
        if len(self.problems) == 1:
            return f"Invalid config: {self.problems[0]}"
        lines = [f"Invalid config ({len(self.problems)} problems):"]
        lines += [f"  - {problem}" for problem in self.problems]
        return "\n".join(lines)


def _rebuild(cls: type[ConfigError], problems: list[ConfigProblem]) -> ConfigError:
    error = cls.__new__(cls)
    ConfigError.__init__(error, problems)
    return error
