"""Per-step cost of two versions of vijax in one process, interleaved call by call.

    git worktree add /tmp/base <commit>
    python benchmarks/ab_versions.py /tmp/base rattle,kepler,top_exp --rounds 25

The other tree's ``vijax`` package is copied under another name (``vijax_base``; the package
imports itself only relatively) and imported beside the working tree's.  Each case is
compiled once per version (``jax.jit`` of ``vj.simulate``, 20000 steps, ten saves), then the
two executables are called in alternation, ``--rounds`` times each; the script prints the
minimum and the median per step of each and their ratios (new / base).  The compiled
function returns the saved positions; with ``--whole``, the whole ``Solution`` (states,
velocities, momenta and solver statistics, as a direct call of ``vj.simulate`` does).

Why: single calls on the 2-core benchmark machine fall on speeds up to 2x apart, between
calls and between processes, so separate runs of each tree need many alternating processes
to resolve a 10 % change.  Interleaving in one process exposes both versions to the same
machine state; for most programs the ratios repeat to a few per cent between runs (not
for all: repeat a comparison before trusting it).

Cases: ``kepler`` and ``general_kepler`` (``VPRK.gauss(2)``, h = 0.01),
``double_pendulum`` (``VPRK.gauss(3)``, h = 0.01), ``rattle`` (``HolonomicVPRK.rattle()``,
planar Cartesian pendulum, h = 0.01),
``galerkin4`` (``GalerkinVI.gauss(4)``, same), ``top_exp`` and ``top_cayley``
(``GroupVPRK.gauss(2)`` on the heavy top, inertia (1, 2, 3), h = 0.05, Exp and Cayley);
``cvt_dg``, ``cvt_dg_system``, ``cvt_dg_newton``, ``cvt_si_dla`` (the CVT gearbox,
h = 0.1: ``DiscreteGradient.gonzalez()`` with its default solver, with the system's frame,
with Newton at ``eps/100``; ``cvt_avf``, ``cvt_avf_system``: ``DiscreteGradient.avf()``
with the QR and the system's frame; the semi-implicit and (``cvt_i_dla``) implicit discrete
Lagrange--d'Alembert steps;
``NonholonomicVPRK.lobatto(3)``) and ``quartic_dg``, ``quartic_dg_newton``,
``quartic_si_dla``, ``quartic_lobatto3`` (the quartic nonholonomic system).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

CASES = ("kepler", "general_kepler", "double_pendulum", "rattle", "galerkin4", "top_exp",
         "top_cayley", "cvt_dg", "cvt_dg_system", "cvt_dg_newton", "cvt_avf", "cvt_avf_system",
         "cvt_si_dla", "cvt_i_dla", "cvt_lobatto3", "quartic_dg", "quartic_si_dla",
         "quartic_dg_newton", "quartic_lobatto3", "unicycle_exp", "unicycle_cayley",
         "ball_cayley")
N_STEPS = 20_000


def case_data(vj, case):
    """``(system, integrator, h, (q0, v0))`` of ``case``."""
    import jax.numpy as jnp

    pend = (jnp.array([np.sin(1.0), -np.cos(1.0)]), jnp.zeros(2))
    table = {
        "kepler": (vj.systems.Kepler(), vj.VPRK.gauss(2), 0.01,
                   (jnp.array([0.5, 0.0]), jnp.array([0.0, np.sqrt(3.0)]))),
        "general_kepler": (vj.systems.GeneralKepler(), vj.VPRK.gauss(2), 0.01,
                           (jnp.array([0.5, 0.0]), jnp.array([0.0, np.sqrt(3.0)]))),
        "double_pendulum": (vj.systems.DoublePendulum(), vj.VPRK.gauss(3), 0.01,
                            (jnp.array([1.0, 1.5]), jnp.zeros(2))),
        "rattle": (vj.systems.CartesianPendulum(), vj.HolonomicVPRK.rattle(), 0.01, pend),
        "galerkin4": (vj.systems.CartesianPendulum(), vj.GalerkinVI.gauss(4), 0.01, pend),
    }
    if case.startswith(("cvt_", "quartic_")):
        system = (vj.systems.CVTGearbox() if case.startswith("cvt_")
                  else vj.systems.QuarticNonholonomic())
        tol = 0.01 * float(np.finfo(np.float64).eps)
        integ = {"dg": lambda: vj.DiscreteGradient.gonzalez(),
                 "dg_system": lambda: vj.DiscreteGradient.gonzalez(frame="system"),
                 "avf": lambda: vj.DiscreteGradient.avf(),
                 "avf_system": lambda: vj.DiscreteGradient.avf(frame="system"),
                 "dg_newton": lambda: vj.DiscreteGradient.gonzalez(
                     solver=vj.solvers.Newton(rtol=tol, atol=tol)),
                 "si_dla": vj.DiscreteLagrangeDAlembert.semi_implicit,
                 "i_dla": vj.DiscreteLagrangeDAlembert.implicit,
                 "lobatto3": lambda: vj.NonholonomicVPRK.lobatto(3)}[case.split("_", 1)[1]]()
        table[case] = (system, integ, 0.1, system.initial())
    if case.startswith("top_"):
        top = vj.systems.HeavyTop(inertia=(1.0, 2.0, 3.0), gravity=1.0)
        integ = (vj.GroupVPRK.gauss(2) if case == "top_exp"
                 else vj.GroupVPRK.gauss(2, retraction=vj.lie.Cayley()))
        table[case] = (top, integ, 0.05, (vj.lie.SO3().exp(jnp.array([0.3, -0.2, 0.4])),
                                          jnp.array([0.3, -0.8, 1.0])))
    if case.startswith(("unicycle_", "ball_")):
        system = (vj.systems.Unicycle() if case.startswith("unicycle_")
                  else vj.systems.BallOnTurntable())
        retraction = vj.lie.Exp() if case.endswith("_exp") else vj.lie.Cayley()
        table[case] = (system, vj.GroupVPRK.lobatto(3, retraction=retraction),
                       0.1 if case.startswith("unicycle_") else 0.05, system.initial())
    return table[case]


def build(vj, case, compiler_options=None, whole=False):
    """``(call, n_steps, executable)``: a compiled ``vj.simulate`` of ``case``, called with
    its data (compiled with the XLA ``compiler_options``, if given), returning the saved
    positions or (``whole``) the ``Solution``."""
    import jax

    system, integ, h, args = case_data(vj, case)

    def run(q0, v0):
        sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=h, n_steps=N_STEPS,
                          save_every=N_STEPS // 10)
        return sol if whole else sol.q

    run = jax.jit(run)
    exe = run.lower(*args).compile(compiler_options=compiler_options)
    return (lambda: jax.block_until_ready(exe(*args))), N_STEPS, exe


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the other tree (a checkout holding vijax/)")
    ap.add_argument("cases", help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--whole", action="store_true", help="return the whole Solution")
    args = ap.parse_args()
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    tmp = tempfile.mkdtemp()
    try:
        shutil.copytree(os.path.join(args.base, "vijax"), os.path.join(tmp, "vijax_base"))
        sys.path.insert(0, tmp)
        import jax

        jax.config.update("jax_enable_x64", True)
        import vijax as new
        import vijax_base as base

        for case in cases:
            (fb, n, _), (fn, _, _) = (build(base, case, whole=args.whole),
                                      build(new, case, whole=args.whole))
            fb(), fn()
            tb, tn = [], []
            for _ in range(args.rounds):
                for f, times in ((fb, tb), (fn, tn)):
                    t = time.perf_counter()
                    f()
                    times.append(time.perf_counter() - t)
            tb, tn = 1e6 * np.array(tb) / n, 1e6 * np.array(tn) / n
            print(f"{case:16s} us/step base min {tb.min():6.2f} median {np.median(tb):6.2f} | "
                  f"new min {tn.min():6.2f} median {np.median(tn):6.2f} | new/base: min "
                  f"{tn.min() / tb.min():.3f}, median {np.median(tn) / np.median(tb):.3f}",
                  flush=True)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
