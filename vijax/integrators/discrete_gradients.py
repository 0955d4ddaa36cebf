"""Energy-preserving discrete-gradient integrators for nonholonomic systems.

After Celledoni, Farré Puiggalí, Høiseth & Martín de Diego (2016).  A mechanical system
``L = ½ vᵀ G(q) v - V(q)`` with linear constraints ``A(q) v = 0`` (one-forms ``μ^α``, the rows
of ``A``) is, on the dual ``D*`` of the constraint distribution ``D = span{X_a}``, the
skew-gradient system (their eqs. (8)--(9))

    ζ' = Π(ζ) ∇𝓗(ζ),   ζ = (q, ρ),   Π = [[0, X], [-Xᵀ, Λ(q, ρ)]],
    𝓗(q, ρ) = ½ ρᵀ g_D(q)^{-1} ρ + V(q),   g_D = Xᵀ G X,

with ``Λ_ab = -C^c_ab ρ_c`` the nonholonomic bracket.  A discrete-gradient step (their eq. (14))

    (ζ' - ζ) / h = Π(ζ̄) ∇̄𝓗(ζ, ζ'),   ζ̄ = (ζ + ζ') / 2,

keeps ``𝓗`` exactly (to round-off and the solver tolerance) and, because ``Π`` is taken at a
single point, the discrete constraint ``A(q̄)(q' - q) = 0`` exactly (their Remark 3.3); the
node velocities ``v = X g_D^{-1} ρ`` lie in ``D`` by construction.  Three discrete gradients:
the averaged vector field (AVF, their eq. (11), by Gauss--Legendre quadrature), Gonzalez's
midpoint discrete gradient (eq. (12)) and the Itoh--Abe coordinate increment (eq. (13)).  With
AVF or Gonzalez the step is symmetric, hence of order 2; Itoh--Abe is of order 1.

The reduced form is built from the original data only (their §3.3, the "-R" methods): the
frame ``X(q)`` is the last ``m`` columns of a Householder QR of ``A(q)ᵀ`` whose reflector signs
are frozen within a step (computed at ``q_k``), the bracket is ``Λ = M - Mᵀ`` with
``M_ab = p_j ∂_i X_a^j X_b^i`` at ``p = p(q, ρ)`` (their eq. (17)), the maps
``p = G X g_D^{-1} ρ`` and ``ρ = Xᵀ p`` are their eqs. (16a)--(16b), and every derivative
(``∂X/∂q``, ``∇𝓗``, Newton Jacobians) comes from :mod:`jax` autodiff.  A system may supply an
analytic frame instead (``frame="system"``, read from ``system.distribution_frame(q)``).

The full-space form with multipliers (their eq. (15), "GONZALEZ-F") works on ``T*Q``:

    q' - q = h ∇̄_p H,   p' - p = h(-∇̄_q H + A(q̄)ᵀ λ),   A(q̄) ∇̄_p H = 0;

it keeps ``H`` but not the constraint.

Forcing (:class:`vijax.ForcedSystem`): the force ``F`` at the step midpoint
``(t + h/2, q̄, (q' - q)/h)`` joins the ``q``-component of the gradient with a minus sign,
``ζ' - ζ = h Π(ζ̄)(∇̄𝓗 - (F, 0))`` (``p' - p`` gains ``h F`` in the full form), so that the
discrete work balance ``𝓗(ζ') - 𝓗(ζ) = F · (q' - q)`` holds exactly (our derivation from
the skew symmetry of ``Π``).
"""

from __future__ import annotations

from typing import Callable, Literal, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import _linalg
from .._linalg import mm
from ..constraints import check_nonholonomic_consistent
from .._typing import ScalarLike, Vector
from ..quadrature import gauss_quadrature
from ..solvers import AbstractRootSolver, FixedPoint, Newton, SolverStats, StartAsRoot
from ..systems import ForcedSystem, MechanicalSystem, NonholonomicSystem, TimeDependentSystem
from ._base import (AbstractIntegrator, AbstractState, IncompatibleSystemError, accepting,
                    with_fields)

__all__ = ["DiscreteGradient", "DiscreteGradientState", "householder_frame", "frame_signs",
           "avf_gradient", "gonzalez_gradient", "itoh_abe_gradient", "ReducedForm",
           "require_linear_constraints", "check_nonholonomic_consistent",
           "skew_gradient_step", "constraint_forms", "quotient_round_off"]

GRADIENTS = ("avf", "gonzalez", "itoh_abe")


# --------------------------------------------------------------------------------------------
# Householder frame of the constraint distribution
# --------------------------------------------------------------------------------------------
def _householder(At, signs=None):
    """Complete Householder QR of ``At`` (``n x k``): ``(Q, signs)``, ``Q`` orthogonal with
    ``Q[:, :k]`` spanning the columns of ``At``.  ``signs`` (``k``, entries ±1) fixes the
    reflector signs ``w̃_c = R_cc + s_c σ``; ``None`` takes ``s_c = sign(R_cc)`` (the stable
    choice; Celledoni et al. (2016), Algorithm 1)."""
    n, k = At.shape
    R, Q = At, jnp.eye(n, dtype=At.dtype)
    # Plain reductions and dots here: written with the fusible small products of
    # vijax._linalg (fewer kernels: 34 against 36 per fixed-point update) the Gonzalez-R step
    # on the CVT gearbox ran 1.73x slower (10.6 against 6.1 us, both in one process), the
    # quartic system's 1.09x; the frame is differentiated twice (its q-derivative inside the
    # residual), where the small products' tangent rules cost more than they save.
    chosen = []
    rows = jnp.arange(n)
    for c in range(k):
        col = jnp.where(rows >= c, R[:, c], 0.0)
        sigma = jnp.sqrt(jnp.sum(col ** 2))
        if signs is None:
            s = jax.lax.stop_gradient(jnp.where(R[c, c] >= 0, 1.0, -1.0).astype(At.dtype))
        else:
            s = signs[c]
        chosen.append(s)
        w = col + (rows == c).astype(At.dtype) * (s * sigma)
        w = w / jnp.sqrt(jnp.sum(w ** 2))
        # (reductions, not dots: XLA:CPU runs the batched products of a vmap over quadrature
        # nodes through YNNPACK library calls)
        R = R - 2.0 * w[:, None] * jnp.sum(w[:, None] * R, axis=0)[None, :]
        Q = Q - 2.0 * jnp.sum(Q * w[None, :], axis=1)[:, None] * w[None, :]
    return Q, jnp.stack(chosen) if k else jnp.zeros((0,), At.dtype)


