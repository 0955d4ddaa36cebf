"""Residual evaluations per step, counted at run time.

The test systems call ``jax.debug.callback`` in their potential, so every evaluation of the
Lagrangian (one per residual evaluation of the stage equations, whatever the stage count: the
stages are evaluated in one vectorised call) is counted while the compiled run executes.
Printed per step: Lagrangian evaluations and solver iterations.  A residual evaluation costs
one Lagrangian evaluation for VPRK and GalerkinVI, two for HolonomicVPRK (the stages and the
node momentum); the post-processing of GalerkinVI (the multiplier) costs two.

    python benchmarks/residual_evaluations.py

It runs unchanged on the version before the solver's ``has_aux`` (where a holonomic system was
any system defining ``holonomic``), for the before/after comparison.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402

CALLS = []


def _count():
    CALLS.append(1)


class CountingKepler(vj.systems.PointMassSystem):
    def potential(self, q):
        jax.debug.callback(_count)
        return -1.0 / jnp.sqrt(q @ q)


class CountingGeneralKepler(vj.LagrangianSystem):
    def lagrangian(self, q, v):
        jax.debug.callback(_count)
        return 0.5 * v @ v + 1.0 / jnp.sqrt(q @ q)


class CountingDoublePendulum(vj.systems.DoublePendulum):
    def potential(self, q):
        jax.debug.callback(_count)
        return super().potential(q)


# a holonomic system is declared by subclassing vj.HolonomicSystem (older versions: by defining
# holonomic(q), which the class below does either way)
_BASES = (vj.systems.PointMassSystem,) + ((vj.HolonomicSystem,) if hasattr(vj, "HolonomicSystem") else ())


class CountingPendulum(*_BASES):
    def potential(self, q):
        jax.debug.callback(_count)
        return 9.81 * q[-1] + 0.5 * 5.0 * jnp.sum((q - jnp.array([0.3, 0.2])) ** 2)

    def holonomic(self, q):
        return jnp.atleast_1d(0.5 * (q @ q - 1.0))


def _run(system, integrator, q0, v0, h, n):
    run = jax.jit(lambda q0, v0: vj.simulate(system, integrator, q0=q0, v0=v0, dt=h,
                                             n_steps=n, save_every=n))
    jax.block_until_ready(run(q0, v0))  # compile (and one run)
    CALLS.clear()
    sol = jax.block_until_ready(run(q0, v0))
    jax.effects_barrier()
    return len(CALLS), float(np.sum(np.asarray(sol.stats.iterations)))


def measure(system, integrator, q0, v0, h, n):
    """Per step, from the difference of a run of 2n and one of n steps (which cancels the
    evaluations made once per run: the initial momentum, the saved states' velocities)."""
    c1, i1 = _run(system, integrator, q0, v0, h, n)
    c2, i2 = _run(system, integrator, q0, v0, h, 2 * n)
    return (c2 - c1) / n, (i2 - i1) / n


def main():
    kq0, kv0 = jnp.array([0.5, 0.0]), jnp.array([0.0, 3.0**0.5])
    th = 1.0
    pq0 = jnp.array([np.sin(th), -np.cos(th)])
    pv0 = 0.5 * jnp.array([np.cos(th), np.sin(th)])
    cases = [
        ("VPRK.gauss(2), Kepler e = 0.5, h = 0.01", CountingKepler(), vj.VPRK.gauss(2), kq0, kv0,
         0.01),
        ("VPRK.gauss(2), general-Lagrangian Kepler, h = 0.01", CountingGeneralKepler(),
         vj.VPRK.gauss(2), kq0, kv0, 0.01),
        ("VPRK.gauss(2), double pendulum, h = 0.01", CountingDoublePendulum(), vj.VPRK.gauss(2),
         jnp.array([1.0, 0.5]), jnp.array([0.0, 0.0]), 0.01),
        ("HolonomicVPRK.rattle(), spring pendulum, h = 0.01", CountingPendulum(),
         vj.HolonomicVPRK.rattle(), pq0, pv0, 0.01),
        ("GalerkinVI.gauss(4), spring pendulum, h = 0.05", CountingPendulum(),
         vj.GalerkinVI.gauss(4), pq0, pv0, 0.05),
    ]
    print(f"{'run':52s} {'Lagrangian evaluations/step':>28s} {'solver iterations/step':>23s}")
    for name, system, integ, q0, v0, h in cases:
        evals, iters = measure(system, integ, q0, v0, h, 100)
        print(f"{name:52s} {evals:28.2f} {iters:23.2f}")


if __name__ == "__main__":
    main()
