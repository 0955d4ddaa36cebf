"""Holonomically constrained systems, each with its invariants.

The planar and the 3-D double pendulum are the test problems of Wenger, Ober-Blöbaum &
Leyendecker (2017), §4; the others are classics.

Sign convention of :mod:`vijax.constraints`: the augmented Lagrangian is ``L - g(q).lam``.
"""

from typing import ClassVar, Optional

import jax.numpy as jnp
import numpy as np
from equinox import AbstractClassVar

from .._linalg import mm
from ._base import HolonomicSystem, MechanicalSystem, PointMassSystem, TimeDependentSystem

__all__ = ["AbstractCartesianPendulum", "CartesianPendulum", "PolarPendulum", "SphericalPendulum",
           "DoublePendulum3D", "RotatingHoop"]


class AbstractCartesianPendulum(PointMassSystem, HolonomicSystem):
    """What the Cartesian and spherical pendulums share: a point mass on ``|q| = l`` in
    ``R^d``, ``g = (|q|^2 - l^2) / 2``, gravity along the last axis.  The final classes
    declare the dimension (``ndim``)."""

    ndim: AbstractClassVar[Optional[int]]
    l: float = 1.0  # noqa: E741
    gravity: float = 9.81

    def potential(self, q):
        return self.m * self.gravity * q[-1]

    def holonomic(self, q):
        return jnp.atleast_1d(0.5 * (mm(q, q) - self.l**2))


class CartesianPendulum(AbstractCartesianPendulum):
    """Pendulum in Cartesian coordinates ``q in R^d`` (any ``d``): ``g = (|q|^2 - l^2) / 2``,
    gravity along the last axis (for ``d = 2`` the planar pendulum of Wenger, Ober-Blöbaum &
    Leyendecker (2017), §4)."""

    ndim: ClassVar[Optional[int]] = None


class PolarPendulum(MechanicalSystem, HolonomicSystem):
    """Planar pendulum in polar coordinates ``q = (r, theta)`` with the constraint
    ``r - l = 0`` (``theta = 0`` hangs down): a configuration-dependent mass matrix."""

    m: float = 1.0
    l: float = 1.0  # noqa: E741
    gravity: float = 9.81
    ndim: ClassVar[int] = 2

    def mass_matrix(self, q):
        return jnp.diag(jnp.array([self.m, self.m * q[0] ** 2], dtype=q.dtype))

    def potential(self, q):
        return -self.m * self.gravity * q[0] * jnp.cos(q[1])

    def holonomic(self, q):
        return jnp.atleast_1d(q[0] - self.l)


class SphericalPendulum(AbstractCartesianPendulum):
    """Spherical pendulum: the Cartesian pendulum in ``R^3``, gravity along ``-z``.
    Invariants: energy and the angular momentum about the vertical."""

    ndim: ClassVar[int] = 3

    def angular_momentum_z(self, q, p):
        return q[0] * p[1] - q[1] * p[0]


class DoublePendulum3D(MechanicalSystem, HolonomicSystem):
    """Three-dimensional double pendulum, ``q = (x1, x2) in R^6``.

    Lagrangian (69) of Wenger, Ober-Blöbaum & Leyendecker (2017), §4.  Invariants: energy
    and the angular momentum about the vertical, their eq. (71).
    """

    m1: float = 1.0
    m2: float = 1.0
    l1: float = 1.0
    l2: float = 1.0
    gravity: float = 9.81
    ndim: ClassVar[int] = 6
    constant_mass: ClassVar[bool] = True

    def mass_matrix(self, q):
        d = jnp.array([self.m1] * 3 + [self.m2] * 3, dtype=q.dtype)
        return jnp.diag(d)

    def inverse_mass_matrix(self, q):
        d = jnp.array([1 / self.m1] * 3 + [1 / self.m2] * 3, dtype=q.dtype)
        return jnp.diag(d)

    def potential(self, q):
        return self.gravity * (self.m1 * q[2] + self.m2 * q[5])

    def holonomic(self, q):
        x1, x2 = q[:3], q[3:]
        return jnp.stack([0.5 * (x1 @ x1 - self.l1**2),
                          0.5 * ((x2 - x1) @ (x2 - x1) - self.l2**2)])

    def angular_momentum_z(self, q, p):
        """Wenger, Ober-Blöbaum & Leyendecker (2017), eq. (71)."""
        return -p[0] * q[1] + p[1] * q[0] - p[3] * q[4] + p[4] * q[3]

    @staticmethod
    def initial_conditions(dtype=None):
        """x1 = (sin 0.8, 0, -cos 0.8), x2 = x1 + (0, sin 0.6, -cos 0.6), velocity
        (0, 1, 0, 0.5, 0.3, 0.2) (project it with ``project_velocity``); our choice, since the
        paper gives no initial data."""
        import numpy as np

        x1 = np.array([np.sin(0.8), 0.0, -np.cos(0.8)])
        x2 = x1 + np.array([0.0, np.sin(0.6), -np.cos(0.6)])
        q0 = jnp.asarray(np.concatenate([x1, x2]), dtype=dtype)
        v0 = jnp.asarray([0.0, 1.0, 0.0, 0.5, 0.3, 0.2], dtype=dtype)
        return q0, v0


