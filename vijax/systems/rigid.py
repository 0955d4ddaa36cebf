"""Rigid bodies on SO(3): the free rigid body, the heavy top and the "dipole on a stick" of
Bogfjellmo & Marthinsen (2016), §6 (with the data of §6.1).

Configurations are rotation matrices ``g`` (body to space), velocities the **body** angular
velocity ``Ω = vee(gᵀ ġ)``; each Lagrangian is left-trivialised, ``ℓ(g, Ω) = ½ ΩᵀIΩ − V(g)``
with a diagonal inertia tensor ``I = diag(inertia)`` (principal axes as body axes).  The
body momentum is ``μ̄ = IΩ``, the spatial angular momentum ``μ = g I Ω``.
"""

from typing import ClassVar

import jax
import jax.numpy as jnp
from equinox import AbstractVar

from ..lie import SO3
from ..lie._so3 import skew
from ._lie import LieGroupSystem

__all__ = ["FreeRigidBody", "HeavyTop", "DipoleOnStick"]


class _RigidBody(LieGroupSystem):
    """``ℓ(g, Ω) = ½ ΩᵀIΩ − V(g)`` on SO(3), ``I = diag(inertia)``; subclasses give
    :meth:`potential`."""

    #: The principal moments (a field, or a property computed from the parameters).
    inertia: AbstractVar[tuple | jnp.ndarray]

    quadratic_in_velocity: ClassVar[bool] = True

    @property
    def group(self) -> SO3:
        return SO3()

    def inertia_vector(self, dtype):
        """The principal moments as an array of ``dtype``."""
        return jnp.asarray(self.inertia, dtype)

    def potential(self, g):
        """``V(g)``: zero for the free body."""
        return jnp.zeros((), g.dtype)

    def lagrangian(self, g, xi):
        return 0.5 * jnp.sum(self.inertia_vector(xi.dtype) * xi**2) - self.potential(g)

    def d1_lagrangian(self, g, xi):
        """``L*_g D1ℓ = −L*_g DV``: the gradient of ``ζ ↦ −V(g (I + hat ζ))`` at ``ζ = 0``
        (autodiff; the derivative of ``exp`` at 0 is ``hat``, so this is the gradient of
        ``ζ ↦ ℓ(g exp(ζ), ξ)`` without differentiating the Rodrigues series)."""
        eye = jnp.eye(3, dtype=g.dtype)
        return jax.grad(lambda z: -self.potential(g @ (eye + skew(z))))(jnp.zeros_like(xi))

    def velocity(self, g, mu, v_guess=None):
        """``Ω = I⁻¹ μ̄`` (closed form of the inverse Legendre map)."""
        return mu / self.inertia_vector(mu.dtype)

    def inverse_velocity_hessian(self, g, xi):
        return jnp.diag(1.0 / self.inertia_vector(xi.dtype))

    def spatial_momentum(self, g, xi):
        """The spatial angular momentum ``g I Ω`` (about the fixed point): conserved by the
        free rigid body (rotational symmetry), its vertical component by the heavy top and
        the dipole."""
        return g @ (self.inertia_vector(xi.dtype) * xi)

    def body_momentum(self, g, xi):
        """``μ̄ = I Ω``."""
        return self.inertia_vector(xi.dtype) * xi


class FreeRigidBody(_RigidBody):
    """The free rigid body: ``ℓ(g, Ω) = ½ ΩᵀIΩ`` with principal moments ``inertia``
    (default ``(1, 2, 3)``).

    First integrals: the energy (:meth:`energy`), the spatial angular momentum
    (:meth:`spatial_momentum`, from the left invariance of ``ℓ``) and the Casimir ``|IΩ|²``
    (:meth:`casimir`)."""

    inertia: tuple | jnp.ndarray = (1.0, 2.0, 3.0)

    def casimir(self, g, xi):
        """``|μ̄|² = |IΩ|²``."""
        m = self.body_momentum(g, xi)
        return jnp.dot(m, m)


