"""The nonholonomic PRK's default solver (the preconditioned fixed point) against full Newton
and SimplifiedNewton, per step, on every nonholonomic system of the catalogue.

    python benchmarks/nonholonomic_solver.py   # writes benchmarks/results/nonholonomic_solver.json

Each (system, s) row compiles the three solvers' runs (``vj.simulate`` inside ``jax.jit``,
timing rules of benchmarks/run.py) and times them interleaved, three rounds, median; it also
records the mean iterations per step and the largest difference of the trajectories from
Newton's (solver tolerance, grown by the chaotic systems' instability).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(Path(__file__).parent))

import vijax as vj  # noqa: E402
from run import RESULTS, _once, log, vijax_runner  # noqa: E402

S = vj.systems


def problems():
    """``(name, system, q0, v0, h, steps)``."""
    q, v = S.ChaoticNonholonomic.initial_conditions()
    disk, sleigh, quartic, gear = (S.VerticalDisk(), S.ChaplyginSleigh(),
                                   S.QuarticNonholonomic(), S.CVTGearbox())
    uni, ball = S.Unicycle(), S.BallOnTurntable()
    return [
        ("particle", S.NonholonomicParticle(), *S.NonholonomicParticle.initial_conditions(),
         0.01, 2000),
        ("chaotic (m = 3)", S.ChaoticNonholonomic(), q[3], v[3], 0.05, 2000),
        ("pendulum-driven CVT, low", S.PendulumDrivenCVT(), *S.PendulumDrivenCVT.initial("low"),
         0.1, 2000),
        ("pendulum-driven CVT, high", S.PendulumDrivenCVT(),
         *S.PendulumDrivenCVT.initial("high"), 0.1, 2000),
        ("vertical disk", disk, *disk.initial(q0=(0.1, -0.2, 0.4, 0.3)), 0.1, 2000),
        ("Chaplygin sleigh", sleigh, *sleigh.initial(rho1=0.3, rho2=0.5, theta=0.7), 0.05, 2000),
        ("quartic", quartic, *quartic.initial(0.4), 0.05, 2000),
        ("CVT gearbox", gear, *gear.initial(), 0.1, 2000),
        ("unicycle (SE(2), Cayley)", uni, *uni.initial(), 0.1, 2000),
        ("ball on turntable (SO(3)xR^2, Cayley)", ball, *ball.initial(), 0.1, 1000),
    ]


def method(system, s, **kw):
    if isinstance(system, vj.LieGroupSystem):
        return vj.GroupVPRK.lobatto(s, retraction=vj.lie.Cayley(), **kw)
    return vj.NonholonomicVPRK.lobatto(s, **kw)


SOLVERS = {"fixed point (default)": {}, "Newton": {"solver": vj.solvers.Newton()},
           "SimplifiedNewton": {"solver": vj.solvers.SimplifiedNewton()}}


def main():
    rows = []
    for name, system, q0, v0, h, n in problems():
        q0 = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), q0)
        v0 = jnp.asarray(v0, jnp.float64)
        for s in (2, 3, 4):
            runs = {k: vijax_runner(system, method(system, s, **kw), n, n // 10)
                    .lower(q0, v0, h).compile() for k, kw in SOLVERS.items()}
            out = {k: _once(f, q0, v0, h)[0] for k, f in runs.items()}
            wall = {k: [] for k in runs}
            for _ in range(3):
                for k, f in runs.items():
                    wall[k].append(_once(f, q0, v0, h)[1])
            row = dict(system=name, s=s, h=h, n_steps=n)
            for k in runs:
                row[k] = dict(us_per_step=float(np.median(wall[k])) / n * 1e6,
                              iterations=float(out[k][3]), converged=bool(out[k][4]),
                              max_dq_vs_newton=max(
                                  float(jnp.max(jnp.abs(a - b))) for a, b in zip(
                                      jax.tree_util.tree_leaves(out[k][1]),
                                      jax.tree_util.tree_leaves(out["Newton"][1]))))
            fp, nw = row["fixed point (default)"], row["Newton"]
            row["ratio_fixed_point_to_newton"] = fp["us_per_step"] / nw["us_per_step"]
            rows.append(row)
            log(f"{name:40s} s={s}  fixed point {fp['us_per_step']:7.2f} us ({fp['iterations']:.2f} it)"
                f"  Newton {nw['us_per_step']:7.2f} us ({nw['iterations']:.2f} it)"
                f"  SimplifiedNewton {row['SimplifiedNewton']['us_per_step']:7.2f} us"
                f"  ratio {row['ratio_fixed_point_to_newton']:.2f}"
                f"  max|dq| {fp['max_dq_vs_newton']:.1e}")
    path = RESULTS / "nonholonomic_solver.json"
    path.write_text(json.dumps(dict(rows=rows), indent=1))
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
