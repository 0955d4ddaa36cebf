"""Continuous-time discontinuous-Galerkin variational integrators.

Muehlebach, Heimsch & Glocker (2016) derive one-step methods from the *principle of virtual
action* in Hamiltonian form (their eq. (7); equation and section numbers below are theirs),
with ``q`` and ``p`` approximated by piecewise polynomials in time that may jump at the grid
points:

* :class:`DGVI` -- the main-text scheme (§2.4, eqs. (15)-(21)): ``q̃``
  **left-continuous**, ``p̃`` **right-continuous**, ``s`` basis functions (polynomials of
  degree ``s - 1``) per coordinate.  Nodal order ``2s - 1`` (measured; the paper gives no rate).
  With holonomic constraints (§4, eqs. (27)-(38)) a right-continuous
  constraint momentum ``p̃_g`` with ``m_g`` basis functions is added; the gap is then zero
  at every node, without stabilisation.
* :class:`CGVI` -- the Appendix-B variant (eqs. (B.10)-(B.12)):
  continuous ``q̃`` of degree ``r``, ``p̃`` of degree ``r - 1``.  For a constant mass matrix
  it is the Marsden--West Galerkin variational integrator (nodal order ``2r``).

Both schemes are built from a scalar **discrete generating functional** ``G_i`` (our
construction, not in the paper: its gradients are the residuals (19)-(20), resp. (34)): the
step equations are ``jax.grad`` of ``G_i`` with respect to the ansatz coefficients, plus the
boundary condition at ``t_i``.  ``G_i`` is a type-2
generating function ``S(q_i, p_{i+1})`` of the step map, so the map is symplectic for *any*
fixed quadrature rule placed inside ``G_i``; each additive term may use its own rule.  (What
breaks symplecticity is evaluating ``∇_q H`` and ``∇_p H`` of one non-separable term with
different rules; the paper's condition, the same rule in ``A_q`` and ``A_p``, is sufficient.)

Ansatz on the scaled time ``τ = (t - t_i) / h ∈ [0, 1]``.  The default basis is the Lagrange
basis at the ``s`` Gauss--Legendre nodes ``c_j`` (then the coefficients are the values
``q̃(t_i + c_j h)``, which are also what the states store); ``"legendre"`` and
``"monomial"`` bases span the same space and give the same trajectories (eq. (22)),
only the Newton conditioning differs.

Quadrature (:class:`Quadrature`): Gauss--Legendre with ``k`` points (default ``k = 2s``:
exact for polynomial integrands of degree ``<= 4s - 1``, i.e. for quadratic Hamiltonians and
quadratic constraints, which makes the energy-like balance (24)/(40) exact there), or the
rectangle rule (left/mid/right) with a fixed number of rectangles per step, provided only to
reproduce the paper's experiments (it is first order: with width 1e-4 s it adds about 1e-4 rad
to the nodal error of §6.1).  The term ``∫ p̃ᵀ q̃̇ dt`` is a polynomial and
is always integrated exactly.  For a :class:`~vijax.systems.MechanicalSystem` the kinetic part
``½ pᵀ M(q)⁻¹ p`` may use its own rule (``kinetic_quadrature``), as in the paper's §6.1/§6.2
(kinetic integrals analytic, potential by rectangles); the step stays symplectic (one
rule per additive term of ``G_i``, see above).

Non-potential forces (a :class:`vijax.ForcedSystem`) enter through their virtual work, the
Lagrange--d'Alembert form of the principle (7): ``∂G_i/∂η_q`` is balanced by
``∫ F·∂q̃/∂η_q dt`` with the rule of ``∫ H``, ``F`` at ``(q̃, ∂H/∂p(q̃, p̃))``.
"""

from __future__ import annotations

import functools
from typing import Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ... import constraints as cons
from ... import tableaus as tb
from ..._typing import DenseLayout, ScalarLike, Stages, Times, Vector
from ...interpolation import DenseOutput
from ...quadrature import BASES, Quadrature, gauss_basis, gauss_quadrature, mixed_matrix
from ...solvers import AbstractRootSolver, SolverStats
from ...systems import ForcedSystem, HolonomicSystem, LagrangianSystem, TimeDependentSystem
from .._base import AbstractIntegrator, AbstractState
from .._prk_core import at_nodes
from ._common import (
    AbstractContinuousTimeVI,
    check_int,
    extrapolation,
    hamiltonian,
    step_ratio,
)

