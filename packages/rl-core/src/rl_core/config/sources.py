"""Where each config key came from (file and line, or a command-line override)."""

from __future__ import annotations

import os
from dataclasses import dataclass

KeyPath = tuple[str | int, ...]
"""A key's path from the top of the config: ``("policy", "optimizer", "lr")``; ints index lists."""


def dotted(path: KeyPath) -> str:
    """``("a", "b", 0, "c")`` -> ``"a.b.0.c"``."""
    return ".".join(str(part) for part in path)


def display_path(path: str) -> str:
    """A file path as the user would like to read it: relative to the working directory when inside it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if relative.startswith("..") else relative


@dataclass(frozen=True)
class Source:
    """The origin of one key: a YAML file (with a 1-based line when known) or a CLI override."""

    file: str | None = None
    line: int | None = None
    override: str | None = None
    """The override text as typed, e.g. ``grpo.max_steps=5``."""

    def __str__(self) -> str:
        if self.override is not None:
            return f"command-line override '{self.override}'"
        if self.file is None:
            return "<config>"
        name = display_path(self.file)
        return f"{name}:{self.line}" if self.line is not None else name


class SourceMap:
    """Maps key paths to the Source that set them; looks up the nearest known ancestor."""

    def __init__(self, root: Source | None = None):
        self.root = root or Source()
        self._sources: dict[KeyPath, Source] = {}
        self.kind_switches: dict[KeyPath, dict[KeyPath, Source]] = {}
        """Sections whose ``kind`` a later layer changed -> the keys they held then, with their sources."""

    def record_kind_switch(self, section: KeyPath, node: dict, new_kind: object) -> None:
        """Note the keys of ``section`` (``node``) before a later layer sets its ``kind`` to ``new_kind``."""
        if isinstance(node, dict) and "kind" in node and node["kind"] != new_kind:
            section = tuple(section)
            self.kind_switches[section] = {(*section, key): self.lookup((*section, key)) for key in node if key != "kind"}

    def set(self, path: KeyPath, source: Source) -> None:
        self._sources[tuple(path)] = source

    def drop_subtree(self, path: KeyPath) -> None:
        """Forget ``path`` and everything below it (its value was replaced as a whole)."""
        n = len(path)
        for key in [k for k in self._sources if k[:n] == tuple(path)]:
            del self._sources[key]

    def update(self, other: SourceMap) -> None:
        self._sources.update(other._sources)
        self.kind_switches.update(other.kind_switches)

    def subtree(self, path: KeyPath) -> dict[KeyPath, Source]:
        n = len(path)
        return {k: v for k, v in self._sources.items() if k[:n] == tuple(path)}

    def get(self, path: KeyPath) -> Source | None:
        return self._sources.get(tuple(path))

    def lookup(self, path: KeyPath) -> Source:
        """The source of ``path``, else of its nearest ancestor, else the root file."""
        path = tuple(path)
        while path:
            if path in self._sources:
                return self._sources[path]
            path = path[:-1]
        return self.root

    def __contains__(self, path: KeyPath) -> bool:
        return tuple(path) in self._sources

    def __len__(self) -> int:
        return len(self._sources)
