"""Integrators, one module per method family."""

from ._base import AbstractIntegrator, AbstractState
from .vprk import VPRK, VPRKState

__all__ = ["AbstractIntegrator", "AbstractState", "VPRK", "VPRKState"]