__all__ = ["DGVI", "DGState", "ConstrainedDGState", "dg_prk_tableau", "dg_prk_tableau_formula"]


# ----------------------------------------------------------------------------------------------
# The discontinuous-Galerkin scheme (Muehlebach et al. (2016), §2.4 and §4)
# ----------------------------------------------------------------------------------------------


class DGState(AbstractState):
    """Node data ``(t_i, q_i, p_i)`` and the last step's ansatz and diagnostics.

    ``Q``, ``P`` are the values of ``q̃`` and ``p̃`` at the ``s`` Gauss nodes ``t_{i-1} + c_j h``
    of the interval just completed (the dense output; for the ``s``-point Gauss scheme these
    are the PRK stage values of :func:`dg_prk_tableau`).  Diagnostics of that step (zero at
    ``t_0``):

    * ``balance``: residual LHS - RHS of the energy-like balance (24) of Muehlebach et al. (2016);
    * ``jump_q = q̃(t_{i-1}^+) - q_{i-1}`` and ``jump_p = p̃(t_i^-) - p_i``: since ``q̃`` is
      left- and ``p̃`` right-continuous, ``q_{i-1}`` and ``p_i`` are node values, not limits.
    """

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    h: Float[Array, ""]
    Q: Float[Array, "s n"]
    P: Float[Array, "s n"]
    balance: Float[Array, ""]
    jump_q: Float[Array, " n"]
    jump_p: Float[Array, " n"]


class ConstrainedDGState(AbstractState):
    """Node data of the constrained DG scheme (Muehlebach et al. (2016), §4.1, eqs. (35)-(38)).

    ``pz = p_{z,i} = p̃(t_i^+) - W(q_i) p̃_g(t_i^+)`` is the scheme's node variable; its normal
    part ``W(q)``-direction is gauge (adding a multiple of ``W(q_i)`` to ``p_{z,i}`` leaves
    ``q_{i+1}`` and the tangential part of ``p_{z,i+1}`` unchanged) and grows as ``p_g``
    drifts (``ṗ_g`` is the constraint force, whose mean is not zero).  ``p`` is the
    physical momentum: the tangential projection of ``pz`` in the kinetic metric
    (:func:`vijax.constraints.project_momentum`), so ``H(q, p)`` is the energy.
    ``Pg`` holds ``p̃_g`` at the ``m_g`` Gauss nodes of the last interval.  Diagnostics as in
    :class:`DGState`, with ``balance`` the residual of (40), ``jump_p = p̃_z(t_i^-) - p_{z,i}``
    and ``gap = g(q_i)``.
    """

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    pz: Float[Array, " n"]
    h: Float[Array, ""]
    Q: Float[Array, "s n"]
    P: Float[Array, "s n"]
    Pg: Float[Array, "mg nc"]
    balance: Float[Array, ""]
    jump_q: Float[Array, " n"]
    jump_p: Float[Array, " n"]
    gap: Float[Array, " nc"]

    def step_momenta(self):
        """The step reads ``p_z`` (eq. (38)); its normal part is gauge."""
        return (self.pz,)