def frame_signs(At: Float[Array, "n k"]) -> Float[Array, " k"]:
    """The reflector signs ``s_c = sign(R_cc)`` of the Householder QR of ``At`` (to be frozen
    over one step)."""
    return _householder(At)[1]


def householder_frame(At: Float[Array, "n k"], signs: Float[Array, " k"]) -> Float[Array, "n m"]:
    """An orthonormal basis ``X`` (``n x m``, ``m = n - k``) of the orthogonal complement of
    the columns of ``At``: the last ``m`` columns of its complete Householder QR with the
    reflector signs ``signs`` (Celledoni et al. (2016), §3.3).  A smooth function of ``At``
    for fixed signs, differentiated by :mod:`jax` autodiff."""
    k = At.shape[1]
    return _householder(At, signs)[0][:, k:]


# --------------------------------------------------------------------------------------------
# Discrete gradients (Celledoni et al. (2016), eqs. (10)-(13))
# --------------------------------------------------------------------------------------------
def avf_gradient(H: Callable, x: Vector, x1: Vector, nodes: int = 8,
                 grad: Optional[Callable] = None) -> Vector:
    """Averaged vector field ``∫_0^1 ∇H((1-ξ)x + ξx') dξ`` (eq. (11)) by ``nodes``-point
    Gauss--Legendre quadrature (exact for polynomial ``H`` of degree ``<= 2 nodes``).
    ``grad`` is ``∇H`` (default ``jax.grad(H)``)."""
    grad = jax.grad(H) if grad is None else grad
    c, b = gauss_quadrature(nodes)
    c, b = jnp.asarray(c, x.dtype), jnp.asarray(b, x.dtype)
    pts = (1.0 - c)[:, None] * x[None, :] + c[:, None] * x1[None, :]
    return b @ jax.vmap(grad)(pts)


def _energy_round_off(x: Vector):
    """The round-off of an energy difference ``H(x') - H(x)`` near ``x``, relative to the
    energy scale: ``eps (1 + |x|_∞)``.  ``H`` is evaluated at arguments each known to
    ``eps |x_i|``, so a large coordinate (a pendulum angle that has run away: ``q3 = -1.9e4``
    on the CVT gearbox at ``t = 1.2e4``) carries its round-off into every energy."""
    return jnp.finfo(x.dtype).eps * (1.0 + jnp.max(jnp.abs(x)))


def _quotient_cut(kind: str, x: Vector):
    """The increment below which a discrete gradient drops its difference quotient.
    Gonzalez: ``|Δ| <= (24 eps (1 + |x|_∞))^(1/3)``, where the energy the midpoint gradient
    loses, ``H(x') - H(x) - ∇H(x̄)·Δ = D³H(x̄)[Δ, Δ, Δ] / 24 + O(|Δ|⁵)``, falls below the
    round-off of the energy difference (:func:`_energy_round_off`) that the quotient divides
    by ``|Δ|`` (third derivatives of order one).  Itoh--Abe, per coordinate:
    ``|Δ_i| <= (0.02 eps (1 + |x|_∞))^(1/2)``, where the energy lost by taking ``∂H/∂x_i`` at
    the edge's start instead of the quotient, ``∂²H/∂x_i² Δ_i² / 2``, is a hundredth of the
    same round-off: dropped quotients err in one direction where round-off does not (at the
    balance point, ``(2 eps (1 + |x|_∞))^(1/2)``, a float32 CVT run of 300 steps had 7.1e-5
    energy error against 4.8e-6 here)."""
    if kind == "gonzalez":
        return (24.0 * _energy_round_off(x)) ** (1.0 / 3.0)
    return jnp.sqrt(0.02 * _energy_round_off(x))


def gonzalez_gradient(H: Callable, x: Vector, x1: Vector, grad_mid: Optional[Vector] = None,
                      H_x: Optional[Vector] = None) -> Vector:
    """Gonzalez's midpoint discrete gradient (eq. (12)):
    ``∇H(x̄) + [H(x') - H(x) - ∇H(x̄)·Δ] Δ / |Δ|²``, and ``∇H(x̄)`` when ``|Δ|`` is below
    ``(24 eps (1 + |x|_∞))^(1/3)`` (:func:`_quotient_cut`).  Below that size the bracket's
    round-off, about ``eps (1 + |x|_∞)`` in units of the energy, divided by ``|Δ|`` exceeds
    what dropping the correction costs: the midpoint gradient keeps ``H(x') - H(x)`` to
    ``|Δ|³/24``, below that round-off there.  (With the cut at ``1e-10 (1 + |x|)`` a damped
    CVT coming to rest, 3000 steps of h = 0.1, had 0--2 solves per 3000 stop at the iteration
    cap in the round-off of the quotient; with this one none.  A cut at
    ``eps^(1/3) (1 + |x|)``, linear in ``|x|``, dropped the correction at every step once the
    CVT's pendulum angle had run to ``|q3| = 1.9e4``: energy error 6e-3 in 3000 steps.)
    ``grad_mid`` and ``H_x`` are ``∇H(x̄)`` and ``H(x)`` when already known."""
    mid = 0.5 * (x + x1)
    g = jax.grad(H)(mid) if grad_mid is None else grad_mid
    hx = H(x) if H_x is None else H_x
    d = x1 - x
    dd = jnp.sum(d ** 2)
    small = dd <= _quotient_cut("gonzalez", x) ** 2
    safe = jnp.where(small, 1.0, dd)
    corr = (H(x1) - hx - g @ d) / safe
    return g + jnp.where(small, 0.0, corr) * d


