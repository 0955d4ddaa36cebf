"""Per-step and per-call cost of ``vj.simulate`` called directly versus inside ``jax.jit``.

GeneralKepler (a general Lagrangian), ``VPRK.gauss(2)``, h = 0.01.  A jitted call that returns
only ``sol.q`` lets XLA drop the velocity recovery of the saved states (an inverse Legendre
solve per state for a general Lagrangian); returning the whole Solution keeps it.

    python benchmarks/direct_call_overhead.py
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from per_step_cost import best  # noqa: E402

SYSTEM = vj.systems.GeneralKepler()
INTEG = vj.VPRK.gauss(2)
Q0, V0 = jnp.array([0.5, 0.0]), jnp.array([0.0, np.sqrt(3.0)])


def main():
    for n, repeats in ((10, 50), (100_000, 5)):
        def call(q0, v0, n=n):
            return vj.simulate(SYSTEM, INTEG, q0=q0, v0=v0, dt=0.01, n_steps=n)

        q_only = jax.jit(lambda q0, v0: call(q0, v0).q)
        whole = eqx.filter_jit(call)
        runs = {"direct (whole Solution)": lambda: call(Q0, V0),
                "jax.jit, sol.q only": lambda: q_only(Q0, V0),
                "eqx.filter_jit, whole Solution": lambda: whole(Q0, V0)}
        for name, f in runs.items():
            t = best(f, repeats)
            print(f"n = {n:6d}  {name:32s} {1e3 * t:9.3f} ms  {1e6 * t / n:7.3f} us/step")


if __name__ == "__main__":
    main()