class DGVI(AbstractContinuousTimeVI):
    """Continuous-time discontinuous-Galerkin variational integrator (Muehlebach, Heimsch &
    Glocker (2016), eqs. (19)-(21); constrained: eqs. (34)-(38)).

    ``q̃`` is left-continuous and ``p̃`` right-continuous, as in the paper (the convention is
    part of the scheme).  Step ``i`` solves ``∂G_i/∂(η_q, η_p[, η_pg]) = 0`` and the boundary
    condition ``p̃(t_i^+) = p_i`` (constrained: ``p̃(t_i^+) - W(q_i) p̃_g(t_i^+) = p_{z,i}``,
    eq. (38)) for ``η_q, η_p[, η_pg]`` and ``p_{i+1}`` (``p_{z,i+1}``); then
    ``q_{i+1} = q̃(t_{i+1})``.  ``W`` is taken at the node value ``q_i`` as in (38), not at
    ``q̃(t_i^+)`` as the example's eq. (71) prints it: only ``W(q_i)`` makes ``G_i`` a
    generating function (with ``W(q̃(t_i^+))`` Newton diverged at t ≈ 3.6 s in a reproduction
    of §6.3).

    Generating functional (our construction; its gradients are (19)-(20), resp. (34))::

        G_i = p_{i+1}ᵀ q̃(1) - p̃(0)ᵀ (q̃(0) - q_i) - ∫ p̃ᵀ q̃̇ dt + ∫ H(q̃, p̃) dt
              [+ p̃_g(1⁻)ᵀ g(q_{i+1}) - p̃_g(0)ᵀ g(q_i) - ∫ ṗ̃_gᵀ g(q̃) dt]

    The bracket is the constraint term ``p̃_g(0)ᵀ(g(q̃(0)) - g(q_i)) + ∫ p̃_gᵀ ġ̃ dt`` integrated by
    parts: identical when integrals are exact, and it makes ``g(q_{i+1}) = g(q_i)`` exact for
    *any* quadrature (with the paper's form the node gap is conserved only when ``∫ ġ̃ dt``
    is exact), since the constant test function sees only the boundary terms.
    Holonomic constraints are used whenever the system defines ``holonomic(q)`` (any factor
    convention: ``W = ∂gᵀ/∂q`` is taken from the system's ``g``; only ``p_g`` rescales).

    Parameters
    ----------
    s:
        Basis functions per coordinate (polynomials of degree ``s - 1``), ``s >= 1``.
        ``s = 1`` is symplectic Euler (our derivation).  Nodal order ``2s - 1`` (measured).
    quadrature:
        Rule for ``∫ H dt`` (and the constraint term): ``None`` = Gauss with ``2s`` points,
        an int ``k`` = ``k``-point Gauss, or a :class:`Quadrature`.
    kinetic_quadrature:
        Optional separate rule for ``∫ ½ p̃ᵀ M(q̃)⁻¹ p̃ dt`` (mechanical systems only), e.g.
        ``Quadrature.gauss(s)`` (exact for constant ``M``) with a rectangle rule for the
        potential, as in Muehlebach et al. (2016), §6.1.
    basis:
        ``"lagrange"`` (at the Gauss nodes; default), ``"legendre"`` or ``"monomial"`` in the
        scaled time ``τ`` -- same trajectories (eq. (22)), different conditioning.
    m_g:
        Basis functions of ``p̃_g`` per constraint (default ``s``; must be ``>= 1`` so that the
        constants are included, Assumption 4.1).
    solver:
        Root solver, default :class:`~vijax.solvers.Newton` (exact Jacobian of the residual).
    """

    s: int = eqx.field(static=True)
    quadrature: Quadrature
    kinetic_quadrature: Optional[Quadrature]
    basis: str = eqx.field(static=True)
    m_g: Optional[int] = eqx.field(static=True)
    solver: AbstractRootSolver

    supported = frozenset({HolonomicSystem, ForcedSystem, TimeDependentSystem})

    def __init__(self, s: int = 3, quadrature=None, *, kinetic_quadrature=None,
                 basis: str = "lagrange", m_g: Optional[int] = None,
                 solver: Optional[AbstractRootSolver] = None):
        self.s = check_int("DGVI: s (basis functions per coordinate, polynomial degree s-1)",
                            s, 1)
        self.quadrature, self.kinetic_quadrature, self.solver = self._rules(
            2 * self.s, quadrature, kinetic_quadrature, solver)
        if basis not in BASES:
            raise ValueError(f"unknown basis {basis!r}; use one of {BASES}.")
        self.basis = basis
        self.m_g = None if m_g is None else check_int(
            "DGVI: m_g (basis functions of p_g; >= 1 so that it contains constants)", m_g, 1)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        return [(f"DGVI({s})", cls(s)) for s in (1, 2, 3)]

    # -- traits -----------------------------------------------------------------------------
    @property
    def order(self) -> int:
        return self._order_with_rules(2 * self.s - 1)

    @property
    def stages(self) -> int:
        """Basis functions per coordinate (the PRK stage count for ``s``-point Gauss)."""
        return self.s

    @property
    def name(self) -> str:
        return self._label(f"DGVI(s={self.s}")

    @property
    def mg(self) -> int:
        return self.s if self.m_g is None else self.m_g

    def _bases(self):
        return gauss_basis(self.basis, self.s), gauss_basis(self.basis, self.mg)

    # -- pieces of G ------------------------------------------------------------------------
    def _H_bases(self):
        bq, _ = self._bases()
        return bq, bq

    def _generating(self, system, X, q_i, h, constrained, t_i=0.0):
        """Scalar generating functional ``G_i`` (see the class docstring)."""
        bq, bg = self._bases()
        dtype = q_i.dtype
        Q, P = X["Q"], X["P"]
        phi0 = jnp.asarray(bq.values(0.0)[0], dtype)
        phi1 = jnp.asarray(bq.values(1.0)[0], dtype)
        B = jnp.asarray(mixed_matrix(bq, bq), dtype)  # ∫ φ_k φ_l'
        q0p, p0p, q1 = phi0 @ Q, phi0 @ P, phi1 @ Q
        G = X["p1"] @ q1 - p0p @ (q0p - q_i) - jnp.sum(P * (B @ Q)) + self._H_integral(
            system, Q, P, h, t_i)
        if constrained:
            Pg = X["Pg"]
            gphi0 = jnp.asarray(bg.values(0.0)[0], dtype)
            gphi1 = jnp.asarray(bg.values(1.0)[0], dtype)
            rule = self.quadrature
            Bq = jnp.asarray(bq.values(rule.nodes), dtype)
            dBg = jnp.asarray(bg.derivs(rule.nodes), dtype)
            # ∫ p_g · d/dt g(t, q̃(t)) dt by parts; a rheonomic g at the nodes' times
            times = t_i + h * jnp.asarray(rule.nodes, dtype)
            gvals = at_nodes(system, times, lambda sy, x: sy.holonomic(x), Bq @ Q)  # (k, nc)
            g1, g0 = system.at(t_i + h).holonomic(q1), system.at(t_i).holonomic(q_i)
            G = G + (gphi1 @ Pg) @ g1 - (gphi0 @ Pg) @ g0 \
                - jnp.asarray(rule.weights, dtype) @ jnp.sum((dBg @ Pg) * gvals, axis=-1)
        return G

    def residual(self, system, X, q_i, p_i, h, force=None, t_i=0.0):
        """Step equations ``(∂G/∂η_q, ∂G/∂η_p[, ∂G/∂η_pg], BC)`` for the unknowns ``X`` (a dict
        of basis coefficients ``Q``, ``P`` [, ``Pg``] and ``p1`` = ``p_{i+1}`` or
        ``p_{z,i+1}``); ``p_i`` is the node momentum (``p_{z,i}`` when constrained)."""
        constrained = "Pg" in X
        coeffs = {k: v for k, v in X.items() if k != "p1"}

        def G(c):
            return self._generating(system, dict(c, p1=X["p1"]), q_i, h, constrained, t_i)

        grads = jax.grad(G)(coeffs)
        if force is not None:
            grads["Q"] = grads["Q"] - self._virtual_work(force, system, X["Q"], X["P"], h, t_i)
        bq, bg = self._bases()
        phi0 = jnp.asarray(bq.values(0.0)[0], q_i.dtype)
        bc = phi0 @ X["P"] - p_i
        if constrained:
            gphi0 = jnp.asarray(bg.values(0.0)[0], q_i.dtype)
            # W at the node value q_i, not q̃(t_i^+) (and at t_i)
            W = cons.constraint_jacobian(system.at(t_i), q_i).T
            bc = bc - W @ (gphi0 @ X["Pg"])
        return grads, bc

    # -- state ------------------------------------------------------------------------------
    def check_initial(self, system: LagrangianSystem, q0: Vector, v0: Vector, tol: float
                      ) -> tuple[Vector, Vector]:
        """Constrained: ``q0`` must satisfy ``g(q0) = 0`` (the gap is conserved at the nodes,
        not restored).  The velocity need not be tangent: its normal part only shifts the
        gauge part of ``p_z`` (the paper imposes no initial condition on ``p_g``)."""
        if isinstance(system, HolonomicSystem):
            return cons.check_consistent(system, q0, v0, tol, velocity=False)
        return q0, v0

    def init_from_momentum(self, system: LagrangianSystem, t0: ScalarLike, q0: Vector,
                           p0: Vector) -> AbstractState:
        """State at ``t0`` from ``(q0, p0)``; constrained: ``p_{z,0} = p0`` (Muehlebach et al.
        (2016), after eq. (38)) and ``p`` its tangential projection."""
        dtype = q0.dtype
        n, s = q0.shape[0], self.s
        zero = jnp.zeros((), dtype)
        common = dict(t=jnp.asarray(t0, dtype), q=q0, h=zero,
                      Q=jnp.broadcast_to(q0, (s, n)), P=jnp.broadcast_to(p0, (s, n)),
                      balance=zero, jump_q=jnp.zeros_like(q0), jump_p=jnp.zeros_like(q0))
        if not isinstance(system, HolonomicSystem):
            return DGState(p=p0, **common)
        nc = system.holonomic(q0).shape[0]
        at_t0 = system.at(t0)
        return ConstrainedDGState(p=cons.project_momentum(at_t0, q0, p0), pz=p0,
                                  Pg=jnp.zeros((self.mg, nc), dtype), gap=at_t0.holonomic(q0),
                                  **common)

    def _predictor(self, state, h, constrained, system):
        bq, bg = self._bases()
        dtype = state.q.dtype
        ratio = step_ratio(state, h)
        Eq = extrapolation(bq.nodes, ratio, bq.nodes).astype(dtype)
        e1 = extrapolation(bq.nodes, ratio, np.ones(1)).astype(dtype)[0]
        Tinv = jnp.asarray(bq.Tinv, dtype)
        X = {"Q": Tinv @ (Eq @ state.Q), "P": Tinv @ (Eq @ state.P), "p1": e1 @ state.P}
        if constrained:
            Eg = extrapolation(bg.nodes, ratio, bg.nodes).astype(dtype)
            g1 = extrapolation(bg.nodes, ratio, np.ones(1)).astype(dtype)[0]
            X["Pg"] = jnp.asarray(bg.Tinv, dtype) @ (Eg @ state.Pg)
            q1 = e1 @ state.Q
            X["p1"] = X["p1"] - cons.constraint_jacobian(system.at(state.t), q1).T @ (
                g1 @ state.Pg)
        return X

    def step(self, system: LagrangianSystem, state: AbstractState, h: ScalarLike, u=None
             ) -> tuple[AbstractState, SolverStats]:
        constrained = isinstance(system, HolonomicSystem)
        if constrained != isinstance(state, ConstrainedDGState):
            raise ValueError("DGVI: the state does not match the system (constrained state for an "
                             "unconstrained system or vice versa); build it with init().")
        h = jnp.asarray(h, state.q.dtype)
        q_i = state.q
        p_i = state.pz if constrained else state.p
        X0 = self._predictor(state, h, constrained, system)
        force = self._force(system, state, h, u)
        X, stats = self.solver.solve(
            lambda X: self.residual(system, X, q_i, p_i, h, force, state.t), X0)
        return self._new_state(system, state, X, h, constrained), stats

    def _new_state(self, system, state, X, h, constrained):
        bq, bg = self._bases()
        dtype = state.q.dtype
        q_i = state.q
        Q, P, p1 = X["Q"], X["P"], X["p1"]
        phi0 = jnp.asarray(bq.values(0.0)[0], dtype)
        phi1 = jnp.asarray(bq.values(1.0)[0], dtype)
        dphi0 = jnp.asarray(bq.derivs(0.0)[0], dtype) / h
        dphi1 = jnp.asarray(bq.derivs(1.0)[0], dtype) / h
        Tn = jnp.asarray(bq.T, dtype)  # coefficients -> values at the Gauss nodes
        q0p, p0p, q1, p1m = phi0 @ Q, phi0 @ P, phi1 @ Q, phi1 @ P
        def H(q, p, t):
            return hamiltonian(system.at(t), q, p)

        common = dict(t=state.t + h, q=q1, h=h, Q=Tn @ Q, P=Tn @ P, jump_q=q0p - q_i)
        if not constrained:
            lhs = (dphi1 @ Q) @ (p1 - p1m) + H(q1, p1m, state.t + h)
            rhs = (dphi0 @ P) @ (q0p - q_i) + H(q0p, p0p, state.t)
            return DGState(p=p1, balance=lhs - rhs, jump_p=p1m - p1, **common)
        Pg = X["Pg"]
        gphi1 = jnp.asarray(bg.values(1.0)[0], dtype)
        dgphi0 = jnp.asarray(bg.derivs(0.0)[0], dtype) / h
        at_t0, at_t1 = system.at(state.t), system.at(state.t + h)
        W1 = cons.constraint_jacobian(at_t1, q1).T
        pzm = p1m - W1 @ (gphi1 @ Pg)
        lhs = (dphi1 @ Q) @ (p1 - pzm) + H(q1, p1m, state.t + h)
        rhs = ((dphi0 @ P) @ (q0p - q_i) - (dgphi0 @ Pg) @ (at_t0.holonomic(q0p)
                                                          - at_t0.holonomic(q_i))
               + H(q0p, p0p, state.t))
        return ConstrainedDGState(
            p=cons.project_momentum(system.at(state.t + h), q1, p1), pz=p1,
            Pg=jnp.asarray(bg.T, dtype) @ Pg, balance=lhs - rhs, jump_p=pzm - p1,
            gap=at_t1.holonomic(q1),
            **common)

    # -- dense output -----------------------------------------------------------------------
    def interval(self, state: AbstractState, tau: Union[ScalarLike, Times],
                 derivative: bool = False) -> DenseOutput:
        """Raw polynomials of the interval that *ended* at ``state`` at scaled times ``tau``
        (``t = state.t - state.h (1 - tau)``).  At ``tau = 0`` this is the one-sided
        ``q̃(t_i^+)`` (not the node value ``q_i``), at ``tau = 1`` the one-sided ``p̃(t_{i+1}^-)``
        (not ``p_{i+1}``).  ``derivative=True`` returns the time derivatives instead."""
        bq, bg = gauss_basis("lagrange", self.s), gauss_basis("lagrange", self.mg)
        tau = jnp.atleast_1d(jnp.asarray(tau, state.q.dtype))
        if derivative:
            Lq, Lg = bq.derivs_jnp(tau) / state.h, bg.derivs_jnp(tau) / state.h
        else:
            Lq, Lg = bq.values_jnp(tau), bg.values_jnp(tau)
        pg = Lg @ state.Pg if isinstance(state, ConstrainedDGState) else None
        return DenseOutput(Lq @ state.Q, Lq @ state.P, pg=pg)

    def dense_layout(self, system: LagrangianSystem) -> DenseLayout:
        """``q̃`` left-continuous (at a grid point the node value ``q_i``, not ``q̃(t_i^+)``,
        whose error is far larger), ``p̃`` and ``p̃_g`` right-continuous (at ``t_i`` the
        polynomial of ``[t_i, t_{i+1})``; at the last grid point the node momentum ``p_N`` and
        the left limit of ``p̃_g``): the conventions of Muehlebach et al. (2016), §2.4.  All
        are values at the Gauss nodes."""
        gq = tuple(gauss_basis("lagrange", self.s).nodes)
        out = {"q": (gq, "node", False), "p": (gq, "right", False)}
        if isinstance(system, HolonomicSystem):
            out["pg"] = (tuple(gauss_basis("lagrange", self.mg).nodes), "right", False)
        return out

    def dense_knots(self, system: LagrangianSystem, state: AbstractState
                    ) -> dict[str, Vector]:
        return {"q": state.q, "p": state.p}

    def dense_interval(self, system: LagrangianSystem, prev: AbstractState,
                       new: AbstractState, h: ScalarLike) -> dict[str, Stages]:
        out = {"q": new.Q, "p": new.P}
        if isinstance(new, ConstrainedDGState):
            out["pg"] = new.Pg
        return out

    # -- PRK export -------------------------------------------------------------------------
    def prk_tableau(self) -> tb.PartitionedTableau:
        """The partitioned Runge--Kutta tableau equal to this scheme (Muehlebach et al. (2016),
        Sect. 5, for ``s = 2``; our generalisation to any ``s``): only for ``s``-point Gauss
        quadrature of the whole ``H``."""
        if self.quadrature.name != f"Gauss({self.s})" or self.kinetic_quadrature not in (
                None, self.quadrature):
            raise ValueError(f"the PRK form exists for s-point Gauss quadrature only; build "
                             f"DGVI({self.s}, quadrature={self.s}) (this one uses "
                             f"{self.quadrature.name}).")
        return dg_prk_tableau(self.s)


