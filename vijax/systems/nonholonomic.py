"""Nonholonomic test systems of Martín de Diego & Sato Martín de Almagro (2022), §7.

* :class:`NonholonomicParticle` -- the nonholonomic particle in a harmonic potential (§7.1);
* :class:`ChaoticNonholonomic` -- the fully chaotic nonholonomic system of McLachlan &
  Perlmutter (2006), as used in §7.3 (after Jay's SPARK experiments), ``n = 2m + 1``.

Both have constraints linear in the velocities (``constraint_form = "linear"``), so the
energy is a first integral of the continuous flow.
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._base import MechanicalSystem, NonholonomicSystem, PointMassSystem

__all__ = ["NonholonomicParticle", "ChaoticNonholonomic"]


class NonholonomicParticle(PointMassSystem, NonholonomicSystem):
    """A particle in ``R^3`` in the harmonic potential ``k (x² + y²) / 2`` with the
    constraint ``Φ = v_z - y v_x`` (Martín de Diego & Sato Martín de Almagro (2022), §7.1;
    ``m = k = 1`` there):

        m ẍ = -k x - λ y,    m ÿ = -k y,    m z̈ = λ,    λ = (m v_x v_y - k x y) / (1 + y²).

    First integrals: the energy ``|v|² m/2 + k (x² + y²)/2`` (:meth:`energy`) and the energy
    of the decoupled ``y`` oscillator (:meth:`y_energy`)."""

    k: float = 1.0
    ndim: ClassVar[int] = 3
    constraint_form: ClassVar[str] = "linear"

    def potential(self, q):
        return 0.5 * self.k * (q[0] ** 2 + q[1] ** 2)

    def nonholonomic(self, q, v):
        return jnp.atleast_1d(v[2] - q[1] * v[0])

    def y_energy(self, q, v):
        """``m v_y²/2 + k y²/2``: the ``y`` motion does not feel the constraint."""
        return 0.5 * self.m * v[1] ** 2 + 0.5 * self.k * q[1] ** 2

    @staticmethod
    def initial_conditions():
        """``q0 = (0, 1, 0)``, ``v0 = (1, 1/2, 1)``: on the constraint (``v_z = y v_x``), with
        ``λ0 = 1/4`` and energy ``13/8`` for ``m = k = 1``.  (The paper does not print its
        initial data; this is our choice.)"""
        return jnp.array([0.0, 1.0, 0.0]), jnp.array([1.0, 0.5, 1.0])


class ChaoticNonholonomic(MechanicalSystem, NonholonomicSystem):
    """The fully chaotic nonholonomic system of McLachlan & Perlmutter (2006) used in
    Martín de Diego & Sato Martín de Almagro (2022), §7.3: ``q in R^n``, ``n = 2m + 1``
    (``m = pairs >= 2``; the paper takes ``m = 3``, ``n = 7``), unit masses,

        L = |v|²/2 - (|q|² + q_{m+2}² q_{m+3}² + sum_{i=1..m} q_{1+i}² q_{m+1+i}²) / 2,
        Φ = v_1 + sum_{i=m+2..n} q_i v_i        (1-based indices, one constraint).

    First integral: the energy (:meth:`energy`; the constraint is linear in ``v``)."""

    pairs: int = eqx.field(static=True, default=3)
    constant_mass: ClassVar[bool] = True
    constraint_form: ClassVar[str] = "linear"

    def __check_init__(self):
        if not (isinstance(self.pairs, int) and self.pairs >= 2):
            raise ValueError(f"ChaoticNonholonomic needs pairs = m >= 2 (n = 2m + 1), got "
                             f"{self.pairs!r}.")

    @property
    def dim(self) -> int:
        """``n = 2m + 1``."""
        return 2 * self.pairs + 1

    def mass_matrix(self, q):
        return jnp.eye(q.shape[-1], dtype=q.dtype)

    def inverse_mass_matrix(self, q):
        return jnp.eye(q.shape[-1], dtype=q.dtype)

    def potential(self, q):
        m = self.pairs
        coupling = (q[m + 1] ** 2 * q[m + 2] ** 2
                    + jnp.sum(q[1:m + 1] ** 2 * q[m + 1:2 * m + 1] ** 2))
        return 0.5 * (jnp.sum(q ** 2) + coupling)

    def nonholonomic(self, q, v):
        m = self.pairs
        return jnp.atleast_1d(v[0] + jnp.vdot(q[m + 1:2 * m + 1], v[m + 1:2 * m + 1]))

    @staticmethod
    def initial_conditions(J: int = 8):
        """The paper's ensemble (``m = 3``), ``j = 0..J``: ``q0 = (α, 0.6, 0.4, 0.2, 1, 1, 1)``,
        ``v0 = (0, β, 0, 0, 0, 0, 0)``, ``α = cos(jπ/2J)``, ``β = sin(jπ/2J)``; every member
        has energy ``3.06`` and satisfies the constraint.  Returns ``(q0, v0)`` of shape
        ``(J + 1, 7)``."""
        ang = np.arange(J + 1) * np.pi / (2 * J)
        q0 = np.tile(np.array([0.0, 0.6, 0.4, 0.2, 1.0, 1.0, 1.0]), (J + 1, 1))
        q0[:, 0] = np.cos(ang)
        v0 = np.zeros((J + 1, 7))
        v0[:, 1] = np.sin(ang)
        return jnp.asarray(q0), jnp.asarray(v0)

    def sample_energy_sheet(self, key, batch: int, energy: float = 3.06, dtype=None):
        """``batch`` random initial conditions ``(q0, v0)`` (shape ``(batch, n)`` each) on the
        energy sheet ``E = energy`` that satisfy the constraint.

        The configurations are the paper's slice ``q = (α, 0.2 m, ..., 0.4, 0.2, 1, ..., 1)``
        (for ``m = 3``: ``(α, 0.6, 0.4, 0.2, 1, 1, 1)``) with ``α`` uniform in the range
        where the potential stays below ``energy``; the velocity direction is Gaussian,
        projected onto the constraint's kernel, and scaled to the kinetic energy
        ``energy - V(q)``."""
        n, m = self.dim, self.pairs
        dtype = jnp.result_type(float) if dtype is None else dtype
        base_np = np.concatenate([[0.0], 0.2 * np.arange(m, 0, -1), np.ones(m)])
        with jax.ensure_compile_time_eval():   # a constant, also under jax.jit
            u0 = float(self.potential(base_np))
        base = jnp.asarray(base_np, dtype)
        if not u0 < energy:
            raise ValueError(f"energy = {energy} is below the potential {u0:.4f} of the "
                             f"configuration slice; pass a larger energy.")
        k_alpha, k_dir = jax.random.split(key)
        amax = jnp.sqrt(2.0 * (energy - u0))   # V(α) = V(0) + α²/2 on the slice
        alpha = jax.random.uniform(k_alpha, (batch,), dtype, -amax, amax)
        q0 = jnp.broadcast_to(base, (batch, n)).at[:, 0].set(alpha)
        d = jax.random.normal(k_dir, (batch, n), dtype)

        def velocity(q, d):
            a = self.constraint_matrix(q, d)[0]
            d = d - a * (jnp.vdot(a, d) / jnp.vdot(a, a))
            kinetic = energy - self.potential(q)
            return d * jnp.sqrt(2.0 * jnp.maximum(kinetic, 0.0) / jnp.vdot(d, d))

        return q0, jax.vmap(velocity)(q0, d)
