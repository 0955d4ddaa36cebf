"""``R^n`` under addition: the abelian Lie group of the vector-space integrators."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from ._base import AbstractLieGroup

__all__ = ["Rn"]


class Rn(AbstractLieGroup):
    """``R^n``: ``compose = +``, ``exp = tau = identity``, ``dtau = I``, ``ad = 0``, ``Ad = I``.
    On it the Lie-group methods reduce exactly to the vector-space ones."""

    n: int = eqx.field(static=True)

    @property
    def dim(self) -> int:
        return self.n

    def identity(self, dtype=None):
        return jnp.zeros(self.n, dtype=dtype)

    def compose(self, g, h):
        return g + h

    def inverse(self, g):
        return -g

    def exp(self, xi):
        return xi

    def log(self, g):
        return g

    def ad(self, xi):
        return jnp.zeros((self.n, self.n), dtype=xi.dtype)

    def Ad(self, g):  # noqa: N802
        return jnp.eye(self.n, dtype=g.dtype)

    def dtau(self, xi):
        return jnp.eye(self.n, dtype=xi.dtype)

    def dtau_inv(self, xi):
        return jnp.eye(self.n, dtype=xi.dtype)
