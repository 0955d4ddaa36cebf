"""Integrators, one module per method family."""

from ._base import AbstractIntegrator, AbstractState
from ._table import method_table, presets
from .galerkin import GalerkinState, GalerkinVI
from .holonomic import HolonomicState, HolonomicVPRK
from .vprk import VPRK, VPRKState

__all__ = ["AbstractIntegrator", "AbstractState", "VPRK", "VPRKState", "HolonomicVPRK", "HolonomicState", "GalerkinVI", "GalerkinState", "method_table", "presets"]