class RotatingHoop(PointMassSystem, TimeDependentSystem, HolonomicSystem):
    """A bead on a circular hoop of radius ``R`` spun about its vertical diameter at the
    prescribed rate ``omega`` (a rheonomic constraint), in Cartesian coordinates ``q in R^3``,
    gravity along ``-z``:

        g(t, q) = ((|q|² - R²) / 2,  -sin(ωt) q_x + cos(ωt) q_y)

    (the sphere, and the plane of the hoop turning with it).  The energy is not conserved (the
    drive does work); the Jacobi integral ``J = E - ω L_z``, the energy in the rotating frame,
    is (:meth:`jacobi_integral`).  With ``θ`` the angle from the downward vertical,
    ``R θ'' = sin θ (ω² R cos θ - g)``: the bottom is a stable relative equilibrium for
    ``ω² R < g``, and above that rate the bead settles off it at ``cos θ* = g / (ω² R)``
    (:meth:`equilibrium_angle`), a supercritical pitchfork."""

    R: float = 1.0
    omega: float = 5.0
    gravity: float = 9.81
    ndim: ClassVar[int] = 3

    def potential(self, q):
        return self.m * self.gravity * q[2]

    def holonomic(self, q):
        c, s = jnp.cos(self.omega * self.time), jnp.sin(self.omega * self.time)
        return jnp.stack([0.5 * (mm(q, q) - self.R ** 2), -s * q[0] + c * q[1]])

    def jacobi_integral(self, q, v):
        """``J = m |v|² / 2 + V(q) - ω m (x v_y - y v_x)``, conserved."""
        energy = 0.5 * self.m * mm(v, v) + self.potential(q)
        return energy - self.omega * self.m * (q[0] * v[1] - q[1] * v[0])

    def equilibrium_angle(self) -> float:
        """``θ*`` of the stable relative equilibrium: ``arccos(g / (ω² R))`` above the
        critical rate ``ω² R = g``, 0 below it."""
        ratio = float(self.gravity) / (float(self.omega) ** 2 * float(self.R))
        return float(np.arccos(ratio)) if ratio < 1.0 else 0.0

    def state(self, t, theta, theta_dot):
        """``(q, v)`` on the hoop at time ``t``, angle ``theta`` from the downward vertical and
        rate ``theta_dot`` relative to the hoop (consistent: ``g = 0``, ``G v + ∂g/∂t = 0``)."""
        c, s = jnp.cos(self.omega * t), jnp.sin(self.omega * t)
        e_h, e_z, e_n = jnp.stack([c, s, 0.0]), jnp.array([0.0, 0.0, 1.0]), jnp.stack([-s, c, 0.0])
        q = self.R * (jnp.sin(theta) * e_h - jnp.cos(theta) * e_z)
        v = (self.R * theta_dot * (jnp.cos(theta) * e_h + jnp.sin(theta) * e_z)
             + self.R * self.omega * jnp.sin(theta) * e_n)
        return q, v
