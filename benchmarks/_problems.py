"""Benchmark problems shared by every part of ``benchmarks/run.py``.

Every solver integrates the *same* equations: the vector field given to diffrax and to
scipy is the Euler--Lagrange right-hand side that vijax derives by autodiff from the
system's Lagrangian (:func:`vijax.diagnostics.euler_lagrange_rhs`), written in first-order
form ``y = (q, v)``, ``y' = (v, a(q, v))``.  All arithmetic is float64.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import vijax as vj

__all__ = [
    "RHS_KINDS",
    "Problem",
    "check_rhs_agree",
    "double_pendulum",
    "first_order_rhs",
    "hand_written_rhs",
    "kepler",
    "kepler_ensemble",
    "kepler_exact",
    "vector_field",
    "vijax_options",
]


def vijax_options() -> dict:
    """The XLA options for programs that wrap vijax in the benchmark's own ``jax.jit``:
    ``vj.compiler_options()``, as the docs tell users to pass (vijax's direct calls compile
    with them); the peers keep XLA's defaults, as their users would (on the CPU the options
    leave diffrax's Tsit5 and Dopri8 single trajectories unchanged, 0.99x).
    ``VIJAX_BENCH_XLA_DEFAULTS=1`` compiles vijax with XLA's defaults too (the benchmarks'
    setting before 2026-11-28)."""
    if os.environ.get("VIJAX_BENCH_XLA_DEFAULTS", "") not in ("", "0"):
        return {}
    return vj.compiler_options()


# --------------------------------------------------------------------------------------------
# Exact Kepler solution (pericentre start, a = mu = m = 1, period 2 pi)
# --------------------------------------------------------------------------------------------


def kepler_exact(t, e):
    """Exact state ``(q, v)`` at time(s) ``t`` of the orbit of eccentricity ``e`` started at
    pericentre ``q0 = (1 - e, 0)``, ``v0 = (0, sqrt((1 + e) / (1 - e)))``.

    Solves Kepler's equation ``E - e sin E = M`` (mean anomaly ``M = t mod 2 pi``) by Newton
    in float64 to round-off, then ``x = cos E - e``, ``y = sqrt(1 - e^2) sin E`` and the
    velocities by differentiating with ``dE/dt = 1 / (1 - e cos E)``.  ``t`` and ``e``
    broadcast (used for the ensemble).  Returns arrays of shape ``broadcast + (2,)``.
    """
    t, e = np.broadcast_arrays(np.asarray(t, np.float64), np.asarray(e, np.float64))
    m = np.mod(t, 2.0 * np.pi)
    ecc = m + e * np.sin(m)
    for _ in range(60):
        ecc = ecc - (ecc - e * np.sin(ecc) - m) / (1.0 - e * np.cos(ecc))
    beta = np.sqrt(1.0 - e * e)
    edot = 1.0 / (1.0 - e * np.cos(ecc))
    q = np.stack([np.cos(ecc) - e, beta * np.sin(ecc)], axis=-1)
    v = np.stack([-np.sin(ecc) * edot, beta * np.cos(ecc) * edot], axis=-1)
    return q, v


def kepler_ensemble(n: int, e_min: float = 0.3, e_max: float = 0.6):
    """``n`` Kepler orbits (eccentricities evenly spaced in ``[e_min, e_max]``, all with
    ``a = 1``, hence period ``2 pi``) as stacked ``(e, q0, v0)`` float64 arrays."""
    e = np.linspace(e_min, e_max, n)
    q0 = np.stack([1.0 - e, np.zeros_like(e)], axis=-1)
    v0 = np.stack([np.zeros_like(e), np.sqrt((1.0 + e) / (1.0 - e))], axis=-1)
    return e, q0, v0


# --------------------------------------------------------------------------------------------
# Vector fields
# --------------------------------------------------------------------------------------------


def _solve_closed_form(m, b):
    """``m^{-1} b`` by the adjugate formula for 2x2 (no LAPACK custom call); LU otherwise."""
    if m.shape[-1] == 2:
        det = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
        return jnp.stack([m[1, 1] * b[0] - m[0, 1] * b[1],
                          m[0, 0] * b[1] - m[1, 0] * b[0]]) / det
    return jnp.linalg.solve(m, b)


RHS_KINDS = ("autodiff", "autodiff-nolapack", "hand-written")


def first_order_rhs(system, kind: str = "autodiff") -> Callable:
    """``f(y) -> y'`` for ``y = (q, v)`` from the autodiff Euler--Lagrange equations.

    ``"autodiff"``: exactly :func:`vijax.diagnostics.euler_lagrange_rhs` (its linear solve
    ``jnp.linalg.solve`` is a LAPACK custom call on CPU).  ``"autodiff-nolapack"``: the same
    autodiff expressions, ``d2L/dv2 a = D1L - (d2L/dv dq) v``, with the 2x2 solve done by the
    adjugate formula (vijax's own step avoids LAPACK for small mass matrices the same way).
    ``"hand-written"``: the closed-form acceleration a user of an ODE solver would write
    (:func:`hand_written_rhs`; Kepler and the double pendulum).
    """
    if kind == "hand-written":
        return hand_written_rhs(system)
    if kind == "autodiff":
        rhs = vj.diagnostics.euler_lagrange_rhs(system)
    elif kind == "autodiff-nolapack":
        def rhs(q, v):
            hess = system.velocity_hessian(q, v)
            mixed = jax.jacfwd(system.momentum, argnums=0)(q, v)
            return v, _solve_closed_form(hess, system.d1_lagrangian(q, v) - mixed @ v)
    else:
        raise ValueError(f"unknown rhs kind {kind!r}; choose from {RHS_KINDS}")

    def f(y):
        n = y.shape[-1] // 2
        v, a = rhs(y[:n], y[n:])
        return jnp.concatenate([v, a])

    return f


def hand_written_rhs(system) -> Callable:
    """``f(y) -> y'`` with the acceleration written out by hand, as a user who picks an ODE
    solver instead of vijax would: ``a = -mu q / |q|^3`` for Kepler (either declaration), the
    textbook double-pendulum equations in absolute angles (mass matrix inverted in closed
    form) for :class:`vijax.systems.DoublePendulum`."""
    if isinstance(system, (vj.systems.Kepler, vj.systems.GeneralKepler)):
        mu = system.mu

        def f(y):
            q = y[:2]
            r2 = q[0] * q[0] + q[1] * q[1]
            return jnp.concatenate([y[2:], -mu * q / (r2 * jnp.sqrt(r2))])

        return f
    if isinstance(system, vj.systems.DoublePendulum):
        m1, m2, l1, l2, g = system.m1, system.m2, system.l1, system.l2, system.g

        def f(y):
            t1, t2, w1, w2 = y[0], y[1], y[2], y[3]
            d = t1 - t2
            c, s = jnp.cos(d), jnp.sin(d)
            # M(q) a = rhs, M = [[(m1+m2) l1^2, m2 l1 l2 c], [m2 l1 l2 c, m2 l2^2]]
            r1 = -m2 * l1 * l2 * s * w2 * w2 - (m1 + m2) * g * l1 * jnp.sin(t1)
            r2 = m2 * l1 * l2 * s * w1 * w1 - m2 * g * l2 * jnp.sin(t2)
            a11, a12, a22 = (m1 + m2) * l1 * l1, m2 * l1 * l2 * c, m2 * l2 * l2
            det = a11 * a22 - a12 * a12
            return jnp.stack([w1, w2, (a22 * r1 - a12 * r2) / det, (a11 * r2 - a12 * r1) / det])

        return f
    raise ValueError(f"no hand-written field for {type(system).__name__}; use kind='autodiff'")


def vector_field(system, kind: str = "autodiff") -> Callable:
    """diffrax-style ``vf(t, y, args)`` from the autodiff Euler--Lagrange equations (a fresh
    closure on every call)."""
    f = first_order_rhs(system, kind)
    return lambda t, y, args: f(y)


def check_rhs_agree(system, y, kinds=RHS_KINDS) -> float:
    """Max relative difference between the rhs variants at ``y`` (round-off only)."""
    vals = [np.asarray(jax.jit(first_order_rhs(system, k))(y)) for k in kinds]
    scale = np.max(np.abs(vals[0]))
    return float(max(np.max(np.abs(v - vals[0])) for v in vals) / scale)


# --------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Problem:
    name: str
    label: str
    system: object                  # the vijax system (MechanicalSystem)
    q0: jax.Array
    v0: jax.Array
    t_wp: float                     # final time of the work-precision study (part a)
    exact: Callable | None       # t -> (q, v), exact solution if known
    note: str = ""

    @property
    def y0(self):
        return jnp.concatenate([self.q0, self.v0])

    @property
    def ndim(self) -> int:
        return int(self.q0.shape[0])

    def energy(self, q, v):
        """Energy at stacked states (leading axis = time)."""
        return np.asarray(jax.jit(jax.vmap(self.system.energy))(jnp.asarray(q), jnp.asarray(v)))

    def vector_field(self, kind: str = "autodiff"):
        """diffrax-style ``vf(t, y, args)`` from the autodiff Euler--Lagrange equations."""
        return vector_field(self.system, kind)

    def reference(self, t_final: float, cache: dict):
        """``(q, v)`` at ``t_final`` and an error estimate of that reference."""
        key = (self.name, float(t_final))
        if key in cache:
            return cache[key]
        if self.exact is not None:
            q, v = self.exact(t_final)
            out = (q, v, 0.0, "exact (Kepler's equation solved by Newton in float64)")
        else:
            q, v, _ = vj.diagnostics.reference_solution(self.system, self.q0, self.v0, t_final,
                                                        rtol=1e-13, atol=1e-15)
            # Independent cross-check: vijax Gauss-3 (order 6) at a small step.
            n = int(round(t_final / 5e-4))
            integ = vj.VPRK.gauss(3)
            sol = vj.simulate(self.system, integ, q0=self.q0, v0=self.v0, dt=t_final / n,
                              n_steps=n, save_every=n)
            dq = np.max(np.abs(np.asarray(sol.q[-1]) - q))
            dv = np.max(np.abs(np.asarray(sol.v[-1]) - v))
            out = (np.asarray(q), np.asarray(v), float(max(dq, dv)),
                   "scipy DOP853 rtol=1e-13, atol=1e-15 on the autodiff Euler-Lagrange rhs; "
                   f"uncertainty = |DOP853 - vijax Gauss-3 (h={t_final / n:.3g})|")
        cache[key] = out
        return out


def kepler(e: float = 0.5) -> Problem:
    system = vj.systems.Kepler()
    q0, v0 = system.initial_conditions(e=e, dtype=jnp.float64)
    return Problem(
        name="kepler", label=f"Kepler (e = {e})", system=system, q0=q0, v0=v0, t_wp=100.0,
        exact=lambda t: kepler_exact(t, e),
        note="vijax.systems.Kepler (MechanicalSystem), pericentre start, period 2*pi; exact "
             "reference from Kepler's equation.",
    )


def double_pendulum(theta=(1.0, 1.5), t_wp: float = 20.0) -> Problem:
    system = vj.systems.DoublePendulum()
    q0 = jnp.asarray(theta, jnp.float64)
    v0 = jnp.zeros(2, jnp.float64)
    return Problem(
        name="double_pendulum", label=f"double pendulum (theta = {tuple(theta)}, at rest)",
        system=system, q0=q0, v0=v0, t_wp=t_wp, exact=None,
        note="vijax.systems.DoublePendulum (m = l = 1, g = 9.81, absolute angles), released "
             "at rest from theta = (1.0, 1.5) rad: a chaotic orbit (a 1e-10 perturbation grows "
             "to ~1e-9 at t = 20, ~5e-7 at t = 50, ~5e-5 at t = 100, O(1) at t = 200). The "
             "work-precision study therefore stops at T = 20, where a DOP853 rtol=1e-13 "
             "reference is accurate to ~1e-11 (its measured uncertainty is stored). The "
             "suggested theta = (0.5, 1.0) is not chaotic (perturbations grow only "
             "linearly), so the more energetic (1.0, 1.5) is used.",
    )
