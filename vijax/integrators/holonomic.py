"""Holonomically constrained variational PRK.

After Martín de Diego & Sato Martín de Almagro (2022), §4.3, eq. (13).  The augmented
Hamilton--Pontryagin action adds ``-h sum_i b_i <Lam^i, g(Q^i)>`` (sign convention of
:mod:`vijax.constraints`), which gives, per step,

    Q^i = q_k + h sum_j a_ij V^j,          P^i = p_k + h sum_j â_ij W^j,
    W^i = D1L(Q^i, V^i) - G(Q^i)^T Lam^i,   P^i = D2L(Q^i, V^i),
    q_{k+1} = q_k + h sum_j b_j V^j,        p_{k+1} = p_k + h sum_j b_j W^j,
    0 = g(Q^i)  (i = 2..s),                 0 = G(q_{k+1}) FL^{-1}(q_{k+1}, p_{k+1}).

With a :class:`vijax.ForcedSystem` the stage forces ``F(t_k + c_i h, Q^i, V^i, U^i)`` join
``W^i`` (discrete Lagrange--d'Alembert principle).  The last equation (tangency, the hidden
constraint) closes the system; all ``Lam^1..Lam^s``
are unknowns.  The tableau must satisfy their hypotheses H1--H3 (``a_1j = 0``, ``A`` without
its first row and column invertible, ``a_sj = b_j``): Lobatto IIIA--IIIB, whose
``s``-stage member has order ``2s - 2`` on the constraint manifold; ``s = 2`` is RATTLE.
The node velocity ``v_{k+1} = FL^{-1}(q_{k+1}, p_{k+1})`` is one more unknown, so the method
works for any regular Lagrangian.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import constraints as cons
from .. import tableaus as tb
from .._linalg import mm
from .._typing import ScalarLike, Vector
from ..solvers import AbstractRootSolver, SolverStats
from ..systems import ForcedSystem, HolonomicSystem, LagrangianSystem, TimeDependentSystem
from ._base import AbstractIntegrator, with_fields
from ._prk_core import (PRKState, initial_state, next_state, predict, stage_equations,
                        vector_space)
from .vprk import VPRK, AbstractPRK

__all__ = ["HolonomicVPRK", "HolonomicState"]


#: ``(t, q, p, v)`` on the constraint manifold, the node multiplier ``lam`` and the last
#: step's stage values (``stages`` velocities, ``lams`` multipliers) for the predictor: the
#: state every PRK family with constraints carries (:class:`vijax.PRKState`).
HolonomicState = PRKState


def _check_hypotheses(pair: tb.PartitionedTableau) -> None:
    a, b = pair.q.a, pair.q.b
    problems = []
    if np.max(np.abs(a[0])) > 1e-14:
        problems.append("a_1j = 0")
    if np.max(np.abs(a[-1] - b)) > 1e-14:
        problems.append("a_sj = b_j (stiffly accurate)")
    if a.shape[0] > 1 and abs(np.linalg.det(a[1:, 1:])) < 1e-12:
        problems.append("(a_ij), i,j >= 2, invertible")
    if problems:
        raise ValueError(
            f"Constrained VPRK needs a tableau with a_1j = 0, a_sj = b_j and an invertible "
            f"lower-right block (a_ij), i,j >= 2; {pair.name} violates {', '.join(problems)}. "
            f"Use Lobatto IIIA-IIIB: "
            f"HolonomicVPRK.lobatto(s)."
        )


class HolonomicVPRK(AbstractPRK):
    """Constrained VPRK for systems with ``holonomic(q)``.

    Eq. (13) of Martín de Diego & Sato Martín de Almagro (2022).

    Presets: :meth:`lobatto` (order ``2s - 2``), :meth:`rattle` (``s = 2``).  The stage
    system (velocities, multipliers and the node velocity) is solved by default by
    :func:`vijax.constraints.default_solver`, a fixed point preconditioned with its
    saddle-point structure (:meth:`_precond`); pass ``solver=Newton()`` for stiff problems.
    """

    tableau: tb.PartitionedTableau
    solver: AbstractRootSolver
    retrace: bool = eqx.field(static=True, default=False)   # see retracing

    symplectic = True
    supported = frozenset({HolonomicSystem, ForcedSystem, TimeDependentSystem})
    required = frozenset({HolonomicSystem})

    def __init__(self, tableau, solver: AbstractRootSolver | None = None):
        pair = VPRK(tableau).tableau
        _check_hypotheses(pair)
        self.tableau = pair
        self.solver = cons.default_solver() if solver is None else solver

    @classmethod
    def lobatto(cls, s: int, **kwargs) -> "HolonomicVPRK":
        """Constrained Lobatto IIIA--IIIB, ``s >= 2`` stages, order ``2s - 2``."""
        return cls(tb.lobatto_iiia_iiib(s), **kwargs)

    @classmethod
    def rattle(cls, **kwargs) -> "HolonomicVPRK":
        """RATTLE: constrained Lobatto IIIA--IIIB with two stages, order 2."""
        return cls(tb.lobatto_iiia_iiib(2), **kwargs)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        return [("HolonomicVPRK.rattle()", cls.rattle())] + [
            (f"HolonomicVPRK.lobatto({s})", cls.lobatto(s)) for s in (3, 4, 5)]

    @property
    def name(self) -> str:
        return "RATTLE" if self.stages == 2 else f"HolonomicVPRK[{self.tableau.name}]"

    def check_initial(self, system: LagrangianSystem, q0: Vector, v0: Vector, tol: float
                      ) -> tuple[Vector, Vector]:
        return cons.check_consistent(system, q0, v0, tol)

    def init(self, system: LagrangianSystem, t0: ScalarLike, q0: Vector, v0: Vector) -> HolonomicState:
        t0 = jnp.asarray(t0, q0.dtype)
        at_t0 = system.at(t0)
        return initial_state(self.tableau, t0, q0, at_t0.momentum(q0, v0), v0,
                             cons.multiplier(at_t0, q0, v0))

    def stage_equations(self, system, state: HolonomicState, h: ScalarLike, X, force=None):
        """Residual of eq. (13) at ``X = (V, μ, v_{k+1})`` and the step's
        :class:`~vijax.integrators._prk_core.StepOutput`.  Unknowns are scaled to O(1) blocks:
        impulses ``μ^i = h Λ^i`` and the constraint rows divided by ``h``, so that the Newton
        matrix stays well conditioned as ``h -> 0``."""
        group, retraction = vector_space(state.q)
        return stage_equations(self.tableau, group, retraction, system, "holonomic", state, h,
                               X, force)

    def _precond(self, system, state, h, X0):
        """Approximate inverse Jacobian of :meth:`_residual`: velocity Hessian at the step
        start, constraint Jacobians at the predicted stages (``q_{k+1} = Q^s`` by H3), the
        O(h) force and curvature terms dropped (:func:`vijax.constraints.saddle_point_inverse`).
        Unknowns ``(V, v_{k+1})`` against ``mu``: ``K = I``, ``B = (â; bᵀ)``, and ``C`` picks
        the rows ``g(Q^i) / h`` (``a_ij``, ``i >= 2``) and the tangency row (``v_{k+1}``)."""
        a, ahat, b = (np.asarray(x) for x in (self.tableau.q.a, self.tableau.p.a,
                                              self.tableau.q.b))
        s = self.stages
        Q0 = state.q[None, :] + h * mm(jnp.asarray(a, state.q.dtype), X0[0])
        G = jax.vmap(lambda x: cons.constraint_jacobian(system.at(state.t), x))(Q0)
        C = np.zeros((s, s + 1))
        C[:-1, :s], C[-1, s] = a[1:], 1.0
        apply = cons.saddle_point_inverse(system.at(state.t), state.q, state.v, np.eye(s + 1),
                                          np.vstack([ahat, b]), C, G,
                                          jnp.concatenate([G[1:], G[-1:]]))

        def precond(r):
            R1, rg, R3, R4 = r
            X, Y = apply(jnp.concatenate([R1, R3[None]]), jnp.concatenate([rg, R4[None]]))
            return X[:s], Y, X[s]

        return precond

    def retracing(self) -> "HolonomicVPRK":
        return with_fields(self, retrace=True, solver=with_fields(self.solver, min_steps=1))

    def step(self, system: LagrangianSystem, state: HolonomicState, h: ScalarLike, u=None
             ) -> tuple[HolonomicState, SolverStats]:
        force = self._force(system, state, h, u)
        # Predictor: the previous step's stage velocities and multipliers extrapolated, v_{k+1}
        # from the node velocity (exact to O(h^2) for RATTLE: _prk_core.predict).
        X0 = predict(self.tableau, state, h, "holonomic", retrace=self.retrace)
        # The constraint rows g(Q)/h carry round-off eps |q| / h, which the impulses inherit:
        # at small h the increments stagnate above the solver's default round-off level.
        stall = cons.row_round_off(state.q, h, self.stages)
        # q_{k+1}, p_{k+1} from the last residual evaluation: no evaluation after the solve.
        X, out, stats = self.solver.solve(
            lambda X: self.stage_equations(system, state, h, X, force), X0,
            self._precond(system, state, h, X0), has_aux=True, stall_level=stall)
        return next_state(state, "holonomic", X, out, h), stats

    def velocity(self, system: LagrangianSystem, state: HolonomicState) -> Vector:
        return state.v
