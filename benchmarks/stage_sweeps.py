"""How many fixed-point sweeps of the stage equations to run as straight-line code.

:class:`vijax.solvers.FixedPoint` runs ``min_steps`` updates as straight-line code and then a
``lax.while_loop`` until the stopping test holds.  On a CPU a loop iteration costs little more
than the update it runs; on a GPU every iteration also waits for its predicate on the host, so
updates that would run anyway are cheaper unrolled -- but every unrolled update runs even when
fewer would do.  This script times VPRK steps for ``min_steps`` = 1 ... 8 on one trajectory
and on vmapped ensembles, with the mean and slowest-lane iteration counts, and prints the
best value per case.

    python benchmarks/stage_sweeps.py --out benchmarks/results   # -> stage_sweeps_<platform>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402

S = vj.systems


def cases():
    dp_q = np.array([1.0, 1.5])
    return [
        ("Kepler e=0.5, Gauss(2), h=0.01", S.Kepler(), 2, 0.01, np.array([0.5, 0.0]),
         np.array([0.0, 3.0 ** 0.5]), 0.05),
        ("DoublePendulum, Gauss(3), h=0.01", S.DoublePendulum(), 3, 0.01, dp_q, np.zeros(2), 0.1),
        ("DoublePendulum, Gauss(4), h=0.02", S.DoublePendulum(), 4, 0.02, dp_q, np.zeros(2), 0.1),
        ("HenonHeiles, Gauss(4), h=0.1", S.HenonHeiles(), 4, 0.1, np.array([0.1, 0.2]),
         np.array([0.3, 0.1]), 0.02),
    ]


def timed(f, repeats):
    jax.block_until_ready(f())
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        out = jax.block_until_ready(f())
        best = min(best, time.perf_counter() - t)
    return out, best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,1024")
    ap.add_argument("--sweeps", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    sweeps = [int(m) for m in args.sweeps.split(",")]
    n = args.steps
    rng = np.random.default_rng(0)
    res = dict(devices=[f"{d.platform}:{d.device_kind}" for d in jax.devices()],
               platform=platform.platform(), cpu_count=os.cpu_count(), jax=jax.__version__,
               steps=n, cases={})
    print(f"devices {res['devices']}; {n} steps per run", flush=True)
    for name, system, s, h, q0, v0, spread in cases():
        res["cases"][name] = {}
        for b in batches:
            q = jnp.asarray(q0 + spread * rng.uniform(-1, 1, (b, q0.size)))
            v = jnp.asarray(np.broadcast_to(v0, (b, v0.size)).copy())
            row = {}
            for m in sweeps:
                integ = vj.VPRK.gauss(s, solver=vj.solvers.FixedPoint(min_steps=m))
                f = lambda integ=integ: vj.simulate_ensemble(  # noqa: E731
                    system, integ, q0=q, v0=v, dt=h, n_steps=n, save_every=n // 10,
                    throw=False)
                sol, wall = timed(f, args.repeats)
                it = np.asarray(sol.stats.iterations) / (n // 10)       # (b, blocks)
                row[m] = dict(us_per_step=wall / n * 1e6, ns_per_member_step=wall / n / b * 1e9,
                              mean_iterations=float(it.mean()),
                              converged=bool(np.all(sol.stats.converged)))
            best = min(row, key=lambda m: row[m]["us_per_step"])
            res["cases"][name][b] = dict(by_min_steps=row, best=best)
            print(f"{name:36s} batch {b:6d}: it/step {row[sweeps[0]]['mean_iterations']:.2f}; "
                  + "  ".join(f"{m}:{row[m]['us_per_step']:.2f}" for m in sweeps)
                  + f"  us/step -> best {best}", flush=True)
    if args.out:
        tag = jax.devices()[0].platform
        path = Path(args.out) / f"stage_sweeps_{tag}.json"
        path.write_text(json.dumps(res, indent=1))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
