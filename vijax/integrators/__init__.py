"""Integrators, one module per method family."""

from ._base import AbstractIntegrator, AbstractState
from ._table import method_table, presets
from .holonomic import HolonomicState, HolonomicVPRK
from .vprk import VPRK, VPRKState

__all__ = ["AbstractIntegrator", "AbstractState", "VPRK", "VPRKState", "HolonomicVPRK", "HolonomicState", "method_table", "presets"]