def itoh_abe_gradient(H: Callable, x: Vector, x1: Vector, grad: Optional[Callable] = None
                      ) -> Vector:
    """Itoh--Abe coordinate-increment discrete gradient (eq. (13)): component ``i`` is the
    difference quotient of ``H`` along the ``i``-th edge of the staircase from ``x`` to ``x'``
    (``∂H/∂x_i`` at the edge's start when ``|x'_i - x_i|`` is below
    ``(0.02 eps (1 + |x|_∞))^(1/2)``, :func:`_quotient_cut`).
    ``grad`` is ``∇H`` (default ``jax.grad(H)``)."""
    grad = jax.grad(H) if grad is None else grad
    N = x.shape[0]
    eye = jnp.eye(N, dtype=x.dtype)
    # corner j of the staircase: the first j components from x', the rest from x
    lower = jnp.tril(jnp.ones((N + 1, N), x.dtype), -1)
    corners = x[None, :] + lower * (x1 - x)[None, :]
    values = jax.vmap(H)(corners)
    d = x1 - x
    small = jnp.abs(d) <= _quotient_cut("itoh_abe", x)
    safe = jnp.where(small, 1.0, d)
    quotient = (values[1:] - values[:-1]) / safe
    partial = jnp.sum(jax.vmap(grad)(corners[:-1]) * eye, axis=1)
    return jnp.where(small, partial, quotient)


def quotient_round_off(kind: str, H_x: ScalarLike, d: Vector, x: Vector, h: ScalarLike,
                       tol: float):
    """The round-off level, in multiples of ``tol``, of a step's residual ``ζ' - ζ - h Π ∇̄H``.

    Two sources.  The coordinates: the residual is evaluated at iterates each known to
    ``eps |x_i|``, and the force carries the round-off of the largest coordinate into all
    rows, about ``eps (1 + |x|_∞)`` against the smallest row's tolerance ``tol``.  The
    difference quotients of the ``kind`` (``"gonzalez"`` or ``"itoh_abe"``; ``"avf"`` has
    none): ``H(x') - H(x)`` carries about ``(1 + |H|)`` times :func:`_energy_round_off`,
    which the quotient divides by the increment (Gonzalez: ``|Δ|``; Itoh--Abe: the smallest
    coordinate increment, each coordinate having its own quotient), down to the size below
    which it is dropped (:func:`_quotient_cut`), and the step multiplies by ``h``.  ``d`` is
    the predicted increment.

    Passed to the stage solver as ``stall_level`` (:meth:`vijax.solvers.AbstractRootSolver.solve`):
    at the usual increments and coordinates it is below the solver's default level (1000)
    and changes nothing.  Where the motion comes to rest the quotients' part rises with
    ``1/|Δ|``: on the CVT gearbox with the damping ``F = -0.1 v`` (h = 0.1) from t = 155 on
    the increments of the fixed point wandered at 1e-14 ... 1e-13 (residual up to 1e-13)
    where the default level is 2e-15, and 194 of 2000 steps failed at the iteration cap
    without this level.  Where a coordinate has run away the coordinates' part rises: on the
    CVT run to t = 5e4 (``examples/cvt_long_run.py``, the pendulum angle reaching
    ``|q3| = 7.5e4``) the solver's own level, relative to its first increment, fell below the
    increments' noise once the predictor had become accurate, and AVF-R (no quotient) had
    failed solves in 6 of 5000 saved blocks from step 273314 on (``|q3| = 4.4e4``) without
    this part; none with it."""
    coordinates = _energy_round_off(x) / tol
    if kind == "avf":
        return coordinates
    cut = _quotient_cut(kind, x)
    if kind == "gonzalez":   # one quotient along Δ
        size = jnp.maximum(jnp.max(jnp.abs(d)), cut)
    else:
        # one quotient per coordinate: a coordinate's increment can pass through zero within
        # a step whatever the prediction says, so the smallest increment not cut, the cut
        size = cut
    quotient = _energy_round_off(x) * jnp.abs(h) * (1.0 + jnp.abs(H_x)) / (size * tol)
    return jnp.maximum(coordinates, quotient)


def _discrete_gradient(kind, H, x, x1, nodes, grad=None, grad_mid=None, H_x=None):
    if kind == "avf":
        return avf_gradient(H, x, x1, nodes, grad)
    if kind == "gonzalez":
        return gonzalez_gradient(H, x, x1, grad_mid, H_x)
    return itoh_abe_gradient(H, x, x1, grad)


def skew_gradient_step(H: Callable, Pi: Callable, z: Vector, h: ScalarLike,
                       gradient: str = "gonzalez", nodes: int = 12,
                       solver: AbstractRootSolver | None = None
                       ) -> tuple[Vector, SolverStats]:
    """One discrete-gradient step ``(z' - z)/h = Π(z̄) ∇̄H(z, z')`` (Celledoni et al. (2016),
    eq. (14), with the midpoint skew matrix) for any skew-gradient system ``z' = Π(z)∇H(z)``
    given by ``H(z)`` and ``Π(z)`` (e.g. :class:`vijax.systems.SuslovProblem`); ``H`` is kept
    to round-off."""
    if gradient not in GRADIENTS:
        raise ValueError(f"gradient must be one of {GRADIENTS}, got {gradient!r}.")
    solver = Newton() if solver is None else solver

    def residual(z1):
        return z1 - z - h * Pi(0.5 * (z + z1)) @ _discrete_gradient(gradient, H, z, z1, nodes)

    return solver.solve(residual, z + h * Pi(z) @ jax.grad(H)(z))


# --------------------------------------------------------------------------------------------
# The reduced (almost-Poisson) form built from the Lagrangian and the constraint one-forms
# --------------------------------------------------------------------------------------------
def constraint_forms(system: NonholonomicSystem, q: Vector) -> Float[Array, "k n"]:
    """The constraint one-forms ``A(q)`` of a linear ``Φ(q, v) = A(q) v`` (``D2Φ`` at
    ``v = 0``)."""
    return system.constraint_matrix(q, jnp.zeros_like(q))


def _contract(p: Vector, dX: Float[Array, "n n m"]) -> Float[Array, "n m"]:
    """``w_ia = p_j ∂_i X_a^j`` from ``dX[i, j, a] = ∂_i X_a^j`` (one reduction)."""
    return jnp.sum(p[None, :, None] * dX, axis=1)


