"""Integrators, one module per method family."""

from ._base import AbstractIntegrator, AbstractState
from ._table import method_table, presets
from .dg import CGVI, DGVI, CGState, ConstrainedDGState, DGState
from .galerkin import GalerkinState, GalerkinVI
from .holonomic import HolonomicState, HolonomicVPRK
from .vprk import VPRK, VPRKState

__all__ = ["AbstractIntegrator", "AbstractState", "VPRK", "VPRKState", "HolonomicVPRK", "HolonomicState", "GalerkinVI", "GalerkinState",
           "DGVI", "DGState", "ConstrainedDGState", "CGVI", "CGState", "method_table", "presets"]
