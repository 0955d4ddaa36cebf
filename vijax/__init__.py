"""vijax: structure-preserving integrators for mechanical systems, in JAX.

vijax never changes global JAX configuration: enable float64 yourself with
``jax.config.update("jax_enable_x64", True)``; the library follows the dtype of its inputs.

Where things live: systems in :mod:`vijax.systems`, integrators in :mod:`vijax.integrators`
(one module or subpackage per family), tableaus in :mod:`vijax.tableaus`, quadrature rules and
polynomial bases in :mod:`vijax.quadrature`, dense output in :mod:`vijax.interpolation`, root
solvers in :mod:`vijax.solvers`, holonomic-constraint tools in :mod:`vijax.constraints`,
structure checks and order estimates in :mod:`vijax.diagnostics`, batched ensembles in
:func:`vijax.simulate_ensemble`.
"""

from . import (constraints, control, diagnostics, integrators, interpolation, lie, quadrature, solvers,
               systems, tableaus)
from .integrators import (CGVI, DGVI, VPRK, AbstractDenseIntegrator, AbstractIntegrator,
                          AbstractState, GalerkinState, GalerkinVI, HolonomicState, HolonomicVPRK,
                          IncompatibleSystemError, NonholonomicState, NonholonomicVPRK,
                          VPRKState)
from .integrators import (VCG, VRKMK, DiscreteGradient, DiscreteLagrangeDAlembert,
                          GroupPRKState, GroupVPRK, PRKState, TStarState)
from .interpolation import DenseOutput
from .simulate import PrecisionWarning, Solution, StepStats, simulate
from .ensemble import simulate_ensemble
from ._xla import compiler_options
from .solvers import ConvergenceError
from .systems import (ForcedSystem, HolonomicSystem, LagrangianSystem, LieGroupSystem,
                      MechanicalSystem, NonholonomicSystem, PointMassSystem,
                      TimeDependentSystem)

__version__ = "0.1.0"

__all__ = [
    "simulate", "simulate_ensemble", "compiler_options", "Solution", "StepStats", "DenseOutput",
    "PrecisionWarning",
    "LagrangianSystem", "MechanicalSystem", "PointMassSystem", "HolonomicSystem",
    "NonholonomicSystem", "ForcedSystem", "TimeDependentSystem", "LieGroupSystem",
    "AbstractIntegrator", "AbstractDenseIntegrator", "AbstractState", "IncompatibleSystemError",
    "VPRK", "VPRKState", "HolonomicVPRK", "HolonomicState", "NonholonomicVPRK",
    "NonholonomicState", "GalerkinVI", "GalerkinState",
    "DGVI", "CGVI", "ConvergenceError", "DiscreteGradient", "DiscreteLagrangeDAlembert",
    "GroupVPRK", "GroupPRKState", "PRKState", "VRKMK", "VCG", "TStarState",
    "tableaus", "quadrature", "interpolation", "lie", "constraints", "solvers", "systems", "control",
    "integrators", "diagnostics",
]
