"""The rigid motions SE(3), with closed forms for ``exp``, ``log``, ``cay`` and their tangents.

Elements are ``4 × 4`` homogeneous matrices ``g = [[R, t], [0, 1]]``; the algebra is ``R^6``
with the translation first, ``ξ = (v, ω)`` (as in jaxlie), ``hat(ξ) = [[hat(ω), v], [0, 0]]``.
With ``θ = |ω|``, ``W = hat(ω)``, ``V = hat(v)``:

* ``exp(ξ) = [[exp(ω), J_l(ω) v], [0, 1]]`` with ``J_l(ω) = I + ((1 - cos θ)/θ²) W +
  ((θ - sin θ)/θ³) W²`` (Rodrigues and the "V matrix"); ``log`` inverts it with
  ``J_l(ω)^{-1} = I - W/2 + (1/θ² - (1 + cos θ)/(2θ sin θ)) W²``;
* ``d^L exp_ξ = [[J, Q], [0, J]]`` with ``J = d^L exp_ω`` of SO(3) and ``Q`` the
  off-diagonal block of the SE(3) left Jacobian of Barfoot (2017), evaluated at ``-ξ`` (the
  left-trivialised tangent is the "right Jacobian" ``J_r(ξ) = J_l(-ξ)`` of that text);
  ``(d^L exp_ξ)^{-1} = [[J^{-1}, -J^{-1} Q J^{-1}], [0, J^{-1}]]``;
* the Cayley map of Kobilarov & Marsden (2011): ``cay(ξ) = [[cay(ω), (I - W/2)^{-1} v],
  [0, 1]]``, ``d^L cay_ξ = [[(I + W/2)^{-1}, -V D/2], [0, D]]`` and ``(d^L cay_ξ)^{-1} =
  [[I + W/2, (I + W/2) V/2], [0, D^{-1}]]`` with ``D = d^L cay_ω`` of SO(3), the block forms of
  ``vee((I + ξ̂/2)^{-1} η̂ (I - ξ̂/2)^{-1})``;
* ``Ad_g = [[R, hat(t) R], [0, R]]``, ``ad_ξ = [[W, V], [0, W]]``.

All coefficients are functions of ``θ²`` with Taylor branches ("double where", as in the
SO(3) module; switch at ``θ² = 1``, at ``θ² = 4`` for the two coefficients of ``Q`` that are
particular to SE(3)), so values and first and second derivatives are finite at ``ξ = 0``.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from ._base import AbstractCayleyGroup, AbstractMatrixLieGroup
from ._se2 import rigid_distance
from ._so3 import (_NTERMS, SO3, SeriesFunction, _skew_sq, dexp_coefficients, project_rotation,
                   sin3, skew, unskew)

__all__ = ["SE3"]

_SO3 = SO3()

#: The two coefficients of ``Q`` that are particular to SE(3) cancel more in their closed forms
#: (``2θ - 3 sin θ + θ cos θ = θ⁵/60 + ...``: a relative error of ``2e-14`` at ``θ = 1``), so
#: their Taylor branches reach to ``θ² = 4`` (twelve terms: truncation below ``1e-22``).
_SMALL_Q = 4.0

# (θ² + 2 cos θ - 2)/(2θ⁴) = Σ_j (-1)^j θ^{2j}/(2j+4)!
_C_Q2 = tuple((-1) ** j / math.factorial(2 * j + 4) for j in range(_NTERMS))
# (2θ - 3 sin θ + θ cos θ)/(2θ⁵) = Σ_j (-1)^j (j+1) θ^{2j}/(2j+5)!
_C_Q3 = tuple((-1) ** j * (j + 1) / math.factorial(2 * j + 5) for j in range(_NTERMS))


#: ``(θ² + 2 cos θ - 2)/(2θ⁴)`` as a function of ``s = θ²``.
_q2 = SeriesFunction(_C_Q2, lambda s: (s - 4.0 * jnp.sin(0.5 * jnp.sqrt(s)) ** 2) / (2.0 * s * s),
                     _SMALL_Q)


def _q3_exact(s):
    t = jnp.sqrt(s)
    return (2.0 * t - 3.0 * jnp.sin(t) + t * jnp.cos(t)) / (2.0 * s * s * t)


#: ``(2θ - 3 sin θ + θ cos θ)/(2θ⁵)`` as a function of ``s = θ²``.
_q3 = SeriesFunction(_C_Q3, _q3_exact, _SMALL_Q)


def _homogeneous(R, t):
    """``[[R, t], [0, 1]]``."""
    bottom = jnp.zeros(4, dtype=R.dtype).at[3].set(1.0)
    return jnp.concatenate([jnp.concatenate([R, t[:, None]], axis=1), bottom[None, :]], axis=0)


def _blocks(A, B, D):
    """``[[A, B], [0, D]]`` of ``3 × 3`` blocks."""
    Z = jnp.zeros_like(A)
    return jnp.concatenate([jnp.concatenate([A, B], axis=1), jnp.concatenate([Z, D], axis=1)],
                           axis=0)


def _left_jacobian_q(v, w, s, c3):
    """``Q(-v, -ω)``: the off-diagonal block of ``d^L exp_ξ`` (the ``Q`` block of the SE(3) left
    Jacobian of Barfoot (2017), at ``-ξ``); ``c3 = (θ - sin θ)/θ³``."""
    W, V = skew(w), skew(v)
    WV, VW = W @ V, V @ W
    WVW = WV @ W
    return (-0.5 * V + c3 * (WV + VW - WVW)
            - _q2(s) * (W @ WV + VW @ W - 3.0 * WVW)
            + _q3(s) * (WVW @ W + W @ WVW))


class SE3(AbstractMatrixLieGroup, AbstractCayleyGroup):
    """Rigid motions SE(3): ``4 × 4`` homogeneous matrices, algebra ``R^6`` ordered ``(v, ω)``
    (translation first, as jaxlie).  Closed forms for every map (module docstring)."""

    @property
    def dim(self) -> int:
        return 6

    # -- elements -----------------------------------------------------------------------------
    def identity(self, dtype=None):
        return jnp.eye(4, dtype=dtype)

    def inverse(self, g):
        R, t = g[:3, :3], g[:3, 3]
        return _homogeneous(R.T, -(R.T @ t))

    def project(self, g):
        return _homogeneous(project_rotation(g[:3, :3]), g[:3, 3])

    def distance(self, g):
        return rigid_distance(g)

    @staticmethod
    def from_rotation_translation(R, t):
        """The element ``[[R, t], [0, 1]]``."""
        return _homogeneous(R, t)

    # -- algebra --------------------------------------------------------------------------------
    def hat(self, xi):
        X = jnp.concatenate([skew(xi[3:]), xi[:3, None]], axis=1)
        return jnp.concatenate([X, jnp.zeros((1, 4), dtype=xi.dtype)], axis=0)

    def vee(self, X):
        return jnp.concatenate([X[:3, 3], unskew(X[:3, :3])])

    def exp(self, xi):
        v, w = xi[:3], xi[3:]
        return _homogeneous(_SO3.exp(w), _SO3.dexp(-w) @ v)

    def log(self, g):
        R, t = g[:3, :3], g[:3, 3]
        w = _SO3.log(R)
        return jnp.concatenate([_SO3.dexp_inv(-w) @ t, w])

    def ad(self, xi):
        W = skew(xi[3:])
        return _blocks(W, skew(xi[:3]), W)

    def Ad(self, g):  # noqa: N802
        R, t = g[:3, :3], g[:3, 3]
        return _blocks(R, skew(t) @ R, R)

    def dexp(self, xi):
        v, w = xi[:3], xi[3:]
        s = jnp.dot(w, w)
        c2, c3 = dexp_coefficients(s)
        J = jnp.eye(3, dtype=xi.dtype) - c2 * skew(w) + c3 * _skew_sq(w, s)   # SO(3)'s dexp
        return _blocks(J, _left_jacobian_q(v, w, s, c3), J)

    def dexp_inv(self, xi):
        v, w = xi[:3], xi[3:]
        s = jnp.dot(w, w)
        Ji = _SO3.dexp_inv(w)
        return _blocks(Ji, -(Ji @ _left_jacobian_q(v, w, s, sin3(s)) @ Ji), Ji)

    # -- Cayley -----------------------------------------------------------------------------------
    def cay(self, xi):
        v, w = xi[:3], xi[3:]
        s = jnp.dot(w, w)
        # (I - W/2)^{-1} = 4/(4 + θ²) (I + W/2 + ω ωᵀ/4)
        t = (4.0 / (4.0 + s)) * (v + 0.5 * jnp.cross(w, v) + 0.25 * jnp.dot(w, v) * w)
        return _homogeneous(_SO3.cay(w), t)

    def cay_inv(self, g):
        w = _SO3.cay_inv(g[:3, :3])
        t = g[:3, 3]
        return jnp.concatenate([t - 0.5 * jnp.cross(w, t), w])

    def dcay(self, xi):
        v, w = xi[:3], xi[3:]
        s = jnp.dot(w, w)
        W = skew(w)
        D = _SO3.dcay(w)
        Ainv = (4.0 / (4.0 + s)) * (jnp.eye(3, dtype=xi.dtype) - 0.5 * W + 0.25 * jnp.outer(w, w))
        return _blocks(Ainv, -0.5 * skew(v) @ D, D)

    def dcay_inv(self, xi):
        v, w = xi[:3], xi[3:]
        A = jnp.eye(3, dtype=xi.dtype) + 0.5 * skew(w)
        return _blocks(A, 0.5 * A @ skew(v), _SO3.dcay_inv(w))

    # -- vector forms -----------------------------------------------------------------------------
    def Ad_apply(self, g, xi):  # noqa: N802
        R, t = g[:3, :3], g[:3, 3]
        Rw = R @ xi[3:]
        return jnp.concatenate([R @ xi[:3] + jnp.cross(t, Rw), Rw])

    def Ad_star(self, g, mu):  # noqa: N802
        R, t = g[:3, :3], g[:3, 3]
        mv, mw = mu[:3], mu[3:]
        return jnp.concatenate([R.T @ mv, R.T @ (mw - jnp.cross(t, mv))])

    def ad_apply(self, xi, eta):
        v, w = xi[:3], xi[3:]
        ev, ew = eta[:3], eta[3:]
        return jnp.concatenate([jnp.cross(w, ev) + jnp.cross(v, ew), jnp.cross(w, ew)])

    def ad_star(self, xi, mu):
        v, w = xi[:3], xi[3:]
        mv, mw = mu[:3], mu[3:]
        return jnp.concatenate([jnp.cross(mv, w), jnp.cross(mv, v) + jnp.cross(mw, w)])