def _directional(fn: Callable, x: Vector):
    """``(fn(x), D)`` with ``D[k] = ∂fn/∂x_k``: one ``jvp`` per coordinate direction under
    ``vmap``, the direction axis first as ``vmap`` makes it.  (``jax.jacfwd`` moves that axis
    last: a transposed copy that XLA:CPU runs as a kernel of its own, which the products that
    follow then read through a reshape, another.)"""
    return jax.vmap(lambda t: jax.jvp(fn, (x,), (t,)), out_axes=(None, 0))(
        jnp.eye(x.shape[0], dtype=x.dtype))


def _tmm(a, b):
    """``aᵀ b`` as one reduction over the rows (no transposed copy of ``a``)."""
    return jnp.sum(a[:, :, None] * b[:, None, :], axis=0)


def _gram(X, G):
    """``Xᵀ G X``."""
    return _tmm(X, mm(G, X))


def _metric_solve(g: Float[Array, "m m"], rho: Vector) -> Vector:
    """``g^{-1} ρ`` for the reduced metric (symmetric positive definite): Cramer's rule for
    ``m <= 3`` (:func:`vijax._linalg.cramer`; a LAPACK call inside the solver loop cost half
    of a fixed-point step on the CVT gearbox, m = 2: 62 against 27 µs; the closed-form
    inverse times ``ρ``, 4% slower steps than the solution written out), the Cholesky
    factorisation written out above (:func:`vijax._linalg.spd_solve`: the quartic system's
    step 0.84x LAPACK's LU, which had been faster than the pivoted elimination written out,
    63 against 70 µs, and under ``jax.vmap`` no batched LAPACK call, which deadlocked a
    1024-member ensemble of the chaotic system with jaxlib 0.10)."""
    m = g.shape[-1]
    return _linalg.cramer(g, rho) if m <= 3 else _linalg.spd_solve(g, rho)


