"""Variational partitioned Runge--Kutta methods on Lie groups (RKMK-type, over a retraction).

Martín de Diego & Sato Martín de Almagro (2022), §6: for a :class:`vijax.LieGroupSystem` with
left-trivialised Lagrangian ``ℓ(g, ξ)`` and a retraction ``τ`` (:class:`vijax.lie.Exp` or
:class:`vijax.lie.Cayley`), stationarity of the discrete trivialised Hamilton--Pontryagin
action (their eq. (23)) gives, with unknown stage algebra elements ``H^1..H^s`` (Thm 6.1,
eqs. (24)--(30)),

    Ξ^i = h Σ_j a_ij H^j,   G^i = g_k τ(Ξ^i),   V^i = d^Lτ_{Ξ^i} H^i,   ξ = h Σ_j b_j H^j,
    N^i = (d^Lτ_{Ξ^i})* [L*_{G^i} D1ℓ(G^i, V^i) + F^i],   Π^i = (d^Lτ_{Ξ^i})* D2ℓ(G^i, V^i),
    μ_{k+1} = Ad*_{τ(ξ)} [μ_k + h Σ_j b_j (d^Lτ^{-1}_{-Ξ^j})* N^j],
    0 = Π^i + h Σ_j (b_j a_ji / b_i) [N^j + (dd^Lτ_{Ξ^j})*(H^j, Π^j)] - (d^Lτ_ξ)* μ_{k+1},
    g_{k+1} = g_k τ(ξ),

(the residual is their eq. (30) with (29) substituted; ``b_j a_ji / b_i = b_j - â_ij``).  On
``R^n`` (``τ = id``, ``Ad = I``, ``dd^Lτ = 0``) this is the vector-space VPRK of eq. (9); a
test checks the two agree to round-off.  The ``dd^Lτ`` term is what keeps the order: without
it the method drops to order 1 (a test documents this).

Constraints follow their §6.3--§6.4:

* holonomic ``Φ(g) = 0`` (:class:`vijax.HolonomicSystem`): ``N^i`` gains
  ``-(d^Lτ_{Ξ^i})* (L*_{G^i} DΦ)ᵀ Λ^i``, the rows ``Φ(G^i) = 0`` (``i >= 2``) and the tangency
  ``L*DΦ(g_{k+1}) ξ_{k+1} = 0`` at the new node close the system (unknowns ``H``, ``h Λ^i``
  and the node velocity ``ξ_{k+1}``), as in the vector-space RATTLE family;
* nonholonomic ``φ(g, ξ) = 0`` (:class:`vijax.NonholonomicSystem`; their App. F):
  ``N^i`` gains ``(d^Lτ_{Ξ^i})* D2φ(G^i, V^i)ᵀ Λ^i`` with ``Λ^1 = λ_k`` carried as state, and
  the constraint is imposed on the IIIA-built stage momenta
  ``μ^i = Ad*_{τ(Ξ^i)} [μ_k + h Σ_j a_ij (d^Lτ^{-1}_{-Ξ^j})* N^j]`` through
  ``φ(G^i, η^i) = 0``, ``D2ℓ(G^i, η^i) = μ^i`` (``i = 2..s``).  The orders are those of the
  vector-space methods: ``2s - 2`` in ``g`` and ``μ``, ``s`` (even ``s``) or ``s - 1`` (odd
  ``s``) in ``λ``.

The state carries the group element ``q = g_k``, the **body** momentum ``p = μ_k = D2ℓ(g_k,
ξ_k)`` and, with constraints, the node multiplier.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from ... import constraints as cons
from ... import tableaus as tb
from ..._checks import is_traced, refuse
from ..._linalg import mm
from ..._typing import ScalarLike, Vector
from ...lie import AbstractRetraction, Exp
from ...quadrature import lagrange_extrapolation_matrix
from ...solvers import AbstractRootSolver, FixedPoint, Newton, SolverStats
from ...systems import (ForcedSystem, HolonomicSystem, LieGroupSystem, NonholonomicSystem,
                        TimeDependentSystem)
from .._base import AbstractIntegrator, AbstractState, IncompatibleSystemError, accepting
from ..nonholonomic import _check_hypotheses as _check_nonholonomic_hypotheses
from ..vprk import TableauPresets, _as_pair, at_nodes
from ._dynamics import nonholonomic_multiplier

__all__ = ["GroupVPRK", "GroupPRKState"]


class GroupPRKState(AbstractState):
    """``(t, g, μ)`` (``q`` the group element, ``p`` the body momentum), the node body
    velocity ``v``, the node multiplier ``lam`` (empty without constraints) and the last
    step's stage values (``stages`` the ``H^i``, ``lams`` the ``Λ^i``) for the predictor."""

    t: Float[Array, ""]
    q: PyTree
    p: Float[Array, " d"]
    v: Float[Array, " d"]
    lam: Float[Array, " m"]
    stages: Float[Array, "s d"]
    lams: Float[Array, "s m"]


