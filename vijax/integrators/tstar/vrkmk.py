"""Variational Runge--Kutta--Munthe-Kaas methods (VRKMK) on ``T*G``.

Bogfjellmo & Marthinsen (2016), §4.1.  The discrete Lagrangian ``L_h = h Σ_i b_i ℓ(Q_i, ξ_i)``
is extremised under the constraints of the RKMK method with ``dexp⁻¹`` cut off after ``r``
terms (their eq. (14)), ``Q_i = exp(X_i) q0``, ``q1 = exp(Y) q0``,
``X_i = h Σ_j a_ij dexp⁻¹_{(r),X_j} ξ_j``, ``Y = h Σ_i b_i dexp⁻¹_{(r),X_i} ξ_i``.  Eliminating
what can be eliminated gives the step, their eq. (16)::

    Λ   = dexp*_{−Y}( μ0 + h Σ_i b_i Ad*_{exp(X_i)} n_i )
    λ_i = −h b_i dexp*_{X_i} n_i + h P*_(r)(X_i, ξ_i)( b_i Λ + Σ_j a_ji λ_j )
    M_i = (1/b_i) (dexp⁻¹_{(r),X_i})* ( b_i Λ + Σ_j a_ji λ_j )
    X_i = h Σ_j a_ij dexp⁻¹_{(r),X_j} ξ_j,      (ξ_i, n_i) = f(exp(X_i) q0, M_i)
    q1  = exp(Y) q0,      μ1 = Ad*_{exp(−Y)}( μ0 + h Σ_i b_i Ad*_{exp(X_i)} n_i )

with unknowns ``(X_i, M_i, λ_i)`` (``3 s d`` scalars: the multipliers ``λ_i`` cannot be
eliminated for ``r > 0``), ``μ`` the spatial momentum, ``dexp`` right-trivialised, and
``P*_(r)(x, ξ)`` the adjoint of the ``x``-derivative of the *truncated* ``dexp⁻¹_{(r),x} ξ``
(taken by :func:`jax.vjp`).  ``exp``, ``dexp*`` and ``Ad*`` are exact (the method is
symplectic only then); only the cut-off ``dexp⁻¹_(r)`` is truncated.

Order (their Thm 5.3 with Props 3.1--3.2): ``min(p_SPRK, r_eff + 2)``, with ``p_SPRK`` the
order of the symplectic partitioned Runge--Kutta method ``(a, b; â, b)``, ``â`` the
symplectic conjugate, and ``r_eff = r + 1`` for even ``r ≥ 2`` (``B_{odd} = 0``, so ``r = 2k``
and ``2k + 1`` are the same method), ``r_eff = r`` otherwise: Gauss with ``s`` stages and
``r = 2s − 2`` has order ``2s``; ``r = 0`` (the format of Bou-Rabee & Marsden and of
Celledoni, Marthinsen & Owren) is at most second order.  On an abelian group the method is
the SPRK method ``(a, b; â, b)``.
"""

from __future__ import annotations

from typing import Optional

import operator

import equinox as eqx
import jax
import jax.numpy as jnp

from ... import tableaus as tb
from ..._typing import ScalarLike
from ...solvers import AbstractRootSolver, SolverStats
from ...systems import LieGroupSystem
from .._base import AbstractIntegrator
from ._method import AbstractTStarMethod
from ._common import (TStarState, check_weights,
                      dexp_star, dexpinv_truncated, dexpinv_truncated_vjp, safe_div,
                      spatial_field, sprk_order, stage_field, to_spatial)

__all__ = ["VRKMK", "kutta3_tableau", "vrkmk_order"]


def kutta3_tableau() -> tb.ButcherTableau:
    """Kutta's explicit third-order tableau, Bogfjellmo & Marthinsen (2016), Table 1(b):
    ``c = (0, 1/2, 1)``, ``A = [[0, 0, 0], [1/2, 0, 0], [−1, 2, 0]]``, ``b = (1/6, 2/3, 1/6)``
    (the VRKMK method built on it is implicit)."""
    a = [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0], [-1.0, 2.0, 0.0]]
    return tb.ButcherTableau.from_arrays(a, [1 / 6, 2 / 3, 1 / 6], [0.0, 0.5, 1.0],
                                         "Kutta(3)", 3)


