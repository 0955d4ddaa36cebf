"""The continuous-position variant of the continuous-time Galerkin integrators
(Muehlebach, Heimsch & Glocker (2016), App. B): continuous ``q̃`` of degree ``r``, ``p̃`` of
degree ``r - 1``; for a constant mass matrix the Marsden--West Galerkin variational integrator
(Marsden & West (2001), §2.6), nodal order ``2r``."""

from __future__ import annotations

from typing import Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ..._typing import DenseLayout, ScalarLike, Stages, Times, Vector
from ...interpolation import DenseOutput
from ...quadrature import Quadrature, gauss_basis, lobatto_basis, mixed_matrix
from ...solvers import AbstractRootSolver, SolverStats
from ...systems import LagrangianSystem
from .._base import AbstractIntegrator, AbstractState
from ._common import AbstractContinuousTimeVI, check_int, extrapolation, step_ratio

__all__ = ["CGVI", "CGState"]


# ----------------------------------------------------------------------------------------------
# Appendix B: continuous q̃ (Marsden--West Galerkin VI for constant M)
# ----------------------------------------------------------------------------------------------


class CGState(AbstractState):
    """Node data ``(t_i, q_i, p_i)`` of the continuous-position scheme and the last interval:
    ``Q`` = ``q̃`` at the ``r + 1`` Gauss--Lobatto nodes (``Q[0] = q_{i-1}``, ``Q[-1] = q_i``),
    ``P`` = ``p̃`` at the ``r`` Gauss nodes.  ``lam = p̃(t_{i-1}^+) - p_{i-1}`` (the continuity
    multiplier of eq. (B.6)) and ``jump_p = p̃(t_i^-) - p_i``."""

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    h: Float[Array, ""]
    Q: Float[Array, "r1 n"]
    P: Float[Array, "r n"]
    lam: Float[Array, " n"]
    jump_p: Float[Array, " n"]


