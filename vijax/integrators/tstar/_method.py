"""What the T*G methods share (a module of its own: equinox's abstract fields cannot be
declared under ``from __future__ import annotations``)."""

import numpy as np
from equinox import AbstractVar

from ... import tableaus as tb
from ...solvers import AbstractRootSolver
from ...systems import LieGroupSystem
from .._base import AbstractIntegrator
from ._common import REQUIRED, SUPPORTED, default_solver

__all__ = ["AbstractTStarMethod"]


class AbstractTStarMethod(AbstractIntegrator):
    """What :class:`VRKMK` and :class:`VCG` share: a Butcher tableau with nonzero weights, an
    optional root solver (default :func:`default_solver`), the systems they take (a
    :class:`vijax.LieGroupSystem`, forced or not) and forces at the tableau's nodes."""

    tableau: AbstractVar[tb.ButcherTableau]
    solver: AbstractVar[AbstractRootSolver | None]
    _order: AbstractVar[int]

    symplectic = True
    system_type = LieGroupSystem
    supported = SUPPORTED
    required = REQUIRED

    @property
    def order(self) -> int:
        return self._order

    @property
    def stages(self) -> int:
        return self.tableau.stages

    def force_nodes(self) -> np.ndarray:
        """The stage nodes ``c_i``: stage ``i``'s force acts at ``(t + c_i h, Q_i, ξ̄_i)``."""
        return self.tableau.c

    def force_weights(self) -> np.ndarray:
        return self.tableau.b

    def _solver(self, dtype) -> AbstractRootSolver:
        """The given solver, or the fixed point run to round-off (:func:`default_solver`)."""
        return default_solver(dtype) if self.solver is None else self.solver

    def velocity(self, system: LieGroupSystem, state):
        """The body velocity ``ξ`` with ``D2ℓ(q, ξ) = p`` (at the state's time)."""
        return system.at(state.t).velocity(state.q, state.p)
