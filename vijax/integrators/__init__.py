"""Integrators, one module per method family."""

from ._base import (AbstractIntegrator, AbstractState, IncompatibleSystemError, accepting,
                    registry)
from ._table import method_table, presets
from .vprk import VPRK, VPRKState  # noqa: I001 - import order is the method-table order
from .holonomic import HolonomicState, HolonomicVPRK
from .galerkin import GalerkinState, GalerkinVI
from .dg import CGVI, DGVI, CGState, ConstrainedDGState, DGState

__all__ = ["AbstractIntegrator", "AbstractState", "IncompatibleSystemError", "registry", "accepting", "VPRK", "VPRKState", "HolonomicVPRK", "HolonomicState", "GalerkinVI", "GalerkinState",
           "DGVI", "DGState", "ConstrainedDGState", "CGVI", "CGState", "method_table", "presets"]
