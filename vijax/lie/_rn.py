"""``R^n`` under addition: the abelian Lie group of the vector-space integrators."""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from ._base import AbstractCayleyGroup, CommutativeVectorForms

__all__ = ["Rn"]


class Rn(CommutativeVectorForms, AbstractCayleyGroup):
    """``R^n``: ``compose = +``, ``exp = cay = id``, ``dexp = dcay = I``, ``ad = 0``, ``Ad = I``.
    On it the Lie-group methods reduce exactly to the vector-space ones; the vector forms are
    identities, so they cost nothing."""

    n: int = eqx.field(static=True)
    vector_space: ClassVar[bool] = True

    @property
    def dim(self) -> int:
        return self.n

    def identity(self, dtype=None):
        return jnp.zeros(self.n, dtype=dtype)

    def compose(self, g, h):
        return g + h

    def inverse(self, g):
        return -g

    def project(self, g):
        return g

    def distance(self, g):
        return jnp.zeros((), dtype=g.dtype)

    def exp(self, xi):
        return xi

    def log(self, g):
        return g

    def ad(self, xi):
        return jnp.zeros((self.n, self.n), dtype=xi.dtype)

    def Ad(self, g):  # noqa: N802
        return jnp.eye(self.n, dtype=g.dtype)

    def dexp(self, xi):
        return jnp.eye(self.n, dtype=xi.dtype)

    def dexp_inv(self, xi):
        return jnp.eye(self.n, dtype=xi.dtype)

    cay = exp
    cay_inv = log
    dcay = dexp
    dcay_inv = dexp_inv