class CGVI(AbstractContinuousTimeVI):
    """Appendix-B variant (Muehlebach et al. (2016), eqs. (B.10)-(B.12)): continuous ``q̃`` of
    degree ``r``, ``p̃`` of degree ``r - 1``, node momenta from the continuity multipliers.

    Step: with ``q̃(t_i) = q_i`` built into the ansatz, solve ``∂G/∂η_q = 0`` (all ``r + 1``
    coefficient rows) and ``∂G/∂η_p = 0`` for the free coefficients and ``p_{i+1}``, where ::

        G = p_{i+1}ᵀ q̃(1) - p_iᵀ q̃(0) - ∫ p̃ᵀ q̃̇ dt + ∫ H(q̃, p̃) dt.

    For a constant mass matrix and exact kinetic integrals ``A_p = 0`` gives ``p̃ = M q̃̇``
    (B.13) and the step is the Marsden--West Galerkin VI (Marsden & West (2001); eq. (62) of
    Muehlebach et al.), nodal order
    ``2r``.  Quadrature options as for :class:`DGVI` (default Gauss with ``2r`` points).
    """

    r: int = eqx.field(static=True)
    quadrature: Quadrature
    kinetic_quadrature: Optional[Quadrature]
    solver: AbstractRootSolver


    def __init__(self, r: int = 2, quadrature=None, *, kinetic_quadrature=None,
                 solver: Optional[AbstractRootSolver] = None):
        self.r = check_int("CGVI: r (polynomial degree of q)", r, 1)
        self.quadrature, self.kinetic_quadrature, self.solver = self._rules(
            2 * self.r, quadrature, kinetic_quadrature, solver)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        return [(f"CGVI({r})", cls(r)) for r in (1, 2)]

    @property
    def order(self) -> int:
        return self._order_with_rules(2 * self.r)

    @property
    def stages(self) -> int:
        """Unknown control values of ``q̃`` per step."""
        return self.r

    @property
    def name(self) -> str:
        return self._label(f"CGVI(r={self.r}")

    def _bases(self):
        return lobatto_basis(self.r), gauss_basis("lagrange", self.r)

    def _H_bases(self):
        return self._bases()

    def residual(self, system, X, q_i, p_i, h, force=None, t_i=0.0):
        """``(∂G/∂Q, ∂G/∂P)`` for the unknowns ``X = {"Q": Q[1:], "P": P, "p1": p_{i+1}}``
        (minus the virtual work of the force, when given)."""
        bq, bp = self._bases()
        dtype = q_i.dtype
        B = jnp.asarray(mixed_matrix(bp, bq), dtype)  # ∫ ψ_k φ_l'

        def G(Q, P):
            return (X["p1"] @ Q[-1] - p_i @ Q[0] - jnp.sum(P * (B @ Q))
                    + self._H_integral(system, Q, P, h, t_i))

        Q = jnp.concatenate([q_i[None], X["Q"]])
        dQ, dP = jax.grad(G, argnums=(0, 1))(Q, X["P"])
        if force is not None:
            dQ = dQ - self._virtual_work(force, system, Q, X["P"], h, t_i)
        return dQ, dP

    def init_from_momentum(self, system: LagrangianSystem, t0: ScalarLike, q0: Vector,
                           p0: Vector) -> AbstractState:
        dtype = q0.dtype
        n, r = q0.shape[0], self.r
        zero = jnp.zeros((), dtype)
        return CGState(t=jnp.asarray(t0, dtype), q=q0, p=p0, h=zero,
                       Q=jnp.broadcast_to(q0, (r + 1, n)), P=jnp.broadcast_to(p0, (r, n)),
                       lam=jnp.zeros_like(q0), jump_p=jnp.zeros_like(q0))

    def step(self, system: LagrangianSystem, state: AbstractState, h: ScalarLike, u=None
             ) -> tuple[AbstractState, SolverStats]:
        bq, bp = self._bases()
        dtype = state.q.dtype
        h = jnp.asarray(h, dtype)
        force = self._force(system, state, h, u)
        q_i, p_i = state.q, state.p
        ratio = step_ratio(state, h)
        Eq = extrapolation(bq.nodes, ratio, bq.nodes[1:]).astype(dtype)
        Ep = extrapolation(bp.nodes, ratio, bp.nodes).astype(dtype)
        e1 = extrapolation(bp.nodes, ratio, np.ones(1)).astype(dtype)[0]
        X0 = {"Q": Eq @ state.Q, "P": Ep @ state.P, "p1": e1 @ state.P}
        X, stats = self.solver.solve(lambda X: self.residual(system, X, q_i, p_i, h, force, state.t),
                                     X0)
        Q = jnp.concatenate([q_i[None], X["Q"]])
        P = X["P"]
        psi0 = jnp.asarray(bp.values(0.0)[0], dtype)
        psi1 = jnp.asarray(bp.values(1.0)[0], dtype)
        new = CGState(t=state.t + h, q=Q[-1], p=X["p1"], h=h, Q=Q, P=P,
                      lam=psi0 @ P - p_i, jump_p=psi1 @ P - X["p1"])
        return new, stats

    def interval(self, state: AbstractState, tau: Union[ScalarLike, Times],
                 derivative: bool = False) -> DenseOutput:
        """``q̃`` and ``p̃`` of the interval that ended at ``state`` at scaled times ``tau``
        (time derivatives with ``derivative=True``)."""
        bq, bp = self._bases()
        tau = jnp.atleast_1d(jnp.asarray(tau, state.q.dtype))
        if derivative:
            return DenseOutput(bq.derivs_jnp(tau) @ state.Q / state.h,
                               bp.derivs_jnp(tau) @ state.P / state.h)
        return DenseOutput(bq.values_jnp(tau) @ state.Q, bp.values_jnp(tau) @ state.P)

    def dense_layout(self, system: LagrangianSystem) -> DenseLayout:
        """``q̃`` continuous at the Gauss--Lobatto nodes; ``p̃`` right-continuous at the grid
        points (``p̃(t_i^+)``), the node momentum ``p_N`` at the end.  For a constant mass
        matrix ``p̃ = M q̃̇`` (the momentum of Muehlebach et al. (2016), §6.2)."""
        bq, bp = self._bases()
        return {"q": (tuple(bq.nodes), "node", True), "p": (tuple(bp.nodes), "right", False)}

    def dense_knots(self, system: LagrangianSystem, state: AbstractState
                    ) -> dict[str, Vector]:
        return {"q": state.q, "p": state.p}

    def dense_interval(self, system: LagrangianSystem, prev: AbstractState,
                       new: AbstractState, h: ScalarLike) -> dict[str, Stages]:
        return {"q": new.Q, "p": new.P}
