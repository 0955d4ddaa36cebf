"""vijax: structure-preserving integrators for mechanical systems, in JAX.

vijax never changes global JAX configuration: enable float64 yourself with
``jax.config.update("jax_enable_x64", True)``; the library follows the dtype of its inputs.
"""

from . import constraints, diagnostics, lie, solvers, systems, tableaus
from .integrators import (CGVI, DGVI, AbstractIntegrator, AbstractState, IncompatibleSystemError, GalerkinState, GalerkinVI,
                          HolonomicState, HolonomicVPRK, VPRK,
                          VPRKState)
from .simulate import PrecisionWarning, Solution, StepStats, simulate
from .solvers import ConvergenceError
from .systems import HolonomicSystem, LagrangianSystem, MechanicalSystem

__version__ = "0.1.0"

__all__ = [
    "simulate", "Solution", "StepStats", "PrecisionWarning", "LagrangianSystem", "MechanicalSystem", "HolonomicSystem",
    "IncompatibleSystemError",
    "AbstractIntegrator", "AbstractState", "VPRK", "VPRKState", "HolonomicVPRK", "HolonomicState", "GalerkinVI",
    "GalerkinState", "DGVI", "CGVI", "ConvergenceError",
    "tableaus", "lie", "constraints", "solvers", "systems", "diagnostics",
]
