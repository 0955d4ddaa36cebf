"""Vehicles on SE(3): a quadrotor driven by thrust and body torques.

Configurations are ``4 × 4`` homogeneous matrices ``g = (R, x)`` (body to space), velocities the
body twist ``ξ = (v, ω)`` with ``v = Rᵀẋ`` and ``ω = vee(Rᵀ Ṙ)``: translation first, as in
:class:`vijax.lie.SE3`.  The Lagrangian is left-trivialised.
"""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp

from ..lie import SE3
from ._base import ForcedSystem
from ._lie import LieGroupSystem

__all__ = ["Quadrotor"]


class Quadrotor(ForcedSystem, LieGroupSystem):
    """A rigid quadrotor in uniform gravity along ``-e3`` (the standard SE(3) model, e.g.
    Lee, Leok & McClamroch (2010)):

        ℓ(g, ξ) = ½ m |v|² + ½ ωᵀ J ω - m γ x_3,

    with the centre of mass at the body origin, ``J = diag(inertia)``, and four controls
    ``u = (f, τ1, τ2, τ3)``: the collective thrust ``f`` along the body ``e3`` and the body
    torques, entering as the body wrench ``F = (0, 0, f, τ1, τ2, τ3)`` (left-trivialised,
    paired with ``ξ``).  ``f = m γ`` with zero torques hovers.  Energy balance:
    ``dE/dt = <F, ξ> = f v_3 + τ·ω``."""

    mass: float = 1.0
    inertia: tuple | jnp.ndarray = (0.02, 0.02, 0.04)
    gravity: float = 9.81

    quadratic_in_velocity: ClassVar[bool] = True
    control_dim: ClassVar[int] = 4

    @property
    def group(self):
        return SE3()

    def lagrangian(self, g, xi):
        v, w = xi[:3], xi[3:]
        J = jnp.asarray(self.inertia, xi.dtype)
        return (0.5 * self.mass * jnp.dot(v, v) + 0.5 * jnp.sum(J * w ** 2)
                - self.mass * self.gravity * g[2, 3])

    def force(self, t, g, xi, u):
        zero = jnp.zeros((2,), xi.dtype)
        return jnp.concatenate([zero, u[:1], u[1:]]).astype(xi.dtype)

    def hover(self):
        """The hovering control ``(m γ, 0, 0, 0)``."""
        return jnp.array([self.mass * self.gravity, 0.0, 0.0, 0.0])
