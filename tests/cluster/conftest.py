"""Fixtures of the coordination tests: the tier tests' real providers of each kind."""

from __future__ import annotations

from tests.tiered.conftest import provider

__all__ = ["provider"]
