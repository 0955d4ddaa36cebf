"""The continuous equations of a :class:`vijax.LieGroupSystem`: the (constrained, forced)
Euler--Poincaré equations, for consistent initial multipliers and reference solutions.

With body velocity ``ξ = g^{-1} ġ`` and body momentum ``μ = D2ℓ(g, ξ)`` (Holm, Marsden &
Ratiu (1998); Martín de Diego & Sato Martín de Almagro (2022), §6.1):

    ġ = g ξ,     d/dt D2ℓ = ad*_ξ D2ℓ + L*_g D1ℓ + F + D2φᵀ λ,     φ(g, ξ) = 0,

where ``F`` is the body force of a :class:`vijax.ForcedSystem` and ``λ`` the multiplier of
nonholonomic constraints with Lagrange--d'Alembert (Chetaev) forces.  Differentiating the
constraint along the flow gives ``λ`` in closed form (index 2 -> index 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ... import _linalg
from ...systems import ForcedSystem, NonholonomicSystem

__all__ = ["free_acceleration", "euler_poincare", "nonholonomic_multiplier"]


def free_acceleration(system, t, g, xi, u=None):
    """``(M, r)`` with ``M ξ' = r`` the unconstrained Euler--Poincaré equation at ``(t, g, ξ)``
    (``M = ∂²ℓ/∂ξ²``)."""
    sys_t = system.at(t)
    G = sys_t.group
    D1, mu = sys_t.derivatives(g, xi)
    # d/dt D2ℓ along the flow = M ξ' + ∂_g D2ℓ [g ξ] + ∂_t D2ℓ
    zero = jnp.zeros_like(xi)
    dmu_g = jax.jvp(lambda z: sys_t.momentum(G.compose(g, G.exp(z)), xi), (zero,), (xi,))[1]
    r = G.ad_star(xi, mu) + D1 - dmu_g - sys_t.momentum_rate(g, xi)
    if isinstance(system, ForcedSystem):
        if u is None and system.control_dim:
            u = jnp.zeros((system.control_dim,), xi.dtype)   # zero controls by default
        r = r + sys_t.force(t, g, xi, u)
    return sys_t.velocity_hessian(g, xi), r


def nonholonomic_multiplier(system, t, g, xi, u=None):
    """The multiplier ``λ(g, ξ)`` of the constrained Euler--Poincaré equations (zero rows for
    an unconstrained system), from ``d/dt φ(g, ξ) = 0``."""
    if not isinstance(system, NonholonomicSystem):
        return jnp.zeros((0,), dtype=xi.dtype)
    return _accel_and_multiplier(system, t, g, xi, u)[1]


def euler_poincare(system, t, g, xi, u=None):
    """``ξ'`` of the (constrained, forced) Euler--Poincaré equations at ``(t, g, ξ)``."""
    if not isinstance(system, NonholonomicSystem):
        M, r = free_acceleration(system, t, g, xi, u)
        return _linalg.solve(M, r)
    return _accel_and_multiplier(system, t, g, xi, u)[0]


def _accel_and_multiplier(system, t, g, xi, u):
    sys_t = system.at(t)
    G = sys_t.group
    M, r = free_acceleration(system, t, g, xi, u)
    A = sys_t.constraint_matrix(g, xi)                               # ∂φ/∂ξ, (m, d)
    zero = jnp.zeros_like(xi)
    # d/dt φ = ∂_g φ [g ξ] + ∂_t φ + A ξ'
    drift = jax.jvp(lambda z: sys_t.nonholonomic(G.compose(g, G.exp(z)), xi), (zero,), (xi,))[1]
    drift = drift + jax.jvp(lambda s: system.at(s).nonholonomic(g, xi), (t,),
                            (jnp.ones_like(t),))[1]
    Minv_r = _linalg.solve(M, r)
    Minv_At = _linalg.solve(M, A.T)
    lam = _linalg.solve(A @ Minv_At, -(A @ Minv_r + drift))
    return Minv_r + Minv_At @ lam, lam
