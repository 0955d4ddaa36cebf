"""Per-step cost of ``jax.grad`` through ``vj.simulate`` against the forward run, for A/B
comparisons of two trees in alternating processes.

    python benchmarks/gradient_step.py kepler 10000,100000
    PYTHONPATH=/path/to/other/tree python benchmarks/gradient_step.py double_pendulum 10000

The programs are those of ``benchmarks/adjoints.py`` part a (``problems``, ``vijax_final``,
``loss_of``: ``VPRK.gauss(2)``, dt = 0.01, ``save_every = N``, loss ``sum(q_N^2) +
sum(p_N)``, gradient with respect to ``q0``).  Prints the minimum over ``--calls`` calls of
each compiled program, per step: this machine's single calls fall on two speeds about 2x
apart, so compare minima over several processes, alternating the trees.
"""
from __future__ import annotations

import argparse

import jax

import _problems as P
from adjoints import ADJOINTS, call, compiled, loss_of, problems, vijax_final


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", choices=["kepler", "double_pendulum"])
    ap.add_argument("steps", help="comma-separated step counts, e.g. 10000,100000")
    ap.add_argument("--adjoint", choices=ADJOINTS, default="store_all")
    ap.add_argument("--calls", type=int, default=7)
    args = ap.parse_args()
    _, system, q0, v0 = problems()[args.problem]
    for n in (int(x) for x in args.steps.split(",")):
        loss = loss_of(vijax_final(system, v0, n, args.adjoint))
        fwd, grad = (compiled(f, q0, P.vijax_options())[0] for f in (loss, jax.grad(loss)))
        times = {"fwd": [], "grad": []}
        for _ in range(args.calls):
            for name, exe in (("fwd", fwd), ("grad", grad)):
                times[name].append(call(exe, q0)[1])
        f, g = min(times["fwd"]), min(times["grad"])
        print(f"{args.problem} N = {n} ({args.adjoint}): forward {1e6 * f / n:.3f} us/step, "
              f"gradient {1e6 * g / n:.3f} us/step, ratio {g / f:.2f}", flush=True)


if __name__ == "__main__":
    main()
