"""The Lie-group interface of configuration spaces; ``R^n`` is the abelian case.

Configuration spaces are Lie groups ``G`` whose Lie algebra ``g`` is identified with ``R^d``
by ``hat``/``vee``, and ``g*`` with ``R^d`` by the dual basis, so that every dual map
(``Ad*``, ``ad*``, ``(dτ)*``) is the transpose of its matrix.  The interface carries what the
Lie-group integrators need:

* the group operations and ``Ad``, ``ad`` and their duals;
* the exponential with its **left-trivialised** tangent ``dexp`` (``d/dt exp(x(t)) =
  exp(x) (dexp_x x')``, Martín de Diego & Sato Martín de Almagro (2022), §6.1) and its
  inverse; the right-trivialised tangent of Bogfjellmo & Marthinsen (2016) is
  ``dexp_{-x}`` in this convention (``d^R τ_x = Ad_{τ(x)} d^L τ_x = d^L τ_{-x}``);
* on groups where it is defined (:class:`AbstractCayleyGroup`), the Cayley map with the same
  tangents.

Integrators reach ``exp`` and ``cay`` through a retraction value (:class:`vijax.lie.Exp`,
:class:`vijax.lie.Cayley`), which adds ``ddτ*``.  Elements are arrays (a matrix for the matrix
groups, a vector for ``R^n``) or tuples of them (:class:`vijax.lie.ProductGroup`); the
methods act on a single element (``jax.vmap`` for batches), in the style of jaxlie.

The vector forms (``Ad_apply``, ``Ad_star``, ``ad_star``, ``dexp_apply`` ...) are what the
integrators call: ``R^n`` implements them as the identity or zero without building matrices,
so that a method written on the group costs nothing extra on a vector space.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._linalg import mm

__all__ = ["AbstractLieGroup", "AbstractCayleyGroup", "AbstractMatrixLieGroup",
           "CommutativeVectorForms"]


class AbstractLieGroup(eqx.Module):
    """A Lie group with algebra ``R^d``.  Matrices below act on algebra vectors
    (``Ad(g) @ xi``); their transposes act on ``g* = R^d``."""

    #: ``True`` for a commutative group (``R^n``, SO(2) and products of them): ``Ad = I`` and
    #: ``ad = 0``, so that ``d^L exp = I`` and the duals ``Ad*``, ``ad*`` drop out.
    commutative: ClassVar[bool] = False
    #: ``True`` for ``R^n`` (and products of it): ``compose = +`` and ``exp = cay = id``, so that
    #: every retraction's tangent is the identity.
    vector_space: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Dimension ``d`` of the Lie algebra."""

    # -- elements -----------------------------------------------------------------------------
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
    def project(self, g):
        """The nearest group element to ``g`` (e.g. the polar factor of a near-rotation):
        the helper that repairs initial data slightly off the group."""

    @abc.abstractmethod
    def distance(self, g):
        """How far ``g`` is from the group (0 on it), e.g. ``‖gᵀg - I‖_F`` for rotations:
        what the bad-input checks and the group-drift diagnostics measure."""

    def check_shape(self, g) -> None:
        """Raise ``ValueError`` if ``g`` does not have the shape of an element (concrete
        shapes only)."""
        want = jax.tree_util.tree_map(jnp.shape, self.identity())
        got = jax.tree_util.tree_map(jnp.shape, g)
        if jax.tree_util.tree_structure(want) != jax.tree_util.tree_structure(got) or \
                jax.tree_util.tree_leaves(want) != jax.tree_util.tree_leaves(got):
            raise ValueError(f"an element of {self!r} has shape {want}, got {got}")

    # -- algebra --------------------------------------------------------------------------------
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
        """Matrix of ``Ad_g`` on ``R^d`` (``Ad_g η = vee(g hat(η) g^{-1})``)."""

    @abc.abstractmethod
    def dexp(self, xi):
        """Left-trivialised tangent of ``exp`` at ``xi``, a ``(d, d)`` matrix:
        ``d/dε exp(xi + ε η)|_0 = exp(xi) hat(dexp(xi) @ η)``."""

    def dexp_inv(self, xi):
        """``dexp(xi)^{-1}``; groups override with closed forms."""
        return jnp.linalg.inv(self.dexp(xi))

    # -- vector forms (what integrators call; R^n makes them free) ------------------------------
    def Ad_apply(self, g, xi):  # noqa: N802
        """``Ad_g xi``."""
        return self.Ad(g) @ xi

    def Ad_star(self, g, mu):  # noqa: N802
        """``Ad*_g mu = Ad_gᵀ mu`` (``<Ad*_g mu, η> = <mu, Ad_g η>``; ``Ad*_{gh} = Ad*_h Ad*_g``)."""
        return self.Ad(g).T @ mu

    def ad_apply(self, xi, eta):
        """``ad_xi eta = [xi, eta]``."""
        return self.ad(xi) @ eta

    def ad_star(self, xi, mu):
        """``ad*_xi mu = ad_xiᵀ mu`` (``<ad*_xi mu, ζ> = <mu, [xi, ζ]>``)."""
        return self.ad(xi).T @ mu

    def left_gradient(self, f, g):
        """``L*_g Df(g)``: the gradient of ``ζ -> f(g exp(ζ))`` at ``ζ = 0`` (the
        left-trivialised derivative of a scalar function on ``G``)."""
        zero = jnp.zeros(self.dim, dtype=jax.tree_util.tree_leaves(g)[0].dtype)
        return jax.grad(lambda z: f(self.compose(g, self.exp(z))))(zero)

    def left_jacobian(self, f, g):
        """The left-trivialised Jacobian ``(m, d)`` of a vector function on ``G``."""
        zero = jnp.zeros(self.dim, dtype=jax.tree_util.tree_leaves(g)[0].dtype)
        return jax.jacfwd(lambda z: f(self.compose(g, self.exp(z))))(zero)