def vrkmk_order(tableau: tb.ButcherTableau, r: int) -> int:
    """``min(p_SPRK, r_eff + 2)`` (Bogfjellmo & Marthinsen (2016), Thm 5.3 and Props 3.1,
    3.2): the order of VRKMK with this tableau and cut-off ``r``."""
    r_eff = r + 1 if (r >= 2 and r % 2 == 0) else r
    return sprk_order(tableau, r_eff + 2)


class VRKMK(AbstractTStarMethod):
    """Variational Runge--Kutta--Munthe-Kaas method on ``T*G``, Bogfjellmo & Marthinsen
    (2016), eq. (16): symplectic, of order ``min(p_SPRK, r_eff + 2)`` (their Thm 5.3).

    Parameters
    ----------
    tableau:
        A :class:`~vijax.tableaus.ButcherTableau` with every ``b_i ≠ 0`` (explicit tableaus
        are allowed; the method is implicit anyway).
    r:
        The RKMK cut-off of ``dexp⁻¹`` (``r ≥ 0``).  Default ``max(p − 2, 0)`` with ``p`` the
        tableau's order, the smallest cut-off that keeps the order (their Thm 5.3).
    solver:
        Root solver for the ``3 s d`` stage unknowns ``(X_i, M_i, λ_i)``.  Default (``None``):
        the fixed-point iteration of the paper (§6), ``(X, M, λ) ← Φ(X, M, λ)``, run to
        round-off with at most 300 updates (:func:`~vijax.integrators.tstar.default_solver`);
        it contracts when ``h ‖∂f/∂μ‖`` and ``h ‖ξ‖`` are small.
        ``solver=vj.solvers.Newton()`` for stiff problems (large inverse inertia) or large
        steps.

    Presets: :meth:`midpoint`, :meth:`kutta3`, :meth:`gauss` (Table 1 of the paper).

    The state (:class:`TStarState`) holds the group element ``q``, the **body** momentum
    ``p = μ̄ = D2ℓ(q, ξ)`` and the last step's stage unknowns (the next predictor); ``init``
    takes the group element and the body velocity.
    """

    tableau: tb.ButcherTableau
    r: int = eqx.field(static=True)
    solver: Optional[AbstractRootSolver]
    _order: int = eqx.field(static=True)

    def __init__(self, tableau: tb.ButcherTableau, r: int | None = None,
                 solver: AbstractRootSolver | None = None):
        check_weights(tableau, "VRKMK")
        if r is None:
            r = max(tableau.order - 2, 0)
        try:
            r = operator.index(r)
        except TypeError:
            raise TypeError(f"VRKMK: the cut-off r must be an integer, got {r!r}") from None
        if r < 0:
            raise ValueError(f"VRKMK: the cut-off r must be >= 0 (r = 0: dexp⁻¹ replaced by the "
                             f"identity), got r = {r}")
        self.tableau = tableau
        self.r = r
        self.solver = solver
        self._order = vrkmk_order(tableau, r)

    # -- presets ----------------------------------------------------------------------------
    @classmethod
    def midpoint(cls, **kwargs) -> "VRKMK":
        """Table 1(a): Gauss(1), ``r = 0``; order 2, symmetric (Bogfjellmo & Marthinsen
        (2016), Example 3.3; identical to :meth:`vijax.integrators.tstar.VCG.midpoint`)."""
        return cls(tb.gauss(1), 0, **kwargs)

    @classmethod
    def kutta3(cls, **kwargs) -> "VRKMK":
        """Table 1(b): Kutta's third-order tableau, ``r = 1``; order 3."""
        return cls(kutta3_tableau(), 1, **kwargs)

    @classmethod
    def gauss(cls, s: int, r: int | None = None, **kwargs) -> "VRKMK":
        """Gauss--Legendre with ``s`` stages and cut-off ``r`` (default ``2s − 2``); order
        ``2s`` (Table 1(a), (c), (d) for ``s = 1, 2, 3``)."""
        return cls(tb.gauss(s), 2 * s - 2 if r is None else r, **kwargs)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        return ([("VRKMK.midpoint()", cls.midpoint()), ("VRKMK.kutta3()", cls.kutta3())]
                + [(f"VRKMK.gauss({s})", cls.gauss(s)) for s in (1, 2, 3)])

    # -- traits -----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"VRKMK[{self.tableau.name}, r={self.r}]"

    @property
    def symmetric(self) -> bool:
        """Only the midpoint rule (one stage, ``a = 1/2``, ``b = 1``, ``r = 0``): Gauss with a
        finite cut-off ``r > 0`` is symmetric only up to ``O(h^{r+3})``."""
        return (self.stages == 1 and self.r == 0 and self.tableau.a_[0][0] == 0.5
                and self.tableau.b_[0] == 1.0)

    # -- stepping -----------------------------------------------------------------------------
    def _coefficients(self, dtype):
        t = self.tableau
        ahat = tb.symplectic_conjugate(t).a
        return tuple(jnp.asarray(x, dtype) for x in (t.a, t.b, t.c, ahat.sum(axis=1)))

    def init(self, system: LieGroupSystem, t0: ScalarLike, q0, v0) -> TStarState:
        """State at ``t0`` from the group element ``q0`` and the **body** velocity ``v0``."""
        self.check_system(system)
        G = system.group
        v0 = jnp.asarray(v0)
        t0 = jnp.asarray(t0, v0.dtype)
        sys0 = system.at(t0)
        p0 = sys0.momentum(q0, v0)
        mu0 = to_spatial(G, q0, p0)
        xi0, n0 = spatial_field(sys0, q0, mu0)
        _, b, c, chat = self._coefficients(v0.dtype)
        # Predictor of the first step (abelian form of eq. (16), per unit step): X_i = h c_i ξ0,
        # M_i = μ0 + h ĉ_i (n0 − ad*_{ξ0} μ0), λ_i = −h b_i n0.
        rate = n0 - G.ad_star(xi0, mu0)
        stages = (c[:, None] * xi0[None, :], chat[:, None] * rate[None, :],
                  -b[:, None] * n0[None, :])
        return TStarState(t=t0, q=q0, p=p0, stages=stages)

    def step(self, system: LieGroupSystem, state: TStarState, h: ScalarLike, u=None
             ) -> tuple[TStarState, SolverStats]:
        self.check_system(system)
        G = system.group
        r = self.r
        q0, p0 = state.q, state.p
        dtype = p0.dtype
        h = jnp.asarray(h, dtype)
        a, b, c, _ = self._coefficients(dtype)
        mu0 = to_spatial(G, q0, p0)
        force = self._force(system, state, h, u)
        times = state.t + h * c        # the stage times (the clock of a TimeDependentSystem)

        def update(z):
            X, M, lam = z
            E = jax.vmap(G.exp)(X)
            Q = jax.vmap(lambda e: G.compose(e, q0))(E)
            xi, n, _, nbar = stage_field(system, Q, M, force, times)
            eta = jax.vmap(lambda x, v: dexpinv_truncated(G, r, x, v))(X, xi)
            Y = h * (b @ eta)
            nu = mu0 + h * (b @ jax.vmap(G.Ad_star)(E, n))
            Lam = dexp_star(G, -Y, nu)
            w = b[:, None] * Lam[None, :] + a.T @ lam          # b_i Λ + Σ_j a_ji λ_j
            P, D = jax.vmap(lambda x, v, wi: dexpinv_truncated_vjp(G, r, x, v, wi))(X, xi, w)
            lam_new = -h * b[:, None] * jax.vmap(lambda x, v: dexp_star(G, x, v))(X, n) + h * P
            return (h * (a @ eta), D / b[:, None], lam_new), (Y, p0 + h * (b @ nbar))

        def residual(z):
            new, aux = update(z)
            return jax.tree_util.tree_map(lambda x, y: x - y, z, new), aux

        Xh, Dh, lh = state.stages
        z0 = (h * Xh, mu0[None, :] + h * Dh, h * lh)
        z, (Y, p1), stats = self._solver(dtype).solve(residual, z0, has_aux=True)
        X, M, lam = z
        q1 = G.compose(G.exp(Y), q0)
        # μ̄1 = Ad*_{q1} μ1 with μ1 = Ad*_{exp(−Y)} ν is Ad*_{q0} ν = μ̄0 + h Σ b_i Ad*_{Q_i} n_i:
        # the body form of the momentum update (no round trip of μ̄0 through the frame).
        stages = (safe_div(X, h), safe_div(M - mu0[None, :], h), safe_div(lam, h))
        new = TStarState(t=state.t + h, q=q1, p=p1, stages=stages)
        return new, stats

