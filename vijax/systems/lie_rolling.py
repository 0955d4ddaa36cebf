"""Nonholonomic systems on Lie groups: the unicycle on SE(2) and a ball on a turntable.

The two Lie-group examples of Martín de Diego & Sato Martín de Almagro (2022), §7.4 and §7.5,
written as :class:`vijax.LieGroupSystem` with left-trivialised Lagrangians and constraints in
the body velocity.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from ..lie import SE2, SO3, ProductGroup, Rn
from ._base import NonholonomicSystem
from ._lie import LieGroupSystem

__all__ = ["Unicycle", "BallOnTurntable"]


def _se2(x, y, theta):
    c, s = jnp.cos(theta), jnp.sin(theta)
    one, zero = jnp.ones_like(c), jnp.zeros_like(c)
    return jnp.stack([jnp.stack([c, -s, x]), jnp.stack([s, c, y]), jnp.stack([zero, zero, one])])


class Unicycle(LieGroupSystem, NonholonomicSystem):
    """A vertical disc rolling without slipping, tied to the origin by an elastic spring
    (Martín de Diego & Sato Martín de Almagro (2022), §7.4), on ``SE(2)`` with body velocity
    ``ξ = (v1, v2, ω)``:

        ℓ = ½ [m (v1² + v2²) + I ω²] - ½ (x² + y²),     φ = v2 = 0 (no sideways slip).

    ``ω`` and the energy ``½(m v1² + I ω²) + ½(x² + y²)`` are conserved, and the multiplier is
    ``λ = m ω v1 + s2`` with ``s2 = -x sin θ + y cos θ``.  In the rotating coordinates
    ``s1 = x cos θ + y sin θ``, ``s2`` the motion is linear (``s1' = v1 + ω s2``,
    ``s2' = -ω s1``, ``m v1' = -s1``), which :meth:`exact` integrates in closed form."""

    m: float = 1.0
    inertia: float = 0.5

    quadratic_in_velocity: ClassVar[bool] = True
    constraint_form: ClassVar[str] = "linear"

    @property
    def group(self):
        return SE2()

    def lagrangian(self, g, xi):
        x, y = g[0, 2], g[1, 2]
        kinetic = 0.5 * (self.m * (xi[0] ** 2 + xi[1] ** 2) + self.inertia * xi[2] ** 2)
        return kinetic - 0.5 * (x ** 2 + y ** 2)

    def nonholonomic(self, g, xi):
        return xi[1:2]

    @staticmethod
    def element(x, y, theta):
        """The ``SE(2)`` matrix of the pose ``(x, y, θ)``."""
        return _se2(jnp.asarray(x, float), jnp.asarray(y, float), jnp.asarray(theta, float))

    def initial(self):
        """``(g0, ξ0)``: pose ``(1, 0, 0)``, body velocity ``(0.5, 0, 1)`` (``λ0 = 0.5``)."""
        return self.element(1.0, 0.0, 0.0), jnp.array([0.5, 0.0, 1.0])

    def exact(self, t, g0, xi0):
        """The exact ``(g(t), ξ(t), λ(t))`` from ``(g0, ξ0)`` (``ξ0[1] = 0``): the linear
        system in ``(s1, s2, v1)`` by its matrix exponential."""
        th0 = jnp.arctan2(g0[1, 0], g0[0, 0])
        x0, y0 = g0[0, 2], g0[1, 2]
        w = xi0[2]
        z0 = jnp.stack([x0 * jnp.cos(th0) + y0 * jnp.sin(th0),
                        -x0 * jnp.sin(th0) + y0 * jnp.cos(th0), xi0[0]])
        zero = jnp.zeros_like(w)
        A = jnp.stack([jnp.stack([zero, w, jnp.ones_like(w)]),
                       jnp.stack([-w, zero, zero]),
                       jnp.stack([-jnp.ones_like(w) / self.m, zero, zero])])
        s1, s2, v1 = jax.scipy.linalg.expm(A * t) @ z0
        th = th0 + w * t
        x = s1 * jnp.cos(th) - s2 * jnp.sin(th)
        y = s1 * jnp.sin(th) + s2 * jnp.cos(th)
        return _se2(x, y, th), jnp.stack([v1, zero, w]), self.m * w * v1 + s2


class BallOnTurntable(LieGroupSystem, NonholonomicSystem):
    """A ball rolling without slipping on a turntable turning at the constant rate ``Ω``
    (Martín de Diego & Sato Martín de Almagro (2022), §7.5), on ``SO(3) × R²``: ``g = (R, x)``
    (orientation and centre), body velocity ``ξ = (ω_b, v)``,

        ℓ = ½ |v|² + (r²/2) ω_bᵀ diag(a, b, c) ω_b,
        φ = (v_x + Ω y - r ω_2,  v_y - Ω x + r ω_1),   ω = R ω_b (spatial),

    affine in the velocity.  ``a, b, c`` are the moments of inertia over ``m r²`` (2/5 for a
    solid sphere).  The rolling condition reads the **spatial** angular velocity: with the
    body components, as the paper prints it, the first integrals below are not integrals of
    the flow (the position dynamics agree when ``a = b = c``, but ``I1..I3`` drift at the
    1e-10 level and the moving energy at 5e-7 over ``T = 100``).  For ``a = b = c`` the
    motion is periodic, with first integrals (:meth:`integrals`)

        I1 = ω_3,   I2 = r ω_1 - Ω x/(1 + a),   I3 = r ω_2 - Ω y/(1 + a),
        E_mov = ½|v|² + (a r²/2)|ω|² + r Ω (x ω_1 + y ω_2) - Ω² |x|²,

    and the centre's velocity turns at the rate ``aΩ/(1 + a)``.
    """

    r: float = 1.0
    a: float = 0.4
    b: float = 0.4
    c: float = 0.4
    Omega: float = 1.0

    quadratic_in_velocity: ClassVar[bool] = True
    constraint_form: ClassVar[str] = "affine"

    @property
    def group(self):
        return ProductGroup(SO3(), Rn(2))

    def lagrangian(self, g, xi):
        w, v = xi[:3], xi[3:]
        inertia = jnp.stack([self.a, self.b, self.c]).astype(xi.dtype)
        return 0.5 * jnp.sum(v ** 2) + 0.5 * self.r ** 2 * jnp.sum(inertia * w ** 2)

    def nonholonomic(self, g, xi):
        R, x = g
        w = R @ xi[:3]
        v = xi[3:]
        return jnp.stack([v[0] + self.Omega * x[1] - self.r * w[1],
                          v[1] - self.Omega * x[0] + self.r * w[0]])

    def initial(self, omega=(0.3, -0.2, 0.5), x=(1.0, 0.0)):
        """``(g0, ξ0)``: ``R0 = I``, centre ``x``, spatial angular velocity ``omega`` and the
        centre velocity the rolling condition gives."""
        w = jnp.asarray(omega, float)
        xc = jnp.asarray(x, float)
        v = jnp.stack([self.r * w[1] - self.Omega * xc[1], self.Omega * xc[0] - self.r * w[0]])
        return (jnp.eye(3), xc), jnp.concatenate([w, v])

    def integrals(self, g, xi):
        """``(I1, I2, I3, E_mov)`` (first integrals for ``a = b = c``)."""
        R, x = g
        w = R @ xi[:3]
        v = xi[3:]
        k = self.Omega / (1.0 + self.a)
        e_mov = (0.5 * jnp.sum(v ** 2) + 0.5 * self.a * self.r ** 2 * jnp.sum(w ** 2)
                 + self.r * self.Omega * (x[0] * w[0] + x[1] * w[1])
                 - self.Omega ** 2 * jnp.sum(x ** 2))
        return jnp.stack([w[2], self.r * w[0] - k * x[0], self.r * w[1] - k * x[1], e_mov])

