"""Direct products of Lie groups: ``G = G_1 × ... × G_k``.

Elements are tuples ``(g_1, ..., g_k)`` of factor elements; the algebra is the concatenation
``R^{d_1} ⊕ ... ⊕ R^{d_k}``, so ``Ad``, ``ad``, ``dexp``, ``dexp_inv``, ``dcay``, ``dcay_inv``
are block diagonal and every map acts factor by factor.  A ball rolling on a plane lives on
``ProductGroup(SO3(), Rn(2))`` (orientation and contact point), a planar vehicle with a steering
angle on ``ProductGroup(SE2(), Rn(1))``.

The Cayley map of a product is the product of the factors' Cayley maps (the block form of
``(I - ξ̂/2)^{-1}(I + ξ̂/2)``, Kobilarov & Marsden (2011)); it is defined when every factor is
an :class:`vijax.lie.AbstractCayleyGroup` (or itself such a product), which is what
:meth:`vijax.lie.Cayley.check` tests.
"""

from __future__ import annotations

import jax.numpy as jnp
import jax.scipy.linalg as jsl

from ._base import AbstractCayleyGroup, AbstractLieGroup

__all__ = ["ProductGroup", "cayley_defined"]


def cayley_defined(group: AbstractLieGroup) -> bool:
    """Whether the Cayley map is defined on ``group``: an :class:`AbstractCayleyGroup`, or a
    :class:`ProductGroup` whose factors all are (recursively)."""
    if isinstance(group, ProductGroup):
        return all(cayley_defined(f) for f in group.factors)
    return isinstance(group, AbstractCayleyGroup)


class ProductGroup(AbstractLieGroup):
    """The direct product of the groups ``factors``: elements are tuples, the algebra is the
    concatenation of the factors' algebras, and every matrix (``Ad``, ``ad``, ``dexp``,
    ``dcay`` ...) is block diagonal.  ``ProductGroup(SO3(), Rn(2))`` is the configuration
    space of a ball rolling on a plane.

    The Cayley methods (``cay``, ``cay_inv``, ``dcay``, ``dcay_inv``) work when every factor
    is a Cayley group and raise ``TypeError`` naming the first factor that is not;
    :class:`vijax.lie.Cayley` checks this when an integrator is built."""

    factors: tuple

    def __init__(self, *factors: AbstractLieGroup):
        if not factors:
            raise ValueError("ProductGroup needs at least one factor")
        for i, f in enumerate(factors):
            if not isinstance(f, AbstractLieGroup):
                raise TypeError(f"ProductGroup: factor {i} is {f!r}, not a "
                                f"vijax.lie.AbstractLieGroup")
        self.factors = tuple(factors)

    @property
    def commutative(self) -> bool:  # every factor commutative
        return all(f.commutative for f in self.factors)

    @property
    def vector_space(self) -> bool:  # every factor R^n
        return all(f.vector_space for f in self.factors)

    @property
    def dims(self) -> tuple[int, ...]:
        """The factors' algebra dimensions."""
        return tuple(f.dim for f in self.factors)

    @property
    def dim(self) -> int:
        return sum(self.dims)

    # -- helpers ----------------------------------------------------------------------------------
    def split(self, xi):
        """The factor blocks ``(ξ_1, ..., ξ_k)`` of an algebra (or dual) vector."""
        out, start = [], 0
        for d in self.dims:
            out.append(xi[start:start + d])
            start += d
        return tuple(out)

    @staticmethod
    def _join(parts):
        return jnp.concatenate(parts)

    def _map(self, name, *args):
        return tuple(getattr(f, name)(*a) for f, *a in zip(self.factors, *args))

    def _check_cayley(self, what: str) -> None:
        for i, f in enumerate(self.factors):
            if not cayley_defined(f):
                raise TypeError(
                    f"{what} of {self!r} is not defined: factor {i}, {type(f).__name__}, is not "
                    f"a Cayley group (vijax.lie.AbstractCayleyGroup); use vijax.lie.Exp() "
                    f"instead.")

    # -- elements -----------------------------------------------------------------------------
    def identity(self, dtype=None):
        return tuple(f.identity(dtype) for f in self.factors)

    def compose(self, g, h):
        return self._map("compose", g, h)

    def inverse(self, g):
        return self._map("inverse", g)

    def project(self, g):
        return self._map("project", g)

    def distance(self, g):
        ds = self._map("distance", g)
        out = ds[0]
        for d in ds[1:]:
            out = out + d
        return out

    # -- algebra --------------------------------------------------------------------------------
    def exp(self, xi):
        return self._map("exp", self.split(xi))

    def log(self, g):
        return self._join(self._map("log", g))

    def ad(self, xi):
        return jsl.block_diag(*self._map("ad", self.split(xi)))

    def Ad(self, g):  # noqa: N802
        return jsl.block_diag(*self._map("Ad", g))

    def dexp(self, xi):
        return jsl.block_diag(*self._map("dexp", self.split(xi)))

    def dexp_inv(self, xi):
        return jsl.block_diag(*self._map("dexp_inv", self.split(xi)))

    # -- Cayley -----------------------------------------------------------------------------------
    def cay(self, xi):
        self._check_cayley("the Cayley map")
        return self._map("cay", self.split(xi))

    def cay_inv(self, g):
        self._check_cayley("the inverse Cayley map")
        return self._join(self._map("cay_inv", g))

    def dcay(self, xi):
        self._check_cayley("dcay")
        return jsl.block_diag(*self._map("dcay", self.split(xi)))

    def dcay_inv(self, xi):
        self._check_cayley("dcay_inv")
        return jsl.block_diag(*self._map("dcay_inv", self.split(xi)))

    # -- vector forms (factor by factor, so R^n factors stay free) ------------------------------
    def Ad_apply(self, g, xi):  # noqa: N802
        return self._join(self._map("Ad_apply", g, self.split(xi)))

    def Ad_star(self, g, mu):  # noqa: N802
        return self._join(self._map("Ad_star", g, self.split(mu)))

    def ad_apply(self, xi, eta):
        return self._join(self._map("ad_apply", self.split(xi), self.split(eta)))

    def ad_star(self, xi, mu):
        return self._join(self._map("ad_star", self.split(xi), self.split(mu)))