class AbstractCayleyGroup(AbstractLieGroup):
    """A group on which the Cayley map ``cay(ξ) = (I - ξ̂/2)^{-1} (I + ξ̂/2)`` is a retraction
    (quadratic groups such as SO(n), and SE(n); Kobilarov & Marsden (2011)).  Declaring this
    base is what lets :class:`vijax.lie.Cayley` be used on the group."""

    @abc.abstractmethod
    def cay(self, xi):
        """The Cayley map."""

    @abc.abstractmethod
    def cay_inv(self, g):
        """Its inverse ``cay^{-1}(g) = 2 (g - I)(g + I)^{-1}`` (near the identity)."""

    @abc.abstractmethod
    def dcay(self, xi):
        """Left-trivialised tangent of ``cay`` at ``xi`` (``(d, d)``)."""

    @abc.abstractmethod
    def dcay_inv(self, xi):
        """``dcay(xi)^{-1}``."""


class AbstractMatrixLieGroup(AbstractLieGroup):
    """A group of ``(k, k)`` matrices: ``compose`` is the matrix product, and ``Ad``, ``ad``,
    ``dexp`` have generic defaults through ``hat``/``vee`` and autodiff (groups override them
    with closed forms)."""

    @abc.abstractmethod
    def hat(self, xi):
        """``R^d -> g`` as a ``(k, k)`` matrix."""

    @abc.abstractmethod
    def vee(self, X):
        """Inverse of :meth:`hat`."""

    def compose(self, g, h):
        # As fusible small products: a stack of stage elements against one shared element
        # (``vmap`` over the stages of g_k τ(Ξ^i), of g exp(z) in the derivatives) is one wide
        # product, which XLA:CPU hands to YNNPACK once a dimension reaches 8 (three stages of
        # 3 x 3 matrices), a library call costing several plain products: the unicycle's
        # Lobatto(3) step 0.65x with this (15.5 -> 10.1 us), the ball on the turntable 0.93x,
        # the heavy top's Gauss(2) step (two stages, no library call) 0.99x.  Under a vmap over
        # many members the batched dots are efficient: with SO(3)'s hat as a stack too,
        # ensembles of heavy tops run 0.82x (called, CPU blocks of 64), 0.83x (64 members in
        # one program) and 1.10x (512 in one program), of unicycles 1.01-1.06x.
        return mm(g, h)

    def inverse(self, g):
        return jnp.linalg.inv(g)

    def Ad(self, g):  # noqa: N802
        ginv = self.inverse(g)
        eye = jnp.eye(self.dim, dtype=g.dtype)
        return jax.vmap(lambda e: self.vee(g @ self.hat(e) @ ginv), out_axes=1)(eye)

    def ad(self, xi):
        X = self.hat(xi)
        eye = jnp.eye(self.dim, dtype=xi.dtype)
        return jax.vmap(lambda e: self.vee(X @ self.hat(e) - self.hat(e) @ X), out_axes=1)(eye)

    def dexp(self, xi):
        # d^L exp_xi eta = vee(exp(xi)^{-1} D exp(xi)[eta]).
        E_inv = self.inverse(self.exp(xi))
        J = jax.jacfwd(self.exp)(xi)  # (k, k, d)
        return jax.vmap(lambda Jc: self.vee(E_inv @ Jc), in_axes=2, out_axes=1)(J)


class CommutativeVectorForms:
    """The vector forms of a commutative group (``R^n``, SO(2)): ``Ad = I`` and ``ad = 0``
    act without building matrices.  Declares :attr:`AbstractLieGroup.commutative`."""

    commutative: ClassVar[bool] = True

    def Ad_apply(self, g, xi):  # noqa: N802
        return xi

    def Ad_star(self, g, mu):  # noqa: N802
        return mu

    def ad_apply(self, xi, eta):
        return jnp.zeros_like(eta)

    def ad_star(self, xi, mu):
        return jnp.zeros_like(mu)