class ReducedForm(eqx.Module):
    """The skew-gradient form ``ζ' = Π(ζ)∇𝓗(ζ)`` on ``D*`` of a mechanical system with
    linear constraints, from its mass matrix, potential and constraint one-forms
    (Celledoni et al. (2016), §3.3, eqs. (16)--(17)).

    ``frame="qr"``: ``X(q)`` from the Householder QR of ``A(q)ᵀ`` with the reflector signs
    ``signs`` (fixed: one smooth frame field); ``frame="system"``:
    ``system.distribution_frame(q)`` (an analytic frame, shape ``(n, m)``).
    """

    system: MechanicalSystem
    signs: Optional[Array]
    frame_kind: str = eqx.field(static=True)

    @classmethod
    def at(cls, system, q: Vector, frame: str = "qr") -> "ReducedForm":
        """The reduced form with the reflector signs of the QR at ``q`` frozen."""
        return cls.with_frame(system, q, frame)[0]

    @classmethod
    def with_frame(cls, system, q: Vector, frame: str = "qr"):
        """``(form, X(q))``: :meth:`at` and the frame at ``q`` from one QR (the QR at ``q``
        gives the reflector signs and, with them, the frame)."""
        if frame == "system":
            return cls(system, None, frame), system.distribution_frame(q)
        k = constraint_forms(system, q).shape[0]
        Q, signs = _householder(constraint_forms(system, q).T)
        return cls(system, signs, frame), Q[:, k:]

    def frame(self, q: Vector) -> Float[Array, "n m"]:
        """``X(q)``: columns spanning ``D_q``."""
        if self.frame_kind == "system":
            return self.system.distribution_frame(q)
        return householder_frame(constraint_forms(self.system, q).T, self.signs)

    def metric(self, q: Vector, X=None):
        """``g_D = Xᵀ G X`` (``m x m``)."""
        X = self.frame(q) if X is None else X
        return _gram(X, self.system.mass_matrix(q))

    def momentum(self, q: Vector, rho: Vector) -> Vector:
        """``p = G X g_D^{-1} ρ`` (eq. (16a))."""
        X = self.frame(q)
        return mm(self.system.mass_matrix(q), mm(X, _metric_solve(self.metric(q, X), rho)))

    def velocity(self, q: Vector, rho: Vector) -> Vector:
        """``v = X g_D^{-1} ρ`` (in ``D_q``)."""
        X = self.frame(q)
        return mm(X, _metric_solve(self.metric(q, X), rho))

    def rho(self, q: Vector, p: Vector) -> Vector:
        """``ρ = Xᵀ p`` (eq. (16b))."""
        return mm(p, self.frame(q))

    def _at(self, q: Vector):
        """The ``q``-dependent data of a point: ``X(q)``, ``∂X/∂q`` (``(n, n, m)``:
        ``dX[i, j, a] = ∂_i X_a^j``, the derivative's direction first) and ``G(q)``."""
        # Direction-first (_directional), w = p_j ∂_i X^j is one reduction fused with the
        # derivative, and the products with X and the metric are reductions over the rows of
        # X (_tmm: no transposed copy of X either): a fixed-point update on the CVT gearbox
        # 26 -> 23 kernels; Gonzalez-R steps 0.81x (system frame) and 0.84x (QR), AVF(12)-R
        # 0.86x, Gonzalez-R on the quartic system 0.66x (ab_versions.py, both trees in one
        # process).
        X, dX = _directional(self.frame, q)
        return X, dX, self.system.mass_matrix(q)

    def _local(self, q: Vector, rho: Vector, at=None):
        X, dX, G = self._at(q) if at is None else at
        y = _metric_solve(_gram(X, G), rho)                     # g_D^{-1} ρ
        v = mm(X, y)
        return X, dX, y, v, mm(G, v)

    def bracket(self, q: Vector, rho: Vector) -> tuple[Float[Array, "n m"], Float[Array, "m m"]]:
        """``(X(q), Λ(q, ρ))`` with ``Λ = M - Mᵀ``, ``M_ab = p_j ∂_i X_a^j X_b^i``,
        ``p = p(q, ρ)`` (eq. (17))."""
        X, dX, _, _, p = self._local(q, rho)
        M = _tmm(_contract(p, dX), X)
        return X, M - M.T

    def _gradient_and_bracket(self, q: Vector, rho: Vector, at=None):
        X, dX, y, v, p = self._local(q, rho, at)
        dT = jax.grad(lambda x: mm(v, mm(self.system.mass_matrix(x), v)))(q)
        w = _contract(p, dX)                                    # w_ia = p_j ∂_i X_a^j
        gq = -0.5 * dT - mm(w, y) + jax.grad(self.system.potential)(q)
        M = _tmm(w, X)
        return jnp.concatenate([gq, y]), X, M - M.T

    def gradient_and_bracket(self, z: Vector, n: int):
        """``(∇𝓗(ζ), X(q), Λ(q, ρ))`` at ``ζ = (q, ρ)``, sharing one frame and its
        derivative: ``∂𝓗/∂q = -½ ∇_q(vᵀ G(q) v) - p_j ∂_q X_a^j y^a + ∇V`` and
        ``∂𝓗/∂ρ = y`` with ``y = g_D^{-1} ρ``, ``v = X y``, ``p = G v`` (eq. (18); the
        derivatives of ``G`` and ``V`` by autodiff at fixed ``v``)."""
        return self._gradient_and_bracket(z[:n], z[n:])

    def linearisation(self, z: Vector, n: int, h: ScalarLike, F=None, dF=None
                      ) -> tuple[Float[Array, "N N"], Vector]:
        """``(P, f)``: ``f = Π(ζ)(∇𝓗(ζ) - (F, 0))``, the vector field at ``ζ`` with a force
        ``F`` (or none), and ``P`` the inverse of ``I - (h/2) J``, ``J`` its Jacobian with
        the ``q``-columns reduced to ``(0, -Xᵀ(∇²V - 2 dF))``: exact in ``ρ`` (the bracket
        and the metric at fixed ``q``, ``m`` tangents), without the derivatives of the frame
        and of the metric in ``q``.  ``dF``: the derivative of the step's midpoint force with
        respect to ``q'`` (``n x n``), or ``None``.

        The residual of a midpoint discrete-gradient step has the Jacobian ``I - (h/2) J``
        to first order (``∂∇̄𝓗/∂ζ' = ∇²𝓗/2 + O(|ζ' - ζ|)``), so ``P`` preconditions its
        fixed-point iteration, and ``ζ + h P f`` is the linearly implicit midpoint predictor
        (local error ``O(h³)``).  The step linearises at the midpoint extrapolated from the
        previous step instead (:meth:`DiscreteGradient.step`), which predicts 1.6--75x (the
        sleigh 170x) closer and contracts 1.1--3.9x (250x) better on the CVT gearbox and the
        quartic system (test_discrete_gradients.py).  For the Itoh--Abe gradient, whose
        Jacobian in ``ζ'`` is not the symmetric half, it is a coarser approximation.
        Measured contraction factors at the start (spectral radius of ``I - P ∂F/∂ζ'`` at
        the root, ``h = 0.1``): 0.002--0.006 on the CVT gearbox and 0.0016--0.0034 on the
        quartic system (three states of a trajectory each), against 0.05--0.09
        unpreconditioned; without the
        ``ρ``-derivative of the bracket the iteration diverged on the Chaplygin sleigh at
        ``h`` near its stability bound, where the bracket carries the whole motion."""
        q, rho = z[:n], z[n:]
        at = self._at(q)
        X = at[0]

        def field(r):
            g, _, Lam = self._gradient_and_bracket(q, r, at)
            gq = g[:n] if F is None else g[:n] - F
            return jnp.concatenate([mm(X, g[n:]), -mm(gq, X) + mm(Lam, g[n:])])

        # derivatives direction-first (_directional): JrT = Jrᵀ, JrT[k] the field's
        # derivative in ρ_k; ∇²V symmetric
        f, JrT = _directional(field, rho)
        a = 0.5 * h
        Jq = a * _directional(jax.grad(self.system.potential), q)[1]
        if dF is not None:
            Jq = Jq - h * dF
        # I - (h/2) J = [[I, U], [B, D]] with U = -a Jr_q (n x m), B = Xᵀ Jq (m x n),
        # D = I - a Jr_ρ: inverted through the m x m Schur complement S = D - B U,
        # [[I + U S⁻¹ B, -U S⁻¹], [-S⁻¹ B, S⁻¹]]: one m x m inverse (closed form for
        # m <= 3) instead of the (n+m)-square one, whose unrolled elimination was a tenth
        # of the step on the CVT gearbox (6.0 -> 5.6 us; system frame 4.2 -> 3.8).  Kept
        # as Uᵀ (rows of JrT), so no product reads a transposed copy.
        Ut, B = -a * JrT[:, :n], _tmm(X, Jq)
        BU = jnp.sum(B[:, None, :] * Ut[None, :, :], axis=2)
        Si = _linalg.inv(jnp.eye(JrT.shape[0], dtype=z.dtype) - a * JrT[:, n:].T - BU)
        SiB, USi = mm(Si, B), _tmm(Ut, Si)
        P = jnp.concatenate([
            jnp.concatenate([jnp.eye(n, dtype=z.dtype) + mm(USi, B), -USi], axis=1),
            jnp.concatenate([-SiB, Si], axis=1)], axis=0)
        return P, f

    def gradient(self, z: Vector, n: int) -> Vector:
        """``∇𝓗(ζ)`` by eq. (18) (see :meth:`gradient_and_bracket`)."""
        return self.gradient_and_bracket(z, n)[0]

    def vector_field(self, z: Vector, n: int) -> Vector:
        """``Π(ζ)∇𝓗(ζ)`` (eq. (9)) at ``ζ = (q, ρ)``."""
        g, X, Lam = self.gradient_and_bracket(z, n)
        return jnp.concatenate([mm(X, g[n:]), -mm(g[:n], X) + mm(Lam, g[n:])])

    def energy(self, z: Vector, n: int, X=None) -> Float[Array, ""]:
        """``𝓗(ζ)`` with ``ζ = (q, ρ)``, ``q = ζ[:n]`` (``X``: the frame at ``q``, if known)."""
        q, rho = z[:n], z[n:]
        return 0.5 * mm(rho, _metric_solve(self.metric(q, X), rho)) + self.system.potential(q)


