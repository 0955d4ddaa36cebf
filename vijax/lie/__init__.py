"""Lie groups as configuration spaces: the interface and its members (``R^n`` for now)."""

from ._base import AbstractLieGroup
from ._rn import Rn

__all__ = ["AbstractLieGroup", "Rn"]
