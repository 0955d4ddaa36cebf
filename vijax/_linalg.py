"""Small dense linear algebra without LAPACK custom calls for tiny systems.

On CPU a LAPACK call inside a ``lax.scan`` costs more than the arithmetic of a 2x2 or 3x3
solve, so the per-step inverses of mass matrices use closed forms up to ``n = 3``.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["inv"]


def inv(m):
    """Inverse of a square matrix; adjugate formula for ``n <= 3``, LU otherwise."""
    n = m.shape[-1]
    if n == 1:
        return 1.0 / m
    if n == 2:
        a, b, c, d = m[0, 0], m[0, 1], m[1, 0], m[1, 1]
        return jnp.array([[d, -b], [-c, a]], dtype=m.dtype) / (a * d - b * c)
    if n == 3:
        cof = jnp.cross(m[jnp.array([1, 2, 0])], m[jnp.array([2, 0, 1])])  # cofactor rows
        det = jnp.vdot(m[0], cof[0])
        return cof.T / det
    return jnp.linalg.inv(m)
