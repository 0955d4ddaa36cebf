"""Discrete Lagrange--d'Alembert integrators for linear nonholonomic constraints: the
baselines against which Celledoni, Farré Puiggalí, Høiseth & Martín de Diego (2016), §4,
measure their discrete-gradient methods.  Both keep the constraint ``A(q) v = 0`` at the
nodes exactly; their energy error is bounded per step but wanders (a random walk whose variance
grows linearly in time on chaotic problems, McLachlan & Perlmutter (2006)).

* **SI-DLA**, the semi-implicit reversible method of McLachlan & Perlmutter (2006), eq. (4.18),
  for a constant mass matrix ``M``::

      q_{1/2} = q_k + (h/2) v_k,
      M (v_{k+1} - v_k) = h (-∇V(q_{1/2}) + A(q_{1/2})ᵀ λ),
      A(q_{1/2} + (h/2) v_{k+1}) v_{k+1} = 0,     q_{k+1} = q_{1/2} + (h/2) v_{k+1};

  implicit in ``(v_{k+1}, λ)`` only.
* **I-DLA**, the implicit reversible method with the midpoint discrete Lagrangian
  ``L_d(q_0, q_1) = h L((q_0 + q_1)/2, (q_1 - q_0)/h)`` of McLachlan & Perlmutter (2006), in
  momentum form with the constraint impulses split between the nodes (as RATTLE splits them;
  our construction of the reversible variant)::

      p_k + D1 L_d(q_k, q_{k+1}) + (h/2) A(q_k)ᵀ μ = 0,     A(q̄)(q_{k+1} - q_k) = 0,
      p_{k+1} = D2 L_d(q_k, q_{k+1}) + (h/2) A(q_{k+1})ᵀ ν,  A(q_{k+1}) M(q_{k+1})^{-1} p_{k+1} = 0;

  any mechanical ``L``; implicit in ``(q_{k+1}, μ)``, ``ν`` by one linear solve.

Forcing (:class:`vijax.ForcedSystem`): the force at the step midpoint,
``F(t + h/2, q̄, (q_{k+1} - q_k)/h)``, adds ``h F`` to the momentum change (``(h/2) F`` at
each node for I-DLA: the discrete Lagrange--d'Alembert forces ``F_d^±``, Marsden & West (2001),
§3).  A time-dependent Lagrangian (:class:`vijax.TimeDependentSystem`) is evaluated at the
step's midpoint time ``t + h/2`` (the midpoint discrete Lagrangian in time, Marsden & West
(2001), Part 4), the new node momentum at ``t + h``; constraint one-forms that read the
clock, ``A(t, q)``, at the time of the node they are taken at (``t``, ``t + h/2``, ``t + h``).
Both methods are symmetric and of order 2.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .. import _linalg
from .._typing import ScalarLike, Vector
from ..solvers import AbstractRootSolver, Newton, SolverStats
from ..systems import MechanicalSystem, TimeDependentSystem
from ._base import AbstractIntegrator, AbstractState, IncompatibleSystemError, accepting
from .discrete_gradients import (AbstractLinearNonholonomicMethod, constraint_forms,
                                 require_linear_constraints)

__all__ = ["DiscreteLagrangeDAlembert", "DLAState"]


class DLAState(AbstractState):
    """``(t, q, p, v)`` with ``A(q) v = 0``."""

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    v: Float[Array, " n"]


class DiscreteLagrangeDAlembert(AbstractLinearNonholonomicMethod):
    """Discrete Lagrange--d'Alembert integrators for mechanical systems with linear
    nonholonomic constraints (McLachlan & Perlmutter (2006)).

    Presets: :meth:`semi_implicit` (SI-DLA, eq. (4.18); constant mass matrix) and
    :meth:`implicit` (I-DLA, midpoint discrete Lagrangian).  ``solver``: default
    :class:`vijax.solvers.Newton`.
    """

    scheme: str = eqx.field(static=True)
    solver: AbstractRootSolver

    symplectic = False
    system_type = MechanicalSystem
    # a time-dependent Lagrangian is evaluated at the step's midpoint time t + h/2 (the
    # midpoint rule in time of the discrete Lagrangian, Marsden & West (2001), Part 4), the
    # node momenta at the node times
    supported = AbstractLinearNonholonomicMethod.supported | {TimeDependentSystem}

    def __init__(self, scheme: Literal["semi_implicit", "implicit"] = "semi_implicit",
                 solver: AbstractRootSolver | None = None):
        if scheme not in ("semi_implicit", "implicit"):
            raise ValueError(f"scheme must be 'semi_implicit' or 'implicit', got {scheme!r}.")
        self.scheme = scheme
        self.solver = Newton() if solver is None else solver

    @classmethod
    def semi_implicit(cls, **kwargs) -> "DiscreteLagrangeDAlembert":
        """SI-DLA, McLachlan & Perlmutter (2006), eq. (4.18); constant mass matrix."""
        return cls("semi_implicit", **kwargs)

    @classmethod
    def implicit(cls, **kwargs) -> "DiscreteLagrangeDAlembert":
        """I-DLA: midpoint discrete Lagrangian, constraint at the midpoint and on the node
        momenta."""
        return cls("implicit", **kwargs)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        return [("DiscreteLagrangeDAlembert.semi_implicit()", cls.semi_implicit()),
                ("DiscreteLagrangeDAlembert.implicit()", cls.implicit())]

    @property
    def name(self) -> str:
        return "SI-DLA" if self.scheme == "semi_implicit" else "I-DLA"

    @property
    def order(self) -> int:
        return 2

    @property
    def stages(self) -> int:
        return 1

    @property
    def symmetric(self) -> bool:
        return True

    def _constant_mass_ok(self, system) -> bool:
        return self.scheme == "implicit" or (isinstance(system, MechanicalSystem)
                                             and system.constant_mass)

    def accepts(self, system) -> bool:
        return super().accepts(system) and self._constant_mass_ok(system)

    def check_system(self, system) -> None:
        if AbstractIntegrator.accepts(self, system):
            require_linear_constraints(self, system)
            if not self._constant_mass_ok(system):
                others = "; ".join(accepting(system))
                raise IncompatibleSystemError(
                    f"SI-DLA (McLachlan & Perlmutter (2006), eq. (4.18)) needs a constant mass "
                    f"matrix (a MechanicalSystem declaring constant_mass = True), and "
                    f"{type(system).__name__} does not declare it. Use "
                    f"vijax.DiscreteLagrangeDAlembert.implicit() or "
                    f"vijax.DiscreteGradient.gonzalez(). Methods that accept it: {others}.")
        super().check_system(system)

    def init(self, system, t0: ScalarLike, q0: Vector, v0: Vector) -> DLAState:
        require_linear_constraints(self, system)
        t0 = jnp.asarray(t0, q0.dtype)
        return DLAState(t=t0, q=q0, p=system.at(t0).mass_matrix(q0) @ v0, v=v0)

    def velocity(self, system, state: DLAState) -> Vector:
        return state.v

    def step(self, system, state: DLAState, h: ScalarLike, u=None
             ) -> tuple[DLAState, SolverStats]:
        force = self._force(system, state, h, u)

        def midpoint_force(q0, q1):
            if force is None:
                return jnp.zeros_like(q0)
            return force((0.5 * (q0 + q1))[None, :], ((q1 - q0) / h)[None, :])[0]

        # the system at the step's midpoint time, and at its end (the new node momentum)
        # (a constraint that reads the clock: its forms at the time of each node)
        mid, end = system.at(state.t + 0.5 * h), system.at(state.t + h)
        if self.scheme == "semi_implicit":
            return self._step_si(mid, end, state, h, midpoint_force)
        return self._step_implicit(system.at(state.t), mid, end, state, h, midpoint_force)

    def _step_si(self, system, end, state, h, midpoint_force):
        q, v = state.q, state.v
        M = system.mass_matrix(q)
        qh = q + 0.5 * h * v
        dV = jax.grad(system.potential)(qh)
        Ah = constraint_forms(system, qh)

        def residual(x):
            # products with _linalg.mm: each @ under Newton's tangent vmap was a dot call
            # (update 24 -> 16 kernels, step 0.81-0.84x on the CVT gearbox)
            v1, mu = x                                   # mu = h λ
            q1 = qh + 0.5 * h * v1
            F = midpoint_force(q, q1)
            return (_linalg.mm(M, v1 - v) - h * (-dV + F) - _linalg.mm(mu, Ah),
                    _linalg.mm(constraint_forms(end, q1), v1))

        x0 = (v - h * _linalg.solve(M, dV), jnp.zeros((Ah.shape[0],), q.dtype))
        (v1, _), stats = self.solver.solve(residual, x0)
        q1 = qh + 0.5 * h * v1
        return DLAState(t=state.t + h, q=q1, p=end.mass_matrix(q1) @ v1, v=v1), stats

    def _step_implicit(self, start, system, end, state, h, midpoint_force):
        q, p, v = state.q, state.p, state.v

        def Ld(a, b):
            return h * system.lagrangian(0.5 * (a + b), (b - a) / h)

        A0 = constraint_forms(start, q)

        def residual(x):
            q1, mu = x                                   # mu = (h/2) μ
            F = midpoint_force(q, q1)
            d1 = jax.grad(Ld, argnums=0)(q, q1)
            # (products with @, unlike the semi-implicit residual's: written with
            # _linalg.mm the Newton update is 17 kernels instead of 23, but XLA:CPU then
            # recomputes the midpoint constraint forms inside the fused products and the
            # step ran 1.05x slower on the CVT gearbox)
            return (p + d1 + 0.5 * h * F + A0.T @ mu,
                    constraint_forms(system, 0.5 * (q + q1)) @ (q1 - q) / h)

        x0 = (q + h * v, jnp.zeros((A0.shape[0],), q.dtype))
        (q1, _), stats = self.solver.solve(residual, x0)
        F = midpoint_force(q, q1)
        p_free = jax.grad(Ld, argnums=1)(q, q1) + 0.5 * h * F
        A1 = constraint_forms(end, q1)
        minv = end.inverse_mass_matrix(q1)
        nu = _linalg.solve(A1 @ minv @ A1.T, -(A1 @ (minv @ p_free)))
        p1 = p_free + A1.T @ nu
        return DLAState(t=state.t + h, q=q1, p=p1, v=minv @ p1), stats
