"""Ready-made systems: the classics used by tests, benchmarks and examples."""

from __future__ import annotations

from typing import ClassVar

import jax.numpy as jnp

from ._base import LagrangianSystem, MechanicalSystem, PointMassSystem, TimeDependentSystem

__all__ = ["HarmonicOscillator", "Pendulum", "ShakenPendulum", "DoublePendulum", "Kepler",
           "HenonHeiles"]


class HarmonicOscillator(PointMassSystem):
    """``L = 1/2 m v^2 - 1/2 k q^2`` in any dimension (isotropic)."""

    k: float = 1.0

    def potential(self, q):
        return 0.5 * self.k * jnp.vdot(q, q)


class Pendulum(MechanicalSystem):
    """Planar pendulum in its angle: ``L = 1/2 m l^2 v^2 + m g l cos q`` (``q = 0`` hangs down)."""

    m: float = 1.0
    l: float = 1.0  # noqa: E741
    g: float = 9.81
    ndim: ClassVar[int] = 1
    constant_mass: ClassVar[bool] = True

    def mass_matrix(self, q):
        return jnp.full((1, 1), self.m * self.l**2, dtype=q.dtype)

    def potential(self, q):
        return -self.m * self.g * self.l * jnp.cos(q[0])


class ShakenPendulum(TimeDependentSystem):
    """Pendulum whose pivot is driven vertically, ``y_p(t) = a cos(ω t)`` (Kapitza's
    pendulum): an explicitly time-dependent Lagrangian
    ``L = 1/2 m (l² v² + ẏ_p² + 2 l ẏ_p v sin q) - m g (y_p - l cos q)``, quadratic in ``v``
    with a time-dependent linear term.  For ``a ω² ≫ g`` (and ``a ≪ l``) the inverted
    position ``q = π`` is stable when ``a² ω² > 2 g l``."""

    m: float = 1.0
    l: float = 1.0  # noqa: E741
    g: float = 9.81
    a: float = 0.1
    omega: float = 20.0
    ndim: ClassVar[int] = 1
    quadratic_in_velocity: ClassVar[bool] = True

    def pivot(self):
        """``(y_p, ẏ_p)`` at ``self.time``."""
        wt = self.omega * self.time
        return self.a * jnp.cos(wt), -self.a * self.omega * jnp.sin(wt)

    def lagrangian(self, q, v):
        yp, dyp = self.pivot()
        th, w = q[0], v[0]
        kinetic = 0.5 * self.m * (self.l**2 * w**2 + dyp**2 + 2 * self.l * dyp * w * jnp.sin(th))
        return kinetic - self.m * self.g * (yp - self.l * jnp.cos(th))


class DoublePendulum(MechanicalSystem):
    """Planar double pendulum in absolute angles from the downward vertical."""

    m1: float = 1.0
    m2: float = 1.0
    l1: float = 1.0
    l2: float = 1.0
    g: float = 9.81
    ndim: ClassVar[int] = 2

    def mass_matrix(self, q):
        c = self.m2 * self.l1 * self.l2 * jnp.cos(q[0] - q[1])
        return jnp.array([[(self.m1 + self.m2) * self.l1**2, c], [c, self.m2 * self.l2**2]],
                         dtype=q.dtype)

    def potential(self, q):
        return (-(self.m1 + self.m2) * self.g * self.l1 * jnp.cos(q[0])
                - self.m2 * self.g * self.l2 * jnp.cos(q[1]))


class Kepler(PointMassSystem):
    """Planar Kepler problem ``L = 1/2 m |v|^2 + mu m / |q|``.

    :meth:`initial_conditions` gives the orbit of eccentricity ``e`` starting at pericentre
    (period ``2 pi`` for ``mu = 1`` and semi-major axis 1).
    """

    mu: float = 1.0
    ndim: ClassVar[int] = 2

    def potential(self, q):
        # a sum of products, not jnp.vdot: under the stage vmap and the tangents of a
        # gradient the dot is a batched product XLA:CPU runs as a kernel of its own (two per
        # step in the backward loop of jax.grad through simulate, 32 -> 28 kernels, gradient
        # 0.94x)
        return -self.mu * self.m / jnp.sqrt(jnp.sum(q * q))

    def angular_momentum(self, q, v):
        return self.m * (q[0] * v[1] - q[1] * v[0])

    @staticmethod
    def initial_conditions(e: float = 0.5, dtype=None):
        q0 = jnp.array([1.0 - e, 0.0], dtype=dtype)
        v0 = jnp.array([0.0, ((1.0 + e) / (1.0 - e)) ** 0.5], dtype=dtype)
        return q0, v0


class HenonHeiles(PointMassSystem):
    """Hénon--Heiles: ``V = 1/2 (x^2 + y^2) + lam (x^2 y - y^3 / 3)``."""

    lam: float = 1.0
    ndim: ClassVar[int] = 2

    def potential(self, q):
        x, y = q[0], q[1]
        return 0.5 * (x**2 + y**2) + self.lam * (x**2 * y - y**3 / 3.0)


class GeneralKepler(LagrangianSystem):
    """The Kepler problem declared as a *general* Lagrangian (no structure declared).

    Same physics as :class:`Kepler`; exercises the fully generic autodiff path (velocity
    Hessian by ``jax.jacfwd``, inverse Legendre map by Newton) in tests and benchmarks.
    """

    m: float = 1.0
    mu: float = 1.0
    ndim: ClassVar[int] = 2

    def lagrangian(self, q, v):
        return 0.5 * self.m * jnp.sum(v * v) + self.mu * self.m / jnp.sqrt(jnp.sum(q * q))


__all__ += ["GeneralKepler"]