# --------------------------------------------------------------------------------------------
# Checks shared with the discrete Lagrange-d'Alembert baselines
# --------------------------------------------------------------------------------------------
def require_linear_constraints(integrator: AbstractIntegrator, system) -> None:
    """Refuse a :class:`vijax.NonholonomicSystem` whose ``constraint_form`` is not
    ``"linear"``, naming the methods that take affine and nonlinear constraints."""
    if not isinstance(system, NonholonomicSystem) or system.constraint_form == "linear":
        return
    form = system.constraint_form
    others = [m for m in accepting(system)]
    listed = "; ".join(others) if others else "none registered in this installation"
    raise IncompatibleSystemError(
        f"{integrator.name} needs linear nonholonomic constraints Φ = A(q) v (declare "
        f"constraint_form = 'linear'), but {type(system).__name__} declares "
        f"constraint_form = {form!r}. Affine and nonlinear constraints are integrated by "
        f"vijax.NonholonomicVPRK (the nonholonomic partitioned Runge--Kutta methods of Martín "
        f"de Diego & Sato Martín de Almagro (2022), eq. (14)). Methods that accept this "
        f"system: {listed}.")


# --------------------------------------------------------------------------------------------
# The integrator
# --------------------------------------------------------------------------------------------
class DiscreteGradientState(AbstractState):
    """``(t, q, p, v)``: the node on ``T*Q`` (``p = G v``; ``v`` in ``D`` for the reduced
    methods); the reduced methods also carry ``ρ`` and the reflector signs of the frame it is
    expressed in (the next step reuses ``ρ`` while the signs at its start agree, instead of
    recomputing ``ρ = Xᵀ p``, whose round-off would accumulate in the energy) and ``ζ̇``,
    the mean rate ``(ζ_n - ζ_{n-1})/h`` of ``ζ = (q, ρ)`` over the last step (at the start:
    the vector field), from which the next step's predictor is extrapolated, and ``miss``, by
    how much that predictor missed the last step's root (added to the next prediction); empty
    for the full-space method."""

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    v: Float[Array, " n"]
    rho: Float[Array, " m"]
    signs: Float[Array, " k"]
    zdot: Float[Array, " N"]
    miss: Float[Array, " N"]


class AbstractLinearNonholonomicMethod(AbstractIntegrator):
    """What the midpoint-type methods for linear nonholonomic constraints share (the discrete
    gradients here and the discrete Lagrange--d'Alembert baselines of :mod:`.dla`): they
    require a :class:`vijax.NonholonomicSystem` declaring ``constraint_form = "linear"``
    (refusing the others by naming :class:`vijax.NonholonomicVPRK`), take forces at the step
    midpoint, and refuse initial velocities off the constraint."""

    supported = frozenset({NonholonomicSystem, ForcedSystem})
    required = frozenset({NonholonomicSystem})

    def force_nodes(self) -> np.ndarray:
        """The step midpoint: ``F(t + h/2, q̄, (q' - q)/h)``."""
        return np.array([0.5])

    def force_weights(self) -> np.ndarray:
        return np.array([1.0])

    def accepts(self, system) -> bool:
        return super().accepts(system) and system.constraint_form == "linear"

    def check_system(self, system) -> None:
        if AbstractIntegrator.accepts(self, system):
            require_linear_constraints(self, system)
        super().check_system(system)

    def check_initial(self, system, q0, v0, tol):
        return check_nonholonomic_consistent(system, q0, v0, tol)


