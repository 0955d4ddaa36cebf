"""Integrators, one module (or subpackage) per method family.

* ``vprk.py`` -- :class:`VPRK`, variational partitioned Runge--Kutta methods;
* ``holonomic.py`` -- :class:`HolonomicVPRK`, constrained Lobatto IIIA--IIIB (RATTLE);
* ``galerkin/`` -- :class:`GalerkinVI`, :class:`DGVI`, :class:`CGVI`, the Galerkin-type
  variational integrators;
* ``lie/`` -- :class:`GroupVPRK`, the variational PRK over a retraction on a Lie group;
* ``tstar/`` -- :class:`VRKMK`, :class:`VCG`, the symplectic Lie-group methods on ``T*G``.

The contract every family implements is in ``_base.py``; the method table is generated from
the families' traits (``_table.py``).
"""

# isort: skip_file -- the families are imported in the order of the method table (the
# registry lists them in the order their classes are created)
from ._base import (AbstractDenseIntegrator, AbstractIntegrator, AbstractState,
                    IncompatibleSystemError, accepting, registry)
from ._table import method_table, presets
from ._forcing import stage_force
from ._prk_core import PRKState
from .vprk import VPRK, AbstractPRK, VPRKState
from .holonomic import HolonomicState, HolonomicVPRK
from .nonholonomic import NonholonomicState, NonholonomicVPRK
from .discrete_gradients import DiscreteGradient, DiscreteGradientState
from .dla import DiscreteLagrangeDAlembert, DLAState
from .galerkin import (CGVI, DGVI, AbstractContinuousTimeVI, CGState, ConstrainedDGState,
                       DGState, GalerkinState, GalerkinVI, dg_prk_tableau, dg_prk_tableau_formula)
from .lie import GroupPRKState, GroupVPRK
from .tstar import VCG, VRKMK, TStarState

__all__ = ["AbstractIntegrator", "AbstractDenseIntegrator", "AbstractState",
           "IncompatibleSystemError", "registry", "accepting", "AbstractPRK", "VPRK", "VPRKState",
           "HolonomicVPRK", "HolonomicState", "NonholonomicVPRK", "NonholonomicState", "GalerkinVI", "GalerkinState",
           "AbstractContinuousTimeVI", "DGVI", "DGState", "ConstrainedDGState", "CGVI", "CGState",
           "dg_prk_tableau", "dg_prk_tableau_formula", "method_table", "presets", "stage_force",
           "DiscreteGradient", "DiscreteGradientState", "DiscreteLagrangeDAlembert", "DLAState",
           "GroupVPRK", "GroupPRKState", "PRKState", "VRKMK", "VCG", "TStarState"]
