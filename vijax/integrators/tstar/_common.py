"""Shared pieces of the symplectic Lie-group methods on ``T*G`` of Bogfjellmo & Marthinsen
(2016): the map ``f`` from a :class:`vijax.LieGroupSystem`, the right-trivialised tangent
maps of ``exp`` in the paper's convention, the truncated ``dexp⁻¹`` of RKMK, the state, the
tableau checks and the order of the symplectic partitioned Runge--Kutta method of a tableau.

Conventions (Bogfjellmo & Marthinsen (2016), §1.2--1.3).  Everything in the step equations is
**right-trivialised**: ``q̇ = ξ·q``, ``T*G ≅ G × g*`` by ``(q, p_q) ↦ (q, μ = p_q·q⁻¹)`` (``μ``
the *spatial* momentum), ``dexp`` with ``d/dt exp(x(t)) = (dexp_x ẋ)·exp(x)``, i.e.
``dexp_x = Σ_k ad_x^k/(k+1)! = id + ½ ad_x + …``.  The groups of :mod:`vijax.lie` carry the
*left*-trivialised tangent (``exp(x)⁻¹ d/dt exp(x) = d^L exp_x ẋ``); the paper's map is
``d^R exp_x = Ad_{exp x} d^L exp_x = d^L exp_{−x}``, i.e. ``group.dexp(-x)`` here.  A vijax
state stores the *body* momentum ``μ̄ = Ad*_q μ = D2ℓ(q, ξ)`` of the left-trivialised
Lagrangian; the step converts to the spatial ``μ = Ad*_{q⁻¹} μ̄`` and back.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from ... import tableaus as tb
from ...solvers import FixedPoint, default_tolerance
from ...systems import ForcedSystem, LieGroupSystem, TimeDependentSystem
from .._base import AbstractState
from .._prk_core import at_nodes

__all__ = [
    "TStarState",
    "bernoulli",
    "dexp_star",
    "dexpinv_truncated",
    "dexpinv_truncated_vjp",
    "spatial_field",
    "stage_field",
    "to_spatial",
    "to_body",
    "check_weights",
    "safe_div",
    "sprk_order",
    "SUPPORTED",
    "REQUIRED",
    "default_solver",
]

#: What every method of this subpackage accepts and needs.
SUPPORTED = frozenset({LieGroupSystem, ForcedSystem, TimeDependentSystem})
REQUIRED = frozenset({LieGroupSystem})


#: The default fixed point's tolerance, as a fraction of the library's (10 eps).
_TOL_FRACTION = 1e-5
#: Its iteration cap.
MAX_FIXED_POINT_STEPS = 300


def default_solver(dtype) -> FixedPoint:
    """The fixed-point iteration of Bogfjellmo & Marthinsen (2016), §6, run to round-off.

    The paper stops at a residual of 1e-11, which at small steps is the error floor of its
    sixth-order methods (their Fig. 2).  Here the iteration goes on until its increments stop
    decreasing at round-off: :class:`vijax.solvers.FixedPoint` with a tolerance ``1e-6`` times
    the library's ``10 eps``, so that its stall rule (a non-decreasing increment below ``1e6``
    tolerances is the round-off floor) fires at ``10 eps (1 + |x|)``.  With the library's own
    tolerance that rule fires early when the iteration contracts with complex eigenvalues (its
    increments then do not decrease monotonically): VRKMK Kutta3 at ``h = 0.1`` on the dipole
    stops with an error of 1e-13 in the momentum, VCG triple jump after five steps 1e-11 in the
    conserved ``μ3``, both at round-off (1e-17) with this choice, for 30-50 % more iterations.
    No straight-line updates before the loop (``min_steps=0``): with 15 to 40 updates per step
    they save little and each one is a copy of the stage equations in the compiled program.
    """
    # In float32 the round-off floor of the stage equations (about 6e-8) is above what the
    # stall rule accepts at this fraction, so single precision keeps the library tolerance.
    fraction = _TOL_FRACTION if jnp.finfo(dtype).eps < 1e-10 else 1.0
    tol = fraction * default_tolerance(dtype)
    return FixedPoint(rtol=tol, atol=tol, max_steps=MAX_FIXED_POINT_STEPS, min_steps=0)


class TStarState(AbstractState):
    """``(t, q, p)`` with ``q = g`` the group element and ``p = μ̄ = D2ℓ(g, ξ) = Ad*_g μ`` the
    **body** momentum, plus ``stages``: the last step's stage unknowns, normalised by the step
    size where they scale with it, from which the next step's predictor is built (the warm
    start; the converged step does not depend on it)."""

    t: Float[Array, ""]
    q: PyTree
    p: Float[Array, " d"]
    stages: tuple


# --------------------------------------------------------------------------------------------
# Maps on the algebra, in the paper's right-trivialised convention
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def bernoulli(k: int) -> Fraction:
    """The Bernoulli number ``B_k`` with ``B_1 = −1/2`` (exact): the coefficients of
    ``dexp⁻¹_x = Σ_k (B_k/k!) ad_x^k`` (Bogfjellmo & Marthinsen (2016), §1.2)."""
    if k < 0:
        raise ValueError(f"k must be non-negative, got {k}")
    if k == 0:
        return Fraction(1)
    return -sum((math.comb(k + 1, j) * bernoulli(j) for j in range(k)), Fraction(0)) / (k + 1)


def dexp_star(group, x, w):
    """``dexp*_x w`` for the paper's right-trivialised ``dexp_x = Σ ad_x^k/(k+1)!``: on a vijax
    group (left-trivialised ``dexp``) that is ``group.dexp(-x)ᵀ w``.  Exact: the symplecticity
    of the methods depends on it (Bogfjellmo & Marthinsen (2016), §6)."""
    if group.commutative:
        return w
    return group.dexp(-x).T @ w


def dexpinv_truncated(group, r: int, x, xi):
    """The RKMK cut-off ``dexp⁻¹_{(r),x} ξ = Σ_{k=0}^{r} (B_k/k!) ad_x^k ξ`` of the
    right-trivialised ``dexp⁻¹`` (Bogfjellmo & Marthinsen (2016), §4.1, eq. (14)); ``r = 0`` is
    the identity, and ``r = 2k``, ``2k + 1`` give the same map (``B_odd = 0`` beyond ``B_1``).
    It is a defining part of VRKMK, not an approximation of the exact ``dexp⁻¹``."""
    if r == 0 or group.commutative:
        return xi
    out = xi
    term = xi
    for k in range(1, r + 1):
        term = group.ad_apply(x, term)
        coeff = bernoulli(k) / math.factorial(k)
        if coeff != 0:
            out = out + float(coeff) * term
    return out


def dexpinv_truncated_vjp(group, r: int, x, xi, w):
    """``(P*_(r)(x, ξ) w, (dexp⁻¹_{(r),x})* w)``: the adjoints of the ``x``- and
    ``ξ``-derivatives of ``(x, ξ) ↦ dexp⁻¹_{(r),x} ξ`` applied to ``w`` -- one
    :func:`jax.vjp`, the exact derivative of the truncated polynomial (the closed form is
    Bogfjellmo & Marthinsen (2016), eq. (15) and §4.1)."""
    _, vjp = jax.vjp(lambda a, b: dexpinv_truncated(group, r, a, b), x, xi)
    return vjp(w)


# --------------------------------------------------------------------------------------------
# The map f of the paper, from a left-trivialised Lagrangian
# --------------------------------------------------------------------------------------------


def to_spatial(group, q, mubar):
    """``μ = Ad*_{q⁻¹} μ̄``: body to spatial momentum."""
    return group.Ad_star(group.inverse(q), mubar)


def to_body(group, q, mu):
    """``μ̄ = Ad*_q μ``: spatial to body momentum."""
    return group.Ad_star(q, mu)


def _body_field(system: LieGroupSystem, q, mubar):
    """Body velocity ``ξ_b`` with ``D2ℓ(q, ξ_b) = μ̄`` and body force
    ``n̄ = L*_q D1ℓ(q, ξ_b) + ad*_{ξ_b} μ̄`` (the Euler--Poincaré right-hand side)."""
    G = system.group
    xib = system.velocity(q, mubar)
    return xib, system.d1_lagrangian(q, xib) + G.ad_star(xib, mubar)


def stage_field(system: LieGroupSystem, Q, M, force=None, times=None):
    """The paper's ``(ξ_i, n_i) = f(Q_i, M_i)`` at stacked stages (``Q`` a batch of group
    elements, ``M`` ``(s, d)`` spatial momenta), and the body forms ``(ξ̄_i, n̄_i)``;
    ``times``: the stage times, where the Lagrangian is evaluated (``system.at(t_i)``: the
    clock of a :class:`vijax.TimeDependentSystem`, the discrete Lagrangian's quadrature at its
    nodes, Marsden & West (2001), Part 4), or ``None``.

    ``f`` (Bogfjellmo & Marthinsen (2016), eqs. (4)--(5)) is, for the right-trivialised
    Lagrangian ``ℓ_R(q, ξ_s) = ℓ(q, Ad_{q⁻¹} ξ_s)``, ``f(q, D2ℓ_R(q, ξ_s)) = (ξ_s,
    ∇_η ℓ_R(exp(η) q, ξ_s)|_{η=0})``.  With ``exp(η) q = q exp(Ad_{q⁻¹} η)`` this is
    ``f1 = Ad_q ξ_b`` and ``f2 = Ad*_{q⁻¹}(L*_q D1ℓ + ad*_{ξ_b} μ̄)`` with ``μ̄ = Ad*_q μ`` and
    ``ξ_b`` the inverse Legendre map (autodiff of ``ℓ`` by the system).  ``force(Q, ξ̄)``
    (:func:`vijax.integrators.stage_force`) adds the body force of a
    :class:`vijax.ForcedSystem` to ``n̄`` (Lagrange--d'Alembert).  Returns
    ``(ξ, n, ξ̄, n̄)``, each ``(s, d)``."""
    G = system.group
    mubar = jax.vmap(G.Ad_star)(Q, M)
    xib, nbar = at_nodes(system, times, _body_field, Q, mubar)
    if force is not None:
        nbar = nbar + force(Q, xib)
    xi = jax.vmap(G.Ad_apply)(Q, xib)
    n = jax.vmap(lambda q, v: to_spatial(G, q, v))(Q, nbar)
    return xi, n, xib, nbar


def spatial_field(system: LieGroupSystem, q, mu):
    """``f(q, μ) = (f1, f2) ∈ g × g*`` of Bogfjellmo & Marthinsen (2016), eqs. (4)--(5), at
    one point ``(q, μ)`` (spatial momentum): the problem input of the methods on ``T*G``; the
    right-trivialised Hamiltonian ODE is ``q̇ = f1·q``, ``μ̇ = f2 − ad*_{f1} μ`` (eq. (5))."""
    xi, n, _, _ = stage_field(system, jax.tree_util.tree_map(lambda a: a[None], q), mu[None])
    return xi[0], n[0]


# --------------------------------------------------------------------------------------------
# Tableau checks
# --------------------------------------------------------------------------------------------


def check_weights(tableau, family: str) -> None:
    """Refuse a tableau that is not a :class:`~vijax.tableaus.ButcherTableau` or has a zero
    weight: the step equations divide by every ``b_i`` (Bogfjellmo & Marthinsen (2016),
    eqs. (16) and (18))."""
    if not isinstance(tableau, tb.ButcherTableau):
        raise TypeError(f"{family} expects a vijax.tableaus.ButcherTableau, got "
                        f"{type(tableau).__name__}; e.g. {family}(vijax.tableaus.gauss(2)).")
    zero = [i for i, bi in enumerate(tableau.b_) if bi == 0.0]
    if zero:
        raise ValueError(
            f"{family} needs every weight b_i nonzero: its step equations divide by b_i "
            f"(Bogfjellmo & Marthinsen (2016), eqs. (16) and (18)), but {tableau.name} has "
            + ", ".join(f"b[{i}] = 0" for i in zero)
            + ". Choose a tableau with nonzero weights (Gauss, or an explicit tableau such as "
              "Kutta's third-order method).")


def _bicoloured_trees(max_order: int):
    """Rooted trees with vertices of two colours, by order: each ``(colour, children)`` with
    ``children`` a sorted tuple of indices into the flat list.  Returns the flat list of
    ``(order, colour, children)`` (duplicates of a condition are harmless)."""
    flat: list[tuple[int, int, tuple]] = []
    by_order: dict[int, list[int]] = {}

    def multisets(total: int, start: int, pool: list[int]):
        # non-decreasing index sequences from pool[start:] whose orders sum to total
        if total == 0:
            yield ()
            return
        for k in range(start, len(pool)):
            idx = pool[k]
            o = flat[idx][0]
            if o <= total:
                for rest in multisets(total - o, k, pool):
                    yield (idx,) + rest

    for n in range(1, max_order + 1):
        pool = [i for m in range(1, n) for i in by_order.get(m, [])]
        entries = [(n, colour, children) for colour in (0, 1)
                   for children in multisets(n - 1, 0, pool)]
        by_order[n] = list(range(len(flat), len(flat) + len(entries)))
        flat.extend(entries)
    return flat


def sprk_order(tableau, max_order: int) -> int:
    """Order (at most ``max_order``) of the partitioned Runge--Kutta method ``(a, b; â, b)``
    with ``â`` the symplectic conjugate ``b_i â_ij + b_j a_ji = b_i b_j``: the largest ``p``
    with ``Σ b_i φ_i(t) = 1/γ(t)`` for every bicoloured tree ``t`` of order ``≤ p`` (Hairer,
    Lubich & Wanner (2006), §III.2).  It bounds the order of both methods on ``T*G``: on an
    abelian group they are this method (Bogfjellmo & Marthinsen (2016), §5).  A
    self-conjugate tableau (Gauss) is its Runge--Kutta method, of the tableau's order."""
    a, b = tableau.a, tableau.b
    ahat = tb.symplectic_conjugate(tableau).a
    limit = min(max_order, tableau.order) if tableau.order > 0 else max_order
    if np.max(np.abs(ahat - a)) <= 1e-14:
        return limit
    return _sprk_order(tuple(map(tuple, a)), tuple(b), tuple(map(tuple, ahat)), min(limit, 8))


@functools.lru_cache(maxsize=None)
def _sprk_order(a, b, ahat, max_order: int) -> int:
    a, b, ahat = np.array(a), np.array(b), np.array(ahat)
    mats = (a, ahat)
    trees = _bicoloured_trees(max_order)
    g: list[np.ndarray] = []
    gamma: list[float] = []
    worst = {}
    for order, colour, children in trees:
        v = np.ones_like(b)
        gm = float(order)
        for c in children:
            v = v * (mats[trees[c][1]] @ g[c])
            gm *= gamma[c]
        g.append(v)
        gamma.append(gm)
        worst[order] = max(worst.get(order, 0.0), abs(float(b @ v) - 1.0 / gm))
    p = 0
    for order in range(1, max_order + 1):
        if worst[order] > 1e-12:
            break
        p = order
    return p


def safe_div(x, h):
    """``x / h``, or ``0`` where ``h == 0`` (the normalised warm start of a zero step)."""
    hs = jnp.where(h == 0, jnp.ones_like(h), h)
    return jnp.where(h == 0, jnp.zeros_like(x), x / hs)
