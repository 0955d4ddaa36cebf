"""What the Galerkin-type integrators share: predictors that extrapolate the previous step's
polynomial, the Hamiltonian pieces of the continuous-time generating functional, and the
base of the continuous-time (DG/CG) methods."""


import abc
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from equinox import AbstractVar
from jaxtyping import Array

from ..._typing import ScalarLike, Vector
from ...quadrature import PolynomialBasis, Quadrature, as_quadrature, lagrange_basis
from ...solvers import AbstractRootSolver, Newton
from ...systems import ForcedSystem, LagrangianSystem, MechanicalSystem, TimeDependentSystem
from .._base import AbstractDenseIntegrator, AbstractState
from ..vprk import at_nodes

__all__ = ["check_int", "step_ratio", "extrapolation", "hamiltonian", "quad_sum",
           "AbstractContinuousTimeVI"]


def step_ratio(state, h):
    """``h / h_prev`` for the predictor; 0 on the first step (no previous interval: the
    extrapolation then repeats the initial data)."""
    return jnp.where(state.h > 0, h / jnp.where(state.h > 0, state.h, 1.0), 0.0)


def extrapolation(nodes: np.ndarray, ratio, at) -> Array:
    """Values at ``1 + ratio * at`` of the polynomial through ``nodes``: predictor matrix."""
    return lagrange_basis(nodes, 1.0 + ratio * jnp.asarray(at, ratio.dtype))


# ----------------------------------------------------------------------------------------------
# Hamiltonian pieces
# ----------------------------------------------------------------------------------------------


def hamiltonian(system, q, p):
    """``H(q, p)``; for a mechanical system ``½ pᵀ M⁻¹ p + V`` directly."""
    if isinstance(system, MechanicalSystem):
        return 0.5 * p @ (system.inverse_mass_matrix(q) @ p) + system.potential(q)
    return system.hamiltonian(q, p)


def quad_sum(rule: Quadrature, basis_q: PolynomialBasis, basis_p: PolynomialBasis, Q, P, fn, dtype,
             system, t0, h):
    """``Σ_j w_j fn(system.at(t0 + τ_j h), q̃(τ_j), p̃(τ_j))`` with basis coefficients ``Q``,
    ``P`` (the clock matters only for a :class:`vijax.TimeDependentSystem`)."""
    Bq = jnp.asarray(basis_q.values(rule.nodes), dtype)
    Bp = jnp.asarray(basis_p.values(rule.nodes), dtype)
    times = t0 + h * jnp.asarray(rule.nodes, dtype)
    vals = at_nodes(system, times, fn, Bq @ Q, Bp @ P)
    return jnp.asarray(rule.weights, dtype) @ vals


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


class AbstractContinuousTimeVI(AbstractDenseIntegrator):
    """What :class:`DGVI` and :class:`CGVI` share: the quadrature rules, the solver, the
    integral of ``H`` inside ``G_i`` and the construction from ``(q0, v0)``."""

    quadrature: AbstractVar[Quadrature]
    kinetic_quadrature: AbstractVar[Optional[Quadrature]]
    solver: AbstractVar[AbstractRootSolver]

    symplectic = True
    supported = frozenset({ForcedSystem, TimeDependentSystem})

    @property
    def system_type(self) -> type:
        """:class:`vijax.MechanicalSystem` with a ``kinetic_quadrature`` (it splits
        ``H = T + V``), :class:`vijax.LagrangianSystem` otherwise."""
        return LagrangianSystem if self.kinetic_quadrature is None else MechanicalSystem

    @staticmethod
    def _rules(points: int, quadrature, kinetic_quadrature, solver):
        """Validated ``(quadrature, kinetic_quadrature, solver)`` (default Gauss ``points``)."""
        quad = as_quadrature(quadrature, points, "quadrature")
        kin = (None if kinetic_quadrature is None else
               as_quadrature(kinetic_quadrature, points, "kinetic_quadrature"))
        if solver is not None and not isinstance(solver, AbstractRootSolver):
            raise ValueError(f"solver must be a vijax.solvers root solver such as Newton(), got "
                             f"{type(solver).__name__}.")
        return quad, kin, Newton() if solver is None else solver

    def _order_with_rules(self, nodal_order: int) -> int:
        orders = [nodal_order, self.quadrature.order]
        if self.kinetic_quadrature is not None:
            orders.append(self.kinetic_quadrature.order)
        return min(orders)

    def _label(self, head: str) -> str:
        kin = "" if self.kinetic_quadrature is None else f", kinetic {self.kinetic_quadrature.name}"
        return f"{head}, {self.quadrature.name}{kin})"

    @abc.abstractmethod
    def _H_bases(self):
        """Bases of ``q̃`` and ``p̃`` inside ``∫ H dt``."""

    def _H_integral(self, system, Q, P, h, t0):
        """``∫ H(t, q̃, p̃) dt`` over ``[t0, t0 + h]`` with the chosen rule(s)."""
        bq, bp = self._H_bases()
        dtype = Q.dtype
        if self.kinetic_quadrature is None:
            return h * quad_sum(self.quadrature, bq, bp, Q, P, hamiltonian, dtype, system, t0, h)
        kin = quad_sum(self.kinetic_quadrature, bq, bp, Q, P,
                       lambda sys, q, p: 0.5 * p @ (sys.inverse_mass_matrix(q) @ p), dtype,
                       system, t0, h)
        pot = quad_sum(self.quadrature, bq, bp, Q, P, lambda sys, q, p: sys.potential(q), dtype,
                       system, t0, h)
        return h * (kin + pot)

    def init(self, system: LagrangianSystem, t0: ScalarLike, q0: Vector, v0: Vector) -> AbstractState:
        t0 = jnp.asarray(t0, q0.dtype)
        return self.init_from_momentum(system, t0, q0, system.at(t0).momentum(q0, v0))

    def velocity(self, system: LagrangianSystem, state: AbstractState) -> Vector:
        return system.at(state.t).velocity(state.q, state.p)

    # -- forcing ------------------------------------------------------------------------------
    def force_nodes(self) -> np.ndarray:
        """The nodes of the (potential) quadrature rule."""
        return np.asarray(self.quadrature.nodes, dtype=np.float64)

    def force_weights(self) -> np.ndarray:
        return np.asarray(self.quadrature.weights, dtype=np.float64)

    def _virtual_work(self, force, system, Q, P, h, t0):
        """``∂/∂η_q`` of the virtual work ``∫ F·δq̃ dt`` with the quadrature rule of ``∫ H``:
        ``h Σ_j w_j φ(τ_j) F_j``, ``F_j`` at ``(q̃(τ_j), ∂H/∂p(q̃, p̃)(τ_j))``.  The
        Lagrange--d'Alembert form of the principle of virtual action (Muehlebach et al. (2016),
        eq. (7), which has the virtual work of non-potential forces): the step equations become
        ``∂G/∂η_q = ∫ F·∂q̃/∂η_q dt``."""
        bq, bp = self._H_bases()
        rule, dtype = self.quadrature, Q.dtype
        Bq = jnp.asarray(bq.values(rule.nodes), dtype)
        q = Bq @ Q
        times = t0 + h * jnp.asarray(rule.nodes, dtype)
        v = at_nodes(system, times, lambda sys, x, y: sys.velocity(x, y), q,
                     jnp.asarray(bp.values(rule.nodes), dtype) @ P)
        F = force(q, v)
        return h * (Bq.T @ (jnp.asarray(rule.weights, dtype)[:, None] * F))