class HeavyTop(_RigidBody):
    """The heavy top (a rigid body with one point fixed, in uniform gravity along ``−e3``):
    ``ℓ(g, Ω) = ½ ΩᵀIΩ − m γ e3ᵀ g χ``.

    Parameters: ``inertia`` the principal moments about the fixed point (default
    ``(1, 2, 3)``), ``mass`` ``m`` (default 1), ``gravity`` ``γ`` (default 9.81) and ``com``
    ``χ``, the centre of mass in body coordinates (default ``(0, 0, 1)``).  First integrals:
    the energy and the vertical spatial angular momentum ``e3·(g I Ω)``
    (:meth:`vertical_momentum`, from the symmetry under rotations about ``e3``)."""

    inertia: tuple | jnp.ndarray = (1.0, 2.0, 3.0)
    mass: float = 1.0
    gravity: float = 9.81
    com: tuple | jnp.ndarray = (0.0, 0.0, 1.0)

    def potential(self, g):
        chi = jnp.asarray(self.com, g.dtype)
        return self.mass * self.gravity * (g @ chi)[2]

    def vertical_momentum(self, g, xi):
        """``e3·(g I Ω)``."""
        return self.spatial_momentum(g, xi)[2]


class DipoleOnStick(_RigidBody):
    """The "dipole on a stick" of Bogfjellmo & Marthinsen (2016), §6 (their Fig. 1; the data
    of §6.1): a massless rod of length 1 fixed at one end (spherical joint at the origin); at
    its other end, perpendicular and by its centre, a rod of length ``2α`` carrying masses
    ``m/2`` with charges ``±q`` at its ends; gravity along ``−e3``; a fixed point charge ``β``
    at ``z = (0, 0, −3/2)``; unit gravity and Coulomb constants.  In body coordinates the
    charges sit at ``y±⁰ = (0, ±α, −1)``, and

        ℓ(g, Ω) = ½ ΩᵀIΩ − V(g),    I = m diag(1 + α², 1, α²),
        V(g) = κ m e3ᵀ g e3 + qβ (‖g y+⁰ − z‖⁻¹ − ‖g y−⁰ − z‖⁻¹).

    ``kappa`` is the sign of the gravity term.  The paper prints the Hamiltonian with
    ``+m e3ᵀ g e3`` (``κ = +1``).  The centre of mass is at ``g (0, 0, −1)ᵀ = −g e3``, so with
    gravity along ``−e3`` the physical potential is ``−m e3ᵀ g e3``: ``κ = −1``, the default.
    It is also the sign that reproduces the energy errors reported in the paper (§6.2,
    Fig. 3: about ``1e-3`` for the second-order methods and ``1e-7`` for fourth-order VRKMK at
    ``h = 0.01``; with ``κ = +1`` they come out ten and a hundred times smaller).  The
    initial condition of :meth:`initial` has ``e3ᵀ g e3 = 0``, so the initial energy does not
    depend on ``κ``.

    First integrals: the energy, and the third component of the spatial angular momentum
    (:meth:`vertical_momentum`; ``V`` is invariant under rotations about ``e3``)."""

    m: float = 1.0
    q: float = 1.0
    beta: float = 1.0
    alpha: float = 0.1
    kappa: float = -1.0

    @property
    def inertia(self):
        return (self.m * (1.0 + self.alpha**2), self.m, self.m * self.alpha**2)

    def inertia_vector(self, dtype):
        return jnp.stack([jnp.asarray(x, dtype) for x in self.inertia])

    def charges(self, g):
        """Positions ``(g y+⁰, g y−⁰)`` of the two charges."""
        one = jnp.ones((), g.dtype)
        y_plus = jnp.stack([0.0 * one, self.alpha * one, -one])
        y_minus = jnp.stack([0.0 * one, -self.alpha * one, -one])
        return g @ y_plus, g @ y_minus

    def potential(self, g):
        z = jnp.asarray([0.0, 0.0, -1.5], g.dtype)
        x_plus, x_minus = self.charges(g)
        coulomb = self.q * self.beta * (1.0 / jnp.linalg.norm(x_plus - z)
                                        - 1.0 / jnp.linalg.norm(x_minus - z))
        return self.kappa * self.m * g[2, 2] + coulomb

    def vertical_momentum(self, g, xi):
        """``μ3 = e3·(g I Ω)``, the third component of the spatial angular momentum."""
        return self.spatial_momentum(g, xi)[2]

    def initial(self, dtype=None):
        """The paper's initial data (§6.1): ``g(0) = [[1, 0, 0], [0, 0, −1], [0, 1, 0]]`` and
        ``μ(0) = g(0) I g(0)ᵀ e2``, chosen so that the spatial angular velocity is ``e2``: the
        rod along ``+e2``, spinning about itself.  Returns ``(g(0), Ω(0))`` with the **body**
        angular velocity ``Ω(0) = g(0)ᵀ e2 = (0, 0, −1)``."""
        g0 = jnp.asarray([[1.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]], dtype)
        return g0, g0.T @ jnp.asarray([0.0, 1.0, 0.0], dtype)