@functools.lru_cache(maxsize=None)
def dg_prk_tableau(s: int) -> tb.PartitionedTableau:
    """The PRK ``(A, Â, b, c)`` of the DG scheme with ``s`` basis functions and ``s``-point
    Gauss quadrature, derived from the Galerkin equations (as Muehlebach et al. (2016), Sect. 5,
    eqs. (45)-(48), do for ``s = 2``; the general ``s`` is our derivation).

    With the Lagrange basis at the Gauss nodes, ``η_q`` and ``η_p`` are the stage values and
    ``∫ ψ_j f dt = h b_j f(c_j)``.  Row ``A_p = 0`` gives ``(φ(0)φ(0)ᵀ + B)(Q - q_i 1) =
    h diag(b) F`` with ``B_jl = ∫ φ_j φ_l'``, so ``A = (φ(0)φ(0)ᵀ + B)⁻¹ diag(b)``.  Row
    ``A_q = 0`` with ``p_{i+1} = p_i + h bᵀG`` gives ``Bᵀ Â = φ(1) bᵀ - diag(b)``, singular
    (kernel: the Legendre polynomial ``P_{s-1}``) and closed by the boundary condition
    ``φ(0)ᵀ Â = 0``.  The result equals :func:`dg_prk_tableau_formula`.
    """
    s = check_int("s", s, 1)
    basis = gauss_basis("lagrange", s)
    c, b = gauss_quadrature(s)
    phi0, phi1 = basis.values(0.0)[0], basis.values(1.0)[0]
    B = mixed_matrix(basis, basis)
    a = np.linalg.solve(np.outer(phi0, phi0) + B, np.diag(b))
    lhs = np.vstack([B.T, phi0[None, :]])
    rhs = np.vstack([np.outer(phi1, b) - np.diag(b), np.zeros((1, s))])
    ahat = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
    name = f"DG({s})"
    tq = tb.ButcherTableau.from_arrays(a, b, c, name=f"{name} q-part", order=2 * s - 1)
    tp = tb.ButcherTableau.from_arrays(ahat, b, c, name=f"{name} p-part", order=2 * s - 1)
    return tb.PartitionedTableau(tq, tp, f"{name} PRK (Gauss-{s} quadrature)", 2 * s - 1)


def dg_prk_tableau_formula(s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(A, Â, b, c)`` from our closed form (not in the paper; checked for ``s = 1..5``):
    ``a_jk = a^Gauss_jk ± ½ P_{s-1}(2c_j - 1) P_{s-1}(2c_k - 1) b_k`` (``+`` for ``A``)."""
    s = check_int("s", s, 1)
    g = tb.gauss(s)
    leg = np.polynomial.legendre.legval(2 * g.c - 1, np.eye(s)[s - 1])
    corr = 0.5 * np.outer(leg, leg) * g.b[None, :]
    return g.a + corr, g.a - corr, g.b, g.c
