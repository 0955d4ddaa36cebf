"""The rotation group SO(2) as ``2 × 2`` rotation matrices, algebra ``R^1``.

SO(2) is commutative (``commutative = True``): ``Ad = 1``, ``ad = 0`` and ``d^L exp = 1``
exactly.  It is not a vector space: the Cayley map ``cay(ξ) = (I - ξ̂/2)^{-1}(I + ξ̂/2)`` is the
rotation by ``2 atan(ξ/2)``, whose tangent ``d^L cay_ξ = 1/(1 + ξ²/4)`` is not the identity
(:meth:`vijax.lie.AbstractRetraction.flat` is true for ``exp`` on SO(2), false for ``cay``).
Compare :class:`vijax.lie.Rn` for the angle as a plain number.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._base import AbstractCayleyGroup, AbstractMatrixLieGroup, CommutativeVectorForms
from ._se2 import project_rotation2

__all__ = ["SO2"]


def _rotation(c, s):
    return jnp.stack([jnp.stack([c, -s]), jnp.stack([s, c])])


class SO2(CommutativeVectorForms, AbstractMatrixLieGroup, AbstractCayleyGroup):
    """Planar rotations SO(2): ``2 × 2`` matrices ``[[cos θ, -sin θ], [sin θ, cos θ]]``, algebra
    ``R^1`` with ``hat(ξ) = [[0, -ξ], [ξ, 0]]``.  ``exp(ξ)`` is the rotation by ``ξ``,
    ``log(R) = atan2(R10, R00)``, ``Ad = dexp = 1``, ``ad = 0``; ``cay(ξ)`` is the rotation with
    ``cos = (4 - ξ²)/(4 + ξ²)``, ``sin = 4ξ/(4 + ξ²)``, ``d^L cay_ξ = 1/(1 + ξ²/4)``."""

    @property
    def dim(self) -> int:
        return 1

    # -- elements -----------------------------------------------------------------------------
    def identity(self, dtype=None):
        return jnp.eye(2, dtype=dtype)

    def inverse(self, g):
        return g.T

    def project(self, g):
        return project_rotation2(g)

    def distance(self, g):
        return (jnp.linalg.norm(g.T @ g - jnp.eye(2, dtype=g.dtype))
                + jnp.abs(g[0, 0] * g[1, 1] - g[0, 1] * g[1, 0] - 1.0))

    @staticmethod
    def from_angle(theta):
        """The rotation by ``theta``."""
        return _rotation(jnp.cos(theta), jnp.sin(theta))

    # -- algebra --------------------------------------------------------------------------------
    def hat(self, xi):
        o = jnp.zeros_like(xi[0])
        return _rotation(o, xi[0])

    def vee(self, X):
        return jnp.stack([0.5 * (X[1, 0] - X[0, 1])])

    def exp(self, xi):
        return _rotation(jnp.cos(xi[0]), jnp.sin(xi[0]))

    def log(self, g):
        return jnp.stack([jnp.arctan2(g[1, 0], g[0, 0])])

    def ad(self, xi):
        return jnp.zeros((1, 1), dtype=xi.dtype)

    def Ad(self, g):  # noqa: N802
        return jnp.ones((1, 1), dtype=g.dtype)

    def dexp(self, xi):
        return jnp.ones((1, 1), dtype=xi.dtype)

    def dexp_inv(self, xi):
        return jnp.ones((1, 1), dtype=xi.dtype)

    # -- Cayley -----------------------------------------------------------------------------------
    def cay(self, xi):
        x = xi[0]
        d = 4.0 + x * x
        return _rotation((4.0 - x * x) / d, 4.0 * x / d)

    def cay_inv(self, g):
        return jnp.stack([2.0 * g[1, 0] / (1.0 + g[0, 0])])

    def dcay(self, xi):
        return (1.0 / (1.0 + 0.25 * xi * xi))[:, None]

    def dcay_inv(self, xi):
        return (1.0 + 0.25 * xi * xi)[:, None]
