"""The planar rigid motions SE(2), with closed forms for ``exp``, ``log``, ``cay`` and their
tangents.

Elements are ``3 × 3`` matrices ``g = [[cos θ, -sin θ, x], [sin θ, cos θ, y], [0, 0, 1]]``; the
algebra is ``R^3`` with the translation first, ``ξ = (v1, v2, ω)``, ``hat(ξ) = [[0, -ω, v1],
[ω, 0, v2], [0, 0, 0]]`` (the body velocity of a planar rigid body).  With ``J = [[0, -1],
[1, 0]]``, ``a = sin ω/ω``, ``b = (1 - cos ω)/ω²``, ``c = (ω - sin ω)/ω³``:

* ``exp(ξ) = [[R(ω), V v], [0, 1]]``, ``V = a I + b ω J``; ``log`` with
  ``V^{-1} = (ω/2) cot(ω/2) I - (ω/2) J``;
* ``d^L exp_ξ = [[a I - b ω J, (c ω I - b J) v], [0, 1]]`` (left-trivialised, the "right
  Jacobian" of Solà, Deray & Atchuthan (2018)), and its block inverse;
* ``cay(ξ)``, ``d^L cay_ξ`` and ``(d^L cay_ξ)^{-1}`` in the closed forms of Kobilarov &
  Marsden (2011) (with ``d = 4 + ω²``: ``d^L cay_ξ = (1/d) [[4, 2ω, -2v2], [-2ω, 4, 2v1],
  [0, 0, 4]]``);
* ``Ad_g = [[R, (y, -x)ᵀ], [0, 1]]``, ``ad_ξ = [[-ω J, (v2, -v1)ᵀ], [0, 0]]``.

The coefficients are functions of ``ω²`` with the Taylor branches of the SO(3) module ("double
where"), so values and first and second derivatives are finite at ``ξ = 0``.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._base import AbstractCayleyGroup, AbstractMatrixLieGroup
from ._so3 import SeriesStack, cos2, exp_coefficients, halfcot, sin3, sinc

# the coefficients of dexp and dexp^{-1}, each set one kernel (SeriesStack)
_DEXP = SeriesStack(sinc, cos2, sin3)
_DEXP_INV = SeriesStack(cos2, sin3, halfcot)

__all__ = ["SE2"]


def _rows(*rows):
    return jnp.stack([jnp.stack(r) for r in rows])


def _matrix(c, s, x, y):
    """``[[c, -s, x], [s, c, y], [0, 0, 1]]``."""
    o, i = jnp.zeros_like(c), jnp.ones_like(c)
    return _rows((c, -s, x), (s, c, y), (o, o, i))


def project_rotation2(M):
    """The rotation nearest to the ``2 × 2`` matrix ``M`` in the Frobenius norm: angle
    ``atan2(M10 - M01, M00 + M11)`` (it maximises ``tr(Rᵀ M)``)."""
    phi = jnp.arctan2(M[1, 0] - M[0, 1], M[0, 0] + M[1, 1])
    c, s = jnp.cos(phi), jnp.sin(phi)
    return jnp.stack([jnp.stack([c, -s]), jnp.stack([s, c])])


def rigid_distance(g):
    """How far a ``(k+1) × (k+1)`` matrix is from SE(k): ``‖RᵀR - I‖_F + |det R - 1|`` of the
    rotation block plus the norm of the bottom-row defect ``‖g[k] - (0, ..., 0, 1)‖``."""
    k = g.shape[-1] - 1
    R = g[:k, :k]
    e = jnp.zeros(k + 1, dtype=g.dtype).at[k].set(1.0)
    return (jnp.linalg.norm(R.T @ R - jnp.eye(k, dtype=g.dtype))
            + jnp.abs(jnp.linalg.det(R) - 1.0) + jnp.linalg.norm(g[k] - e))


class SE2(AbstractMatrixLieGroup, AbstractCayleyGroup):
    """Planar rigid motions SE(2): ``3 × 3`` homogeneous matrices, algebra ``R^3`` ordered
    ``(v1, v2, ω)`` (translation first).  Closed forms for every map (module docstring)."""

    @property
    def dim(self) -> int:
        return 3

    # -- elements -----------------------------------------------------------------------------
    def identity(self, dtype=None):
        return jnp.eye(3, dtype=dtype)

    def inverse(self, g):
        R, t = g[:2, :2], g[:2, 2]
        ti = -(R.T @ t)
        return _matrix(g[0, 0], -g[1, 0], ti[0], ti[1])

    def project(self, g):
        R = project_rotation2(g[:2, :2])
        return _matrix(R[0, 0], R[1, 0], g[0, 2], g[1, 2])

    def distance(self, g):
        return rigid_distance(g)

    @staticmethod
    def from_xy_theta(x, y, theta):
        """The element of position ``(x, y)`` and heading ``theta``."""
        return _matrix(jnp.cos(theta), jnp.sin(theta), x, y)

    # -- algebra --------------------------------------------------------------------------------
    def hat(self, xi):
        v1, v2, w = xi[0], xi[1], xi[2]
        o = jnp.zeros_like(w)
        return _rows((o, -w, v1), (w, o, v2), (o, o, o))

    def vee(self, X):
        return jnp.stack([X[0, 2], X[1, 2], 0.5 * (X[1, 0] - X[0, 1])])

    def exp(self, xi):
        v1, v2, w = xi[0], xi[1], xi[2]
        s = w * w
        a, b = exp_coefficients(s)
        # V = a I + b w J
        x = a * v1 - b * w * v2
        y = b * w * v1 + a * v2
        return _matrix(jnp.cos(w), jnp.sin(w), x, y)

    def log(self, g):
        w = jnp.arctan2(g[1, 0], g[0, 0])
        x, y = g[0, 2], g[1, 2]
        hc = halfcot(w * w)
        return jnp.stack([hc * x + 0.5 * w * y, -0.5 * w * x + hc * y, w])

    def ad(self, xi):
        v1, v2, w = xi[0], xi[1], xi[2]
        o = jnp.zeros_like(w)
        return _rows((o, -w, v2), (w, o, -v1), (o, o, o))

    def Ad(self, g):  # noqa: N802
        c, s, x, y = g[0, 0], g[1, 0], g[0, 2], g[1, 2]
        o, i = jnp.zeros_like(c), jnp.ones_like(c)
        return _rows((c, -s, y), (s, c, -x), (o, o, i))

    def dexp(self, xi):
        v1, v2, w = xi[0], xi[1], xi[2]
        s = w * w
        a, b, c = _DEXP(s)
        o, i = jnp.zeros_like(w), jnp.ones_like(w)
        return _rows((a, b * w, c * w * v1 - b * v2),
                     (-b * w, a, b * v1 + c * w * v2),
                     (o, o, i))

    def dexp_inv(self, xi):
        v1, v2, w = xi[0], xi[1], xi[2]
        s = w * w
        b, c, hc = _DEXP_INV(s)
        u1 = c * w * v1 - b * v2
        u2 = b * v1 + c * w * v2
        # [[A, u], [0, 1]]^{-1} = [[A^{-1}, -A^{-1} u], [0, 1]], A^{-1} = hc I + (w/2) J
        o, i = jnp.zeros_like(w), jnp.ones_like(w)
        return _rows((hc, -0.5 * w, -(hc * u1 - 0.5 * w * u2)),
                     (0.5 * w, hc, -(0.5 * w * u1 + hc * u2)),
                     (o, o, i))

    # -- Cayley -----------------------------------------------------------------------------------
    def cay(self, xi):
        v1, v2, w = xi[0], xi[1], xi[2]
        d = 4.0 + w * w
        return _matrix((4.0 - w * w) / d, 4.0 * w / d, (4.0 * v1 - 2.0 * w * v2) / d,
                       (2.0 * w * v1 + 4.0 * v2) / d)

    def cay_inv(self, g):
        w = 2.0 * g[1, 0] / (1.0 + g[0, 0])
        x, y = g[0, 2], g[1, 2]
        return jnp.stack([x + 0.5 * w * y, -0.5 * w * x + y, w])

    def dcay(self, xi):
        v1, v2, w = xi[0], xi[1], xi[2]
        d = 4.0 + w * w
        o = jnp.zeros_like(w)
        return _rows((4.0 / d, 2.0 * w / d, -2.0 * v2 / d),
                     (-2.0 * w / d, 4.0 / d, 2.0 * v1 / d),
                     (o, o, 4.0 / d))

    def dcay_inv(self, xi):
        v1, v2, w = xi[0], xi[1], xi[2]
        o, i = jnp.zeros_like(w), jnp.ones_like(w)
        return _rows((i, -0.5 * w, 0.5 * v2 + 0.25 * w * v1),
                     (0.5 * w, i, -0.5 * v1 + 0.25 * w * v2),
                     (o, o, 1.0 + 0.25 * w * w))

    # -- vector forms -----------------------------------------------------------------------------
    def Ad_apply(self, g, xi):  # noqa: N802
        c, s, x, y = g[0, 0], g[1, 0], g[0, 2], g[1, 2]
        v1, v2, w = xi[0], xi[1], xi[2]
        return jnp.stack([c * v1 - s * v2 + w * y, s * v1 + c * v2 - w * x, w])

    def Ad_star(self, g, mu):  # noqa: N802
        c, s, x, y = g[0, 0], g[1, 0], g[0, 2], g[1, 2]
        m1, m2, m3 = mu[0], mu[1], mu[2]
        return jnp.stack([c * m1 + s * m2, -s * m1 + c * m2, m3 + y * m1 - x * m2])

    def ad_apply(self, xi, eta):
        v1, v2, w = xi[0], xi[1], xi[2]
        e1, e2, e3 = eta[0], eta[1], eta[2]
        return jnp.stack([-w * e2 + v2 * e3, w * e1 - v1 * e3, jnp.zeros_like(w)])

    def ad_star(self, xi, mu):
        v1, v2, w = xi[0], xi[1], xi[2]
        m1, m2 = mu[0], mu[1]
        return jnp.stack([w * m2, -w * m1, v2 * m1 - v1 * m2])