class DiscreteGradient(AbstractLinearNonholonomicMethod):
    """Discrete-gradient integrators for mechanical systems with linear nonholonomic
    constraints (Celledoni, Farré Puiggalí, Høiseth & Martín de Diego (2016), eqs. (14)--(15)).

    Parameters
    ----------
    gradient:
        ``"avf"`` (eq. (11)), ``"gonzalez"`` (eq. (12)) or ``"itoh_abe"`` (eq. (13)).
    nodes:
        Gauss--Legendre nodes of the AVF integral (default 12: the reduced Hamiltonian is
        rational in ``q`` in general, and fewer nodes show as an energy drift).
    formulation:
        ``"reduced"`` (default): the step on ``D*`` in the coordinates ``(q, ρ)``, built
        automatically from the system (§3.3, the "-R" methods); energy and constraints exact.
        ``"full"``: eq. (15) on ``T*Q`` with multipliers (Gonzalez: "GONZALEZ-F"); energy
        exact, constraint not kept.
    frame:
        ``"qr"`` (default): Householder frame of ``A(q)ᵀ``; ``"system"``: the system's
        analytic ``distribution_frame(q)``.
    solver:
        Root solver, run to the round-off floor (``rtol = atol = eps/100`` of the working
        dtype: the energy error per step is ``∇̄𝓗ᵀ r`` for a residual ``r`` left by the
        solver).  Default for the reduced form: :class:`vijax.solvers.FixedPoint`
        preconditioned by the midpoint step linearised at the midpoint extrapolated from the
        previous step (:meth:`ReducedForm.linearisation`), from the prediction of that
        linearisation; for the full form:
        :class:`vijax.solvers.Newton`.  Pass ``solver=vj.solvers.Newton(rtol=..., atol=...)``
        for steps at which the fixed point fails to converge (steps near the stability bound
        of an unstable relative equilibrium).

    Presets: :meth:`avf`, :meth:`gonzalez`, :meth:`itoh_abe`, :meth:`gonzalez_full`.
    """

    gradient: str = eqx.field(static=True)
    nodes: int = eqx.field(static=True)
    formulation: str = eqx.field(static=True)
    frame: str = eqx.field(static=True)
    solver: Optional[AbstractRootSolver]
    retrace: bool = eqx.field(static=True, default=False)   # see retracing

    symplectic = False
    system_type = MechanicalSystem
    refused_because = {TimeDependentSystem: "a discrete gradient keeps the energy, which an "
                                            "explicitly time-dependent Lagrangian does not "
                                            "conserve"}

    def __init__(self, gradient: Literal["avf", "gonzalez", "itoh_abe"] = "gonzalez",
                 nodes: int = 12, formulation: Literal["reduced", "full"] = "reduced",
                 frame: Literal["qr", "system"] = "qr",
                 solver: AbstractRootSolver | None = None):
        if gradient not in GRADIENTS:
            raise ValueError(f"gradient must be one of {GRADIENTS}, got {gradient!r}; e.g. "
                             f"DiscreteGradient.gonzalez().")
        if formulation not in ("reduced", "full"):
            raise ValueError(f"formulation must be 'reduced' or 'full', got {formulation!r}.")
        if frame not in ("qr", "system"):
            raise ValueError(f"frame must be 'qr' or 'system', got {frame!r}.")
        if not (isinstance(nodes, (int, np.integer)) and nodes >= 1):
            raise ValueError(f"nodes must be a positive integer, got {nodes!r}.")
        self.gradient = gradient
        self.nodes = int(nodes)
        self.formulation = formulation
        self.frame = frame
        self.solver = solver

    def _solver(self, dtype) -> AbstractRootSolver:
        """The given solver, or one run to the round-off floor (``rtol = atol = eps/100``,
        below what the iterates can reach: the solver's stall rule stops it when the updates
        stop shrinking): the energy error of a step is ``∇̄𝓗ᵀ r`` for the residual ``r`` left
        by the solve (Celledoni et al. (2016), §3.2).  A looser tolerance drifts: the fixed
        point at ``eps`` or ``10 eps`` left a linear energy drift of 1e-14 and 1e-12 over 3e4
        steps of the quartic system (``h = 0.1``), against 5e-15 of round-off at ``eps/100``.
        The reduced form takes the preconditioned :class:`FixedPoint` (5.1 updates per step
        on the CVT gearbox and 5.6 on the quartic system at ``h = 0.1``, each a residual
        evaluation; Itoh--Abe 4.5, AVF 4.0 on the CVT), the full form :class:`Newton`."""
        if self.solver is not None:
            return self.solver
        tol = 0.01 * float(jnp.finfo(dtype).eps)
        if self.formulation == "reduced":
            return FixedPoint(rtol=tol, atol=tol)
        return Newton(rtol=tol, atol=tol)

    # -- presets ---------------------------------------------------------------------------
    @classmethod
    def avf(cls, nodes: int = 12, **kwargs) -> "DiscreteGradient":
        """AVF (mean-value) discrete gradient on ``D*``, ``nodes`` Gauss--Legendre nodes;
        order 2."""
        return cls("avf", nodes=nodes, **kwargs)

    @classmethod
    def gonzalez(cls, **kwargs) -> "DiscreteGradient":
        """Gonzalez midpoint discrete gradient on ``D*`` ("GONZALEZ-R"); order 2."""
        return cls("gonzalez", **kwargs)

    @classmethod
    def itoh_abe(cls, **kwargs) -> "DiscreteGradient":
        """Itoh--Abe coordinate-increment discrete gradient on ``D*``; order 1."""
        return cls("itoh_abe", **kwargs)

    @classmethod
    def gonzalez_full(cls, **kwargs) -> "DiscreteGradient":
        """Gonzalez discrete gradient on ``T*Q`` with multipliers, eq. (15) ("GONZALEZ-F"):
        energy kept, constraint not; order 2."""
        return cls("gonzalez", formulation="full", **kwargs)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        return [("DiscreteGradient.gonzalez()", cls.gonzalez()),
                ("DiscreteGradient.avf()", cls.avf()),
                ("DiscreteGradient.itoh_abe()", cls.itoh_abe()),
                ("DiscreteGradient.gonzalez_full()", cls.gonzalez_full())]

    @property
    def name(self) -> str:
        label = {"avf": f"AVF({self.nodes})", "gonzalez": "GONZALEZ",
                 "itoh_abe": "ITOH-ABE"}[self.gradient]
        return f"DiscreteGradient[{label}-{'R' if self.formulation == 'reduced' else 'F'}]"

    @property
    def order(self) -> int:
        return 1 if self.gradient == "itoh_abe" else 2

    @property
    def stages(self) -> int:
        return 1

    @property
    def symmetric(self) -> bool:
        return self.gradient != "itoh_abe"

    def retracing(self) -> "DiscreteGradient":
        # The reduced form carries ζ̇ = (ζ_{k+1} - ζ_k)/h of the step that reached the state,
        # so the step that retraces it has its root there (_retraced_root): no predictor, no
        # solve.  The full form carries neither the step nor its multipliers; a method that is
        # not symmetric has no step back to retrace.
        if self.formulation != "reduced" or not self.symmetric:
            return self
        return with_fields(self, retrace=True, solver=StartAsRoot())

    # -- systems and initial data ----------------------------------------------------------
    def check_system(self, system) -> None:
        if (self.frame == "system" and isinstance(system, NonholonomicSystem)
                and type(system).distribution_frame is NonholonomicSystem.distribution_frame):
            raise ValueError(f"frame='system' reads {type(system).__name__}."
                             f"distribution_frame(q) (an (n, m) matrix whose columns span the "
                             f"constraint distribution); define it or use frame='qr'.")
        super().check_system(system)

    def init(self, system, t0: ScalarLike, q0: Vector, v0: Vector) -> DiscreteGradientState:
        require_linear_constraints(self, system)
        t0 = jnp.asarray(t0, q0.dtype)
        p0 = system.mass_matrix(q0) @ v0
        empty = jnp.zeros((0,), q0.dtype)
        if self.formulation == "full":
            return DiscreteGradientState(t=t0, q=q0, p=p0, v=v0, rho=empty, signs=empty,
                                         zdot=empty, miss=empty)
        red = ReducedForm.at(system, q0, self.frame)
        rho0 = red.rho(q0, p0)
        zdot = red.vector_field(jnp.concatenate([q0, rho0]), q0.shape[0])
        return DiscreteGradientState(t=t0, q=q0, p=p0, v=v0, rho=rho0,
                                     signs=empty if red.signs is None else red.signs, zdot=zdot,
                                     miss=jnp.zeros_like(zdot))

    def velocity(self, system, state: DiscreteGradientState) -> Vector:
        return state.v

    # -- stepping ---------------------------------------------------------------------------
    def step(self, system, state: DiscreteGradientState, h: ScalarLike, u=None
             ) -> tuple[DiscreteGradientState, SolverStats]:
        force = self._force(system, state, h, u)
        if self.formulation == "full":
            return self._step_full(system, state, h, force)
        return self._step_reduced(system, state, h, force)

    def _midpoint_force(self, force, q, q1, h):
        if force is None:
            return jnp.zeros_like(q)
        return force((0.5 * (q + q1))[None, :], ((q1 - q) / h)[None, :])[0]

    def _step_reduced(self, system, state, h, force):
        q, p = state.q, state.p
        n = q.shape[0]
        red, X0 = ReducedForm.with_frame(system, q, self.frame)
        rho, zdot, miss = state.rho, state.zdot, state.miss
        if self.frame == "qr":   # new reflector signs: ρ in the new frame, no extrapolation
            same = jnp.all(red.signs == state.signs)
            rho = jnp.where(same, rho, mm(p, X0))
            zdot = jnp.where(same, zdot, 0.0)
            miss = jnp.where(same, miss, 0.0)
        z = jnp.concatenate([q, rho])
        H = lambda y: red.energy(y, n)  # noqa: E731

        grad = lambda y: red.gradient(y, n)  # noqa: E731
        H0 = red.energy(z, n, X0)

        def residual(z1):
            gm, X, Lam = red.gradient_and_bracket(0.5 * (z + z1), n)
            g = _discrete_gradient(self.gradient, H, z, z1, self.nodes, grad, gm, H0)
            F = self._midpoint_force(force, q, z1[:n], h)
            gq, gr = g[:n] - F, g[n:]
            return z1 - z - h * jnp.concatenate([mm(X, gr), -mm(gq, X) + mm(Lam, gr)])

        solver = self._solver(q.dtype)
        if self.retrace:
            # the root the step back found (retracing): no prediction, no preconditioner
            start, precond, level = self._retraced_root(system, state, h, red, n), None, None
        else:
            # Predictor and preconditioner: the midpoint step linearised at the midpoint
            # extrapolated from the last step, ζ̂ = ζ + (h/2) ζ̇ (the force and its derivative
            # taken along the start velocity).  With J the linearisation's Jacobian at ζ̂ and
            # P = (I - (h/2) J)⁻¹, the linearised step (I - (h/2) J) d = h (F(ζ̂) + J (ζ - ζ̂))
            # is d = h ζ̇ + h P (F(ζ̂) - ζ̇).  Against the linearisation at ζ (ζ̇ = 0) this saves
            # 0.8--2.8 updates per step at h = 0.1 (Gonzalez: CVT gearbox 6.0 -> 5.1, quartic
            # system 6.4 -> 5.6; on the CVT Itoh--Abe 7.2 -> 4.5, AVF 5.8 -> 4.0), the energy
            # error unchanged over 3e4 steps.  The predictor serves Newton as well.
            q_e = q + h * state.v
            F0, dF = ((None, None) if force is None else
                      (self._midpoint_force(force, q, q_e, h),
                       jax.jacfwd(lambda y: self._midpoint_force(force, q, y, h))(q_e)))
            P, f = red.linearisation(z + (0.5 * h) * zdot, n, h, F0, dF)
            # ... plus the last step's miss of the same prediction: the miss is a smooth
            # function of the state, so the sum misses by O(h) less (5.10 -> 4.97 updates per
            # step on the CVT gearbox, 5.62 -> 5.31 on the quartic system; Gonzalez-R steps
            # 0.97x, quartic 0.95x in one process)
            d0 = h * zdot + h * mm(P, f - zdot) + miss
            start, precond = z + d0, (lambda r: mm(P, r))
            level = quotient_round_off(self.gradient, H0, d0, z, h,
                                       solver.tolerances(q.dtype)[1])
        z1, stats = solver.solve(residual, start, precond, stall_level=level)
        q1, rho1 = z1[:n], z1[n:]
        v1 = red.velocity(q1, rho1)
        # the prediction's miss, for the next one (a retraced step made none: restart)
        miss1 = jnp.zeros_like(miss) if self.retrace else z1 - z - d0 + miss
        new = DiscreteGradientState(t=state.t + h, q=q1, p=mm(system.mass_matrix(q1), v1), v=v1,
                                    rho=rho1, signs=state.signs if red.signs is None else red.signs,
                                    zdot=(z1 - z) / h, miss=miss1)
        return new, stats

    def _retraced_root(self, system, state, h, red, n):
        """The root of a retraced step (:meth:`retracing`): ``ζ + h ζ̇`` (``ζ̇`` carried from
        the step back, ``h`` the negative of its step), re-expressed in this step's frame
        where the reflector signs at its start differ from the step back's (its ``ρ`` is
        ``Xᵀ p`` in its own frame)."""
        q1 = state.q + h * state.zdot[:n]
        rho1 = state.rho + h * state.zdot[n:]
        if self.frame == "qr":   # (a branch: the frames at q1 only where the signs changed)
            def reexpressed():
                p1 = ReducedForm(system, state.signs, self.frame).momentum(q1, rho1)
                return red.rho(q1, p1)

            rho1 = jax.lax.cond(jnp.all(red.signs == state.signs), lambda: rho1, reexpressed)
        return jnp.concatenate([q1, rho1])

    def _step_full(self, system, state, h, force):
        q, p = state.q, state.p
        n = q.shape[0]

        def H(y):
            x, y_p = y[:n], y[n:]
            return 0.5 * y_p @ system.inverse_mass_matrix(x) @ y_p + system.potential(x)

        z = jnp.concatenate([q, p])
        k = constraint_forms(system, q).shape[0]

        def residual(x):
            z1, lam = x
            qm = 0.5 * (q + z1[:n])
            A = constraint_forms(system, qm)
            g = _discrete_gradient(self.gradient, H, z, z1, self.nodes)
            F = self._midpoint_force(force, q, z1[:n], h)
            gq, gp = g[:n], g[n:]
            return (z1[:n] - q - h * gp, z1[n:] - p - h * (-gq + F + A.T @ lam), A @ gp)

        g0 = jax.grad(H)(z)
        x0 = (z + h * jnp.concatenate([g0[n:], -g0[:n]]), jnp.zeros((k,), q.dtype))
        (z1, _), stats = self._solver(q.dtype).solve(residual, x0)
        q1, p1 = z1[:n], z1[n:]
        new = DiscreteGradientState(t=state.t + h, q=q1, p=p1,
                                    v=system.inverse_mass_matrix(q1) @ p1, rho=state.rho,
                                    signs=state.signs, zdot=state.zdot, miss=state.miss)
        return new, stats
