"""Retractions ``τ: g -> G`` with their trivialised tangents: the exponential and the Cayley map.

A retraction is a local diffeomorphism with ``τ(0) = e``, ``T_0 τ = id`` and, as the
simplifications of the Lie-group PRK need, ``τ(-ξ) = τ(ξ)^{-1}`` (Martín de Diego & Sato
Martín de Almagro (2022), §6.1).  It carries:

* ``tau``, ``tau_inv``;
* ``dtau(G, ξ)``: the left-trivialised tangent ``d^L τ_ξ`` (``T_ξ τ · v = τ(ξ) d^L τ_ξ v``),
  and ``dtau_inv``;
* ``ddtau_star(G, ξ, η, Π)``: the dual of the second trivialised tangent,
  ``<(dd^L τ_ξ)*(η, Π), δξ> = <Π, (d^L τ_ξ)^{-1} ∂_ξ(d^L τ_ξ η) δξ>`` -- one ``jax.vjp`` of
  ``ξ -> d^L τ_ξ η`` (the term whose omission drops the Lie-group PRK to order 1).

A retraction is a small value held by an integrator (``GroupVPRK.lobatto(3,
retraction=vj.lie.Cayley())``); it asks the group for the closed forms.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax

from ._base import AbstractCayleyGroup, AbstractLieGroup
from ._product import ProductGroup, cayley_defined

__all__ = ["AbstractRetraction", "Exp", "Cayley"]


class AbstractRetraction(eqx.Module):
    """``τ`` and its trivialised tangents on a given group."""

    @property
    def name(self) -> str:
        return type(self).__name__.lower()

    def check(self, group: AbstractLieGroup) -> None:
        """Raise ``TypeError`` if the retraction is not defined on ``group``."""

    @abc.abstractmethod
    def flat(self, group: AbstractLieGroup) -> bool:
        """``True`` when ``d^L τ = I`` on all of ``g`` (so ``dd^L τ = 0``): integrators then
        skip the tangent maps, exactly."""

    @abc.abstractmethod
    def tau(self, group: AbstractLieGroup, xi):
        """``τ(ξ)``."""

    @abc.abstractmethod
    def tau_inv(self, group: AbstractLieGroup, g):
        """``τ^{-1}(g)`` near the identity."""

    @abc.abstractmethod
    def dtau(self, group: AbstractLieGroup, xi):
        """``d^L τ_ξ``, a ``(d, d)`` matrix."""

    @abc.abstractmethod
    def dtau_inv(self, group: AbstractLieGroup, xi):
        """``(d^L τ_ξ)^{-1}``."""

    def ddtau_star(self, group: AbstractLieGroup, xi, eta, Pi):
        """``(dd^L τ_ξ)*(η, Π) = [∂_ξ(d^L τ_ξ η)]ᵀ (d^L τ_ξ)^{-T} Π``."""
        _, vjp = jax.vjp(lambda x: self.dtau(group, x) @ eta, xi)
        return vjp(self.dtau_inv(group, xi).T @ Pi)[0]

    def retract(self, group: AbstractLieGroup, g, xi):
        """``g τ(ξ)``."""
        return group.compose(g, self.tau(group, xi))


class Exp(AbstractRetraction):
    """The exponential map, ``τ = exp`` (defined on every Lie group)."""

    def flat(self, group):
        # d^L exp = Σ (-ad)^k/(k+1)! = I where ad = 0
        return bool(group.commutative)

    def tau(self, group, xi):
        return group.exp(xi)

    def tau_inv(self, group, g):
        return group.log(g)

    def dtau(self, group, xi):
        return group.dexp(xi)

    def dtau_inv(self, group, xi):
        return group.dexp_inv(xi)


class Cayley(AbstractRetraction):
    """The Cayley map ``cay(ξ) = (I - ξ̂/2)^{-1}(I + ξ̂/2)``: rational, cheaper than ``exp``, and
    defined on the groups that declare :class:`vijax.lie.AbstractCayleyGroup` (SO(n), SE(n),
    ``R^n``), and on a :class:`vijax.lie.ProductGroup` whose factors all do."""

    def check(self, group):
        if isinstance(group, ProductGroup):
            bad = [f"{i} ({type(f).__name__})" for i, f in enumerate(group.factors)
                   if not cayley_defined(f)]
            if bad:
                raise TypeError(
                    f"the Cayley retraction is not defined on this ProductGroup: factor "
                    f"{', '.join(bad)} does not declare vijax.lie.AbstractCayleyGroup (every "
                    f"factor must, such as SO(3), SE(2), SE(3) or R^n); use vijax.lie.Exp() "
                    f"instead.")
            return
        if not isinstance(group, AbstractCayleyGroup):
            raise TypeError(
                f"the Cayley retraction is not defined on {type(group).__name__} (it needs a "
                f"group that declares vijax.lie.AbstractCayleyGroup, such as SO(3), SE(2), SE(3) "
                f"or R^n, or a ProductGroup of such groups); use vijax.lie.Exp() instead.")

    def flat(self, group):
        # d^L cay = (I - ad/2)^{-1} only on R^n, where cay = id (SO(2): 1/(1 + ξ²/4))
        return bool(group.vector_space)

    def tau(self, group, xi):
        return group.cay(xi)

    def tau_inv(self, group, g):
        return group.cay_inv(g)

    def dtau(self, group, xi):
        return group.dcay(xi)

    def dtau_inv(self, group, xi):
        return group.dcay_inv(xi)
