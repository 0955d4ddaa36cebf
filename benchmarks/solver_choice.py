"""Why vijax keeps its own solver layer: vijax Newton vs optimistix Newton vs vijax FixedPoint
inside the same VPRK Gauss(2) step (Kepler e = 0.5, h = 0.01).

    python benchmarks/solver_choice.py      # writes benchmarks/results/solver_choice.json
"""

from __future__ import annotations

import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import optimistix as optx

import vijax as vj

N, H = 20_000, 0.01


class OptimistixNewton(vj.solvers.Newton):
    """The same solver contract, delegating to optimistix.Newton (no IFT customisation)."""

    def solve(self, fn, x0, precond=None):
        sol = optx.root_find(lambda x, _: fn(x), optx.Newton(rtol=1e-14, atol=1e-14), x0,
                             throw=False, max_steps=50)
        stats = vj.solvers.SolverStats(
            iterations=sol.stats["num_steps"].astype(jnp.int32),
            residual=jnp.zeros((), x0.dtype),
            converged=sol.result == optx.RESULTS.successful)
        return sol.value, stats


def median_time(f, *args, repeats=5):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main():
    kepler = vj.systems.Kepler()
    q0, v0 = kepler.initial_conditions(0.5)
    out = {}
    for name, solver in [("vijax Newton", vj.solvers.Newton()),
                         ("optimistix Newton", OptimistixNewton()),
                         ("vijax FixedPoint", vj.solvers.FixedPoint())]:
        integ = vj.VPRK.gauss(2, solver=solver)
        run = jax.jit(lambda q, v, integ=integ: vj.simulate(
            kepler, integ, q0=q, v0=v, dt=H, n_steps=N, save_every=N).q[-1])
        sol = vj.simulate(kepler, integ, q0=q0, v0=v0, dt=H, n_steps=N, save_every=N)
        grad = jax.jit(jax.grad(lambda q, integ=integ: vj.simulate(
            kepler, integ, q0=q, v0=v0, dt=H, n_steps=1000, save_every=1000).q[-1].sum()))
        t = time.perf_counter()
        jax.block_until_ready(grad(q0))
        out[name] = {"us_per_step": median_time(run, q0, v0) / N * 1e6,
                     "mean_iterations": float(sol.mean_iterations),
                     "grad_compile_and_run_s": time.perf_counter() - t}
        print(name, out[name])
    path = pathlib.Path(__file__).parent / "results" / "solver_choice.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
