"""docs/DESIGN.md stays true of the tree: every repository path it names exists, and
every package it names is importable."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("store", "timer", "pop", "tiered", "spark", "chronomq", "tests", "bench", "docs")


def _named_paths(text: str) -> list[str]:
    """Backticked words that look like repository paths (``store/commitlog.py``)."""
    out = []
    for word in re.findall(r"`([^`\s]+)`", text):
        if word.split("/")[0] in PACKAGES and "<" not in word and "..." not in word:
            out.append(word.rstrip("/"))
    return out


def test_every_path_the_design_names_exists() -> None:
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    named = _named_paths(text)
    assert len(named) > 20  # the parser found the doc's paths
    assert [p for p in named if not (ROOT / p).exists()] == []


def test_every_package_the_design_names_imports() -> None:
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    modules = {p[:-3].replace("/", ".") for p in _named_paths(text)
               if p.endswith(".py") and not p.startswith(("tests/", "bench/"))}
    for name in sorted(modules):
        importlib.import_module(name)
