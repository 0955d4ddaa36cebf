"""The Lie-group interface of configuration spaces; ``R^n`` is the abelian case.

Configuration spaces are Lie groups ``G`` with Lie algebra ``g`` identified with ``R^d``
(``hat``/``vee``); ``R^n`` under addition is the abelian member every vector-space method
lives on.  The interface carries what the Lie-group integrators of Martín de Diego & Sato
Martín de Almagro (2022), §6 (RKMK-type variational PRK over a retraction ``tau``) need: the
group operations, a retraction ``tau: g -> G`` with ``tau(-xi) = tau(xi)^{-1}``, its
left-trivialised tangent ``dtau`` and
inverse ``dtau_inv``, and ``Ad``, ``ad``, ``ad*``.  Everything is written for a single element
(jax.vmap for batches), in the style of jaxlie.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax.numpy as jnp

__all__ = ["AbstractLieGroup"]


class AbstractLieGroup(eqx.Module):
    """A matrix or vector Lie group.  Elements are arrays; algebra elements are ``(d,)``
    vectors.  Matrices below act on algebra vectors (``Ad(g) @ xi``)."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Dimension ``d`` of the Lie algebra."""

    @abc.abstractmethod
    def identity(self, dtype=None):
        """The identity element."""

    @abc.abstractmethod
    def compose(self, g, h):
        """``g h``."""

    @abc.abstractmethod
    def inverse(self, g):
        """``g^{-1}``."""

    @abc.abstractmethod
    def exp(self, xi):
        """Exponential map ``g -> G``."""

    @abc.abstractmethod
    def log(self, g):
        """Logarithm ``G -> g`` (near the identity)."""

    @abc.abstractmethod
    def ad(self, xi):
        """Matrix of ``ad_xi = [xi, .]`` on ``R^d``."""

    @abc.abstractmethod
    def Ad(self, g):  # noqa: N802 - standard notation
        """Matrix of ``Ad_g`` on ``R^d``."""

    # -- retraction: exp by default; groups may offer Cayley -------------------------------
    def tau(self, xi):
        """Retraction ``tau: g -> G`` with ``tau(-xi) = tau(xi)^{-1}``.

        See Martín de Diego & Sato Martín de Almagro (2022), §6.1.
        """
        return self.exp(xi)

    @abc.abstractmethod
    def dtau(self, xi):
        """Left-trivialised tangent of ``tau`` at ``xi`` (``d^L tau_xi``), a ``(d, d)`` matrix."""

    def dtau_inv(self, xi):
        """``(d^L tau_xi)^{-1}``."""
        return jnp.linalg.inv(self.dtau(xi))

    def ad_star(self, xi, mu):
        """Coadjoint action ``ad*_xi mu = ad_xi^T mu`` (``<ad*_xi mu, zeta> = <mu, [xi, zeta]>``)."""
        return self.ad(xi).T @ mu

    def retract(self, g, xi):
        """``g tau(xi)``: the left-trivialised retraction used for stage positions."""
        return self.compose(g, self.tau(xi))
