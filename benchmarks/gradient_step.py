"""Per-step cost of ``jax.grad`` through ``vj.simulate`` against the forward run, for A/B
comparisons of two trees in alternating processes.

    python benchmarks/gradient_step.py kepler 10000,100000
    PYTHONPATH=/path/to/other/tree python benchmarks/gradient_step.py double_pendulum 10000

The loss and problems are those of ``benchmarks/adjoints.py`` (``VPRK.gauss(2)``, dt = 0.01,
``save_every = N``, ``adjoint="store_all"``, loss ``sum(q_N^2) + sum(p_N)``, gradient with
respect to ``q0``).  Prints the minimum over 7 calls of each compiled program, per step: this
machine's single calls fall on two speeds about 2x apart, so compare minima over several
processes, alternating the trees.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

import _problems as P  # noqa: E402

import vijax as vj  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", choices=["kepler", "double_pendulum"])
    ap.add_argument("steps", help="comma-separated step counts, e.g. 10000,100000")
    ap.add_argument("--calls", type=int, default=7)
    args = ap.parse_args()
    prob = P.kepler() if args.problem == "kepler" else P.double_pendulum((1.0, 1.5))
    integrator = vj.VPRK.gauss(2)
    for n in (int(x) for x in args.steps.split(",")):
        def loss(q0, n=n):
            sol = vj.simulate(prob.system, integrator, q0=q0, v0=prob.v0, dt=0.01, n_steps=n,
                              save_every=n, adjoint="store_all")
            return jnp.sum(sol.q[-1] ** 2) + jnp.sum(sol.p[-1])

        fwd = jax.jit(loss).lower(prob.q0).compile()
        grad = jax.jit(jax.grad(loss)).lower(prob.q0).compile()
        times = {"fwd": [], "grad": []}
        for _ in range(args.calls):
            for name, exe in (("fwd", fwd), ("grad", grad)):
                t = time.perf_counter()
                jax.block_until_ready(exe(prob.q0))
                times[name].append(time.perf_counter() - t)
        f, g = min(times["fwd"]), min(times["grad"])
        print(f"{args.problem} N = {n}: forward {1e6 * f / n:.3f} us/step, gradient "
              f"{1e6 * g / n:.3f} us/step, ratio {g / f:.2f}", flush=True)


if __name__ == "__main__":
    main()