class GroupVPRK(TableauPresets, AbstractIntegrator):
    """Variational PRK over a retraction on a Lie group (Martín de Diego & Sato Martín de
    Almagro (2022), Thm 6.1, §6.3, §6.4 and App. F), for a :class:`vijax.LieGroupSystem`,
    unconstrained, holonomically or nonholonomically constrained.

    Parameters
    ----------
    tableau:
        A :class:`~vijax.tableaus.ButcherTableau` (paired with its symplectic conjugate) or a
        symplectic-conjugate pair.  Constrained systems need Lobatto IIIA--IIIB
        (hypotheses H1--H3).
    retraction:
        :class:`vijax.lie.Exp` (default, every group) or :class:`vijax.lie.Cayley`.
    solver:
        Default: :class:`~vijax.solvers.FixedPoint` preconditioned by the inverse velocity
        Hessian for unconstrained systems, :class:`~vijax.solvers.Newton` with constraints.

    Presets: :meth:`gauss` (order ``2s``), :meth:`lobatto` (order ``2s - 2``), :meth:`midpoint`.
    """

    tableau: tb.PartitionedTableau
    retraction: AbstractRetraction
    solver: AbstractRootSolver | None

    symplectic = True
    required = frozenset({LieGroupSystem})
    supported = frozenset({LieGroupSystem, HolonomicSystem, NonholonomicSystem, ForcedSystem,
                           TimeDependentSystem})

    def __init__(self, tableau, retraction: AbstractRetraction | None = None,
                 solver: AbstractRootSolver | None = None):
        self.tableau = _as_pair(tableau)
        self.retraction = Exp() if retraction is None else retraction
        if not isinstance(self.retraction, AbstractRetraction):
            raise TypeError(f"retraction must be vijax.lie.Exp() or vijax.lie.Cayley(), got "
                            f"{type(self.retraction).__name__}.")
        self.solver = solver

    # -- presets (gauss, lobatto, midpoint from TableauPresets) ------------------------------
    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        from ...lie import Cayley
        # Lobatto first: they take every kind of system (the first preset is the example an
        # error message names)
        out = [(f"GroupVPRK.lobatto({s})", cls.lobatto(s)) for s in (2, 3, 4, 5)]
        out += [("GroupVPRK.lobatto(3, retraction=vj.lie.Cayley())",
                 cls.lobatto(3, retraction=Cayley()))]
        out += [("GroupVPRK.midpoint()", cls.midpoint())]
        return out + [(f"GroupVPRK.gauss({s})", cls.gauss(s)) for s in (2, 3)]

    # -- traits -----------------------------------------------------------------------------
    @property
    def order(self) -> int:
        return self.tableau.order

    @property
    def stages(self) -> int:
        return self.tableau.q.stages

    @property
    def name(self) -> str:
        return f"GroupVPRK[{self.tableau.name}, {self.retraction.name}]"

    @property
    def symmetric(self) -> bool:
        """Only the one-stage midpoint rule: with several stages the RKMK-type stage maps
        ``g_k τ(h Σ_j a_ij H^j)`` are built from the step's start, and on a non-abelian group
        the step with ``-h`` does not invert the step with ``h`` even for a symmetric tableau
        (measured defects 1e-9 for Gauss(2) and 8e-8 for Lobatto(3) at h = 0.1 on the heavy
        top, against 1e-16 for the midpoint rule), as for the RKMK methods of Bogfjellmo &
        Marthinsen (2016) with a finite cut-off."""
        a, b = np.asarray(self.tableau.q.a, float), np.asarray(self.tableau.q.b, float)
        return bool(a.shape == (1, 1) and np.allclose(a, 0.5 * b, atol=1e-12))

    @property
    def multiplier_order(self) -> int:
        """Global order of a nonholonomic multiplier: ``s`` (even ``s``) or ``s - 1``."""
        s = self.stages
        return s if s % 2 == 0 else s - 1

    def force_nodes(self) -> np.ndarray:
        return np.asarray(self.tableau.q.c, dtype=np.float64)

    def force_weights(self) -> np.ndarray:
        return np.asarray(self.tableau.q.b, dtype=np.float64)

    def _fits_constraints(self) -> bool:
        try:
            _check_nonholonomic_hypotheses(self.tableau)
        except ValueError:
            return False
        return True

    def accepts(self, system) -> bool:
        """Any :class:`vijax.LieGroupSystem`; with constraints (holonomic or nonholonomic,
        not both) only for a tableau pair satisfying H1--H3 (Lobatto IIIA--IIIB)."""
        if not super().accepts(system):
            return False
        if isinstance(system, HolonomicSystem) and isinstance(system, NonholonomicSystem):
            return False
        return self._mode(system) == "free" or self._fits_constraints()

    def check_system(self, system) -> None:
        if not super().accepts(system):
            super().check_system(system)
        name = type(system).__name__
        if isinstance(system, HolonomicSystem) and isinstance(system, NonholonomicSystem):
            raise IncompatibleSystemError(
                f"{self.name} takes holonomic or nonholonomic constraints, not both; "
                f"{name} declares both.")
        if self._mode(system) != "free":
            try:
                _check_nonholonomic_hypotheses(self.tableau, self.name,
                                               f" on the constrained {name}",
                                               "GroupVPRK.lobatto(s)")
            except ValueError as err:
                raise IncompatibleSystemError(
                    f"{err} Methods that accept it: "
                    f"{', '.join('vijax.' + c for c in accepting(system))}.") from None
        self.retraction.check(system.group)

    def _mode(self, system) -> str:
        if isinstance(system, NonholonomicSystem):
            return "nonholonomic"
        if isinstance(system, HolonomicSystem):
            return "holonomic"
        return "free"

    def _solver(self, system) -> AbstractRootSolver:
        if self.solver is not None:
            return self.solver
        return FixedPoint() if self._mode(system) == "free" else Newton()

    # -- initial data -----------------------------------------------------------------------
    def check_initial(self, system, q0, v0: Vector, tol: float):
        """Refuse ``ξ0`` off a nonholonomic constraint, or ``(g0, ξ0)`` off a holonomic one
        or its tangency ``L*DΦ(g0) ξ0 = 0``, naming the projection."""
        mode = self._mode(system)
        if mode == "nonholonomic":
            return cons.check_nonholonomic_consistent(system, q0, v0, tol)
        if mode == "holonomic":
            name = type(system).__name__
            gap = jnp.max(jnp.abs(system.holonomic(q0)))
            drift = jnp.max(jnp.abs(system.group.left_jacobian(system.holonomic, q0) @ v0))
            data = (q0, v0)
            for bad, what in ((gap, f"q0 violates {name}.holonomic"),
                              (drift, f"v0 violates the tangency L*DΦ(q0) v0 = 0 of {name}")):
                msg = (f"{what} (> {tol:.1e}); project the initial data onto the constraint "
                       f"(e.g. system.project_velocity(q0, v0) for the velocity).")
                data = refuse(data, ~(bad <= tol) if is_traced(bad) else not float(bad) <= tol,
                              msg, lambda m=msg, x=bad: m.replace("(>", f"by {float(x):.2e} (>"),
                              cons.InconsistentInitialData)
            return data
        return q0, v0

    def init(self, system, t0: ScalarLike, q0, v0: Vector) -> GroupPRKState:
        # (here, not in check_system: simulate caches that check per pair of types)
        if self._mode(system) != "free":
            _check_nonholonomic_hypotheses(self.tableau, "GroupVPRK",
                                           f" on the constrained {type(system).__name__}")
        dtype = v0.dtype
        t0 = jnp.asarray(t0, dtype)
        sys0 = system.at(t0)
        if self._mode(system) == "nonholonomic":
            lam0 = nonholonomic_multiplier(system, t0, q0, v0)
        else:
            m = system.holonomic(q0).shape[0] if self._mode(system) == "holonomic" else 0
            lam0 = jnp.zeros((m,), dtype)
        s = self.stages
        return GroupPRKState(t=t0, q=q0, p=sys0.momentum(q0, v0), v=v0, lam=lam0,
                             stages=jnp.broadcast_to(v0, (s,) + v0.shape),
                             lams=jnp.broadcast_to(lam0, (s,) + lam0.shape))

    # -- the stage equations ----------------------------------------------------------------
    def stage_equations(self, system, state: GroupPRKState, h: ScalarLike, X, force=None,
                        dd_term: bool = True):
        """Residuals of the step at the unknowns ``X = (H, μ, ξ1)`` (``μ`` the impulses
        ``h Λ^i``: ``i = 2..s`` nonholonomic, ``i = 1..s`` holonomic, empty otherwise; ``ξ1``
        the node velocity of the holonomic form, else ``None``), and as auxiliary output
        ``(g_{k+1}, μ_{k+1}, ξ_{k+1})`` (the node velocity ``η^s`` nonholonomic, the unknown
        ``ξ1`` holonomic, ``None`` unconstrained).  ``dd_term=False`` drops the
        ``(dd^Lτ)*`` term (for the test that shows why it is there).  With holonomic
        constraints the state's multiplier starts at zero: it only seeds the predictor, every
        ``Λ^i`` being an unknown of each step."""
        mode = self._mode(system)
        G_ = system.group
        R = self.retraction
        dtype = state.p.dtype
        a, ahat, b = (jnp.asarray(x, dtype) for x in (self.tableau.q.a, self.tableau.p.a,
                                                      self.tableau.q.b))
        H, mus, xi1 = X
        g, mu0 = state.q, state.p
        times = state.t + h * jnp.asarray(self.tableau.q.c, dtype)
        Xi = h * mm(a, H)
        xi = h * mm(b, H)
        abelian = G_.abelian
        if abelian:
            T, D = None, None
            G = jax.vmap(lambda x: G_.compose(g, x))(Xi)
            V = H
        else:
            # per stage τ(Ξ^i), D^i = d^Lτ_{Ξ^i} and the stage velocity V^i = D^i H^i
            T = jax.vmap(lambda x: R.tau(G_, x))(Xi)
            D = jax.vmap(lambda x: R.dtau(G_, x))(Xi)
            G = jax.vmap(lambda t: G_.compose(g, t))(T)
            V = jnp.einsum("ide,ie->id", D, H)
        D1, D2 = at_nodes(system, times, lambda sy, x, y: sy.derivatives(x, y), G, V)
        hF = h * D1 if force is None else h * (D1 + force(G, V))
        if mode == "nonholonomic":
            A = at_nodes(system, times, lambda sy, x, y: sy.constraint_matrix(x, y), G, V)
            imp = jnp.concatenate([(h * state.lam)[None, :], mus])
            hF = hF + jnp.einsum("imd,im->id", A, imp)
        elif mode == "holonomic":
            J = jax.vmap(lambda x: G_.left_jacobian(system.holonomic, x))(G)
            hF = hF - jnp.einsum("imd,im->id", J, mus)
        if abelian:
            hN, Pi, dd, Psi = hF, D2, 0.0, hF
        else:
            hN = jnp.einsum("ide,id->ie", D, hF)                 # (d^Lτ)* hF
            Pi = jnp.einsum("ide,id->ie", D, D2)                 # (d^Lτ)* D2ℓ
            # (dd^Lτ_Ξ)*(H, Π) = [∂_Ξ(d^Lτ_Ξ H)]ᵀ (d^Lτ_Ξ)^{-T} Π, and (d^Lτ)^{-T} Π = D2ℓ
            dd = (jax.vmap(lambda x, y, z: jax.vjp(lambda u: R.dtau(G_, u) @ y, x)[1](z)[0])(
                Xi, H, D2) if dd_term else 0.0)
            # (d^Lτ^{-1}_{-Ξ})* N = (Ad^{-1}_{τ(Ξ)})* (d^Lτ^{-1}_Ξ)* N = Ad*_{τ(Ξ)^{-1}} hF:
            # their eq. (28), no inverse tangent needed
            Psi = jax.vmap(lambda t, f: G_.Ad_star(G_.inverse(t), f))(T, hF)
        tau_xi = R.tau(G_, xi)
        mu1 = G_.Ad_star(tau_xi, mu0 + mm(b, Psi))
        rhs = mu1 if abelian else R.dtau(G_, xi).T @ mu1
        res = Pi + mm(b[None, :] - ahat, hN + h * dd) - rhs[None, :]
        g1 = G_.compose(g, tau_xi)
        if mode == "nonholonomic":
            base = mu0[None, :] + mm(a[1:], Psi)
            stage_mu = base if abelian else jax.vmap(G_.Ad_star)(
                jax.tree_util.tree_map(lambda t: t[1:], T), base)
            eta = at_nodes(system, times[1:], lambda sy, x, m, v: sy.velocity(x, m, v),
                           jax.tree_util.tree_map(lambda x: x[1:], G), stage_mu, V[1:])
            phi = at_nodes(system, times[1:], lambda sy, x, v: sy.nonholonomic(x, v),
                           jax.tree_util.tree_map(lambda x: x[1:], G), eta)
            return (res, phi), (g1, mu1, eta[-1])
        if mode == "holonomic":
            sys1 = system.at(state.t + h)
            rows = jax.vmap(system.holonomic)(jax.tree_util.tree_map(lambda x: x[1:], G)) / h
            tangency = G_.left_jacobian(system.holonomic, g1) @ xi1
            return (res, rows, sys1.momentum(g1, xi1) - mu1, tangency), (g1, mu1, xi1)
        return res, (g1, mu1, None)

    def _predictor(self, state: GroupPRKState, h, mode):
        c = np.asarray(self.tableau.q.c)
        if len(set(self.tableau.q.c_)) < self.stages:
            extrap = np.zeros((self.stages, self.stages))
            extrap[:, -1] = 1.0
        else:
            extrap = lagrange_extrapolation_matrix(c, 1.0 + c)
        extrap = jnp.asarray(extrap, state.p.dtype)
        H0 = mm(extrap, state.stages)
        if mode == "nonholonomic":
            return (H0, h * mm(extrap, state.lams)[1:], None)
        if mode == "holonomic":
            return (H0, h * mm(extrap, state.lams), state.v + H0[-1] - state.stages[-1])
        return (H0, jnp.zeros((0,), state.p.dtype), None)

    def step(self, system, state: GroupPRKState, h: ScalarLike, u=None
             ) -> tuple[GroupPRKState, SolverStats]:
        mode = self._mode(system)
        force = self._force(system, state, h, u)
        X0 = self._predictor(state, h, mode)
        solver = self._solver(system)
        precond = None
        if mode == "free":
            minv = system.at(state.t).inverse_velocity_hessian(state.q, state.v)

            def precond(r):
                return mm(r, minv.T)

            def residual(H):
                return self.stage_equations(system, state, h, (H, X0[1], None), force)

            H, (g1, mu1, _), stats = solver.solve(residual, X0[0], precond, has_aux=True)
            X = (H, X0[1], None)
        else:
            # the node velocity: η^s (nonholonomic) or the unknown ξ_{k+1} (holonomic), from
            # the last residual evaluation
            X, (g1, mu1, v1), stats = solver.solve(
                lambda X: self.stage_equations(system, state, h, X, force), X0, has_aux=True)
        H, mus = X[0], X[1]
        if mode == "nonholonomic":
            lams = jnp.concatenate([state.lam[None, :], mus / h])
        elif mode == "holonomic":
            lams = mus / h
        else:
            lams = state.lams
            v1 = system.at(state.t + h).velocity(g1, mu1, state.v)
        new = GroupPRKState(t=state.t + h, q=g1, p=mu1, v=v1, lam=lams[-1], stages=H,
                            lams=lams)
        return new, stats

    def velocity(self, system, state: GroupPRKState) -> Vector:
        return state.v
