"""Systems on Lie groups: a left-trivialised Lagrangian ``ℓ(g, ξ)`` on ``G × g``.

The configuration is a group element ``g`` (a rotation matrix, an SE(2) matrix, a tuple for a
product group) and the velocity the body velocity ``ξ = g^{-1} ġ ∈ g = R^d``.  Every derivative
is autodiff of :meth:`LieGroupSystem.lagrangian`: the body momentum ``μ = D2ℓ``, the
left-trivialised configuration derivative ``L*_g D1ℓ`` (the gradient of ``ζ -> ℓ(g exp(ζ), ξ)``
at ``ζ = 0``), the energy.  Holonomic ``Φ(g)``, nonholonomic ``φ(g, ξ)`` constraints and forces
``F(t, g, ξ, u) ∈ g*`` (left-trivialised, i.e. body torques and forces) are declared with the
same capability bases as on a vector space: ``class Unicycle(vj.LieGroupSystem,
vj.NonholonomicSystem)``.
"""

from __future__ import annotations

import abc
from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .. import _linalg
from .._typing import Matrix, Scalar, Vector
from ..lie import AbstractLieGroup
from ..solvers import Newton
from ._base import LagrangianSystem

__all__ = ["LieGroupSystem"]


class LieGroupSystem(LagrangianSystem):
    """A mechanical system on a Lie group ``G`` with a left-trivialised Lagrangian ``ℓ(g, ξ)``.

    Declare the group as the property :attr:`group` and implement :meth:`lagrangian`::

        class FreeRigidBody(vj.LieGroupSystem):
            inertia: jax.Array = jnp.array([1.0, 2.0, 3.0])
            quadratic_in_velocity = True
            @property
            def group(self):
                return vj.lie.SO3()
            def lagrangian(self, g, xi):
                return 0.5 * jnp.sum(self.inertia * xi**2)

    Initial data are a group element ``g0`` (for rotations the ``3 × 3`` matrix; build it from a
    unit quaternion with ``vj.lie.SO3.from_quaternion``) and a body velocity ``ξ0``.  The
    integrators of this type are the Lie-group families (:class:`vijax.GroupVPRK`,
    :class:`vijax.VRKMK`, :class:`vijax.VCG`); the vector-space families refuse it.
    """

    @property
    @abc.abstractmethod
    def group(self) -> AbstractLieGroup:
        """The configuration group ``G``."""

    @abc.abstractmethod
    def lagrangian(self, g, xi: Float[Array, " d"]) -> Float[Array, ""]:
        """The left-trivialised Lagrangian ``ℓ(g, ξ)`` (a scalar)."""

    # -- derivatives, all by autodiff ---------------------------------------------------------
    def d1_lagrangian(self, g, xi: Vector) -> Vector:
        """``L*_g D1ℓ(g, ξ)``: the gradient of ``ζ -> ℓ(g exp(ζ), ξ)`` at ``ζ = 0``."""
        return self.group.left_gradient(lambda h: self.lagrangian(h, xi), g)

    def momentum(self, g, xi: Vector) -> Vector:
        """Body momentum ``μ = D2ℓ(g, ξ)``."""
        return jax.grad(self.lagrangian, argnums=1)(g, xi)

    def derivatives(self, g, xi: Vector) -> tuple[Vector, Vector]:
        """``(L*_g D1ℓ, D2ℓ)`` in one reverse pass."""
        G = self.group
        zero = jnp.zeros_like(xi)
        return jax.grad(lambda z, x: self.lagrangian(G.compose(g, G.exp(z)), x),
                        argnums=(0, 1))(zero, xi)

    def velocity_hessian(self, g, xi: Vector) -> Matrix:
        return jax.jacfwd(self.momentum, argnums=1)(g, xi)

    def inverse_velocity_hessian(self, g, xi: Vector) -> Matrix:
        return _linalg.inv(self.velocity_hessian(g, xi))

    def energy(self, g, xi: Vector) -> Scalar:
        return jnp.vdot(self.momentum(g, xi), xi) - self.lagrangian(g, xi)

    def velocity(self, g, mu: Vector, v_guess: Optional[Vector] = None) -> Vector:
        """Inverse Legendre map: the body velocity ``ξ`` with ``D2ℓ(g, ξ) = μ``."""
        if self.quadratic_in_velocity:
            zero = jnp.zeros_like(mu)
            return self.inverse_velocity_hessian(g, zero) @ (mu - self.momentum(g, zero))
        guess = jnp.zeros_like(mu) if v_guess is None else v_guess
        xi, _ = Newton(damped=True).solve(lambda x: self.momentum(g, x) - mu, guess)
        return xi

    def project_configuration(self, g):
        """The nearest group element (:meth:`vijax.lie.AbstractLieGroup.project`)."""
        return self.group.project(g)
