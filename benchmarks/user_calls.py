"""Per-step cost of ``vj.simulate`` as a user calls it, at default XLA flags.

Three groups, each timed as the best of ``--repeats`` blocked calls after a warm-up call:

* ``saved``: every step saved (``save_every=1``, the default), called directly (no ``jit``):
  VPRK Gauss(2) on Kepler (MechanicalSystem and general Lagrangian), Gauss(3) on the double
  pendulum, Gauss(4) on Hénon--Heiles;
* ``newton``: ``VPRK.gauss(s, solver=Newton())`` on Kepler, ten saves (the dense solve of
  each Newton update: 2s x 2s);
* ``constrained``: the holonomic families on the planar Cartesian pendulum, ten saves.

and ``call``: GeneralKepler with ``VPRK.gauss(2)`` for 10 and 10^5 steps, called directly, under
``equinox.filter_jit`` returning the whole Solution, and under ``jax.jit`` returning ``sol.q``
only (which lets XLA drop the velocity recovery of the saved states: an inverse Legendre solve
per state for a general Lagrangian).

Compare two versions of the library by running this script against each checkout
(``PYTHONPATH=<checkout>``) on a quiet machine.

    python benchmarks/user_calls.py --out benchmarks/results    # -> user_calls.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402


def best(f, repeats):
    jax.block_until_ready(f())
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f())
        times.append(time.perf_counter() - t)
    return min(times)


def cases():
    kep = (jnp.array([0.5, 0.0]), jnp.array([0.0, np.sqrt(3.0)]))
    pend = (jnp.array([np.sin(1.0), -np.cos(1.0)]), jnp.zeros(2))
    cart = vj.systems.CartesianPendulum()
    out = [
        ("saved", "VPRK.gauss(2), Kepler", vj.systems.Kepler(), vj.VPRK.gauss(2), kep, 100_000, 1),
        ("saved", "VPRK.gauss(2), GeneralKepler", vj.systems.GeneralKepler(), vj.VPRK.gauss(2),
         kep, 100_000, 1),
        ("saved", "VPRK.gauss(3), DoublePendulum", vj.systems.DoublePendulum(),
         vj.VPRK.gauss(3), (jnp.array([1.0, 1.5]), jnp.zeros(2)), 20_000, 1),
        ("saved", "VPRK.gauss(4), HenonHeiles", vj.systems.HenonHeiles(), vj.VPRK.gauss(4),
         (jnp.array([0.1, 0.2]), jnp.array([0.3, 0.1])), 20_000, 1),
    ]
    for s in (1, 2, 3, 4):
        out.append(("newton", f"VPRK.gauss({s}, solver=Newton()), Kepler", vj.systems.Kepler(),
                    vj.VPRK.gauss(s, solver=vj.solvers.Newton()), kep, 20_000, 2_000))
    for name, integ in [("HolonomicVPRK.rattle()", vj.HolonomicVPRK.rattle()),
                        ("GalerkinVI.rattle()", vj.GalerkinVI.rattle()),
                        ("GalerkinVI.gauss(2)", vj.GalerkinVI.gauss(2)),
                        ("GalerkinVI.gauss(3)", vj.GalerkinVI.gauss(3)),
                        ("GalerkinVI.gauss(4)", vj.GalerkinVI.gauss(4))]:
        out.append(("constrained", f"{name}, CartesianPendulum", cart, integ, pend, 20_000,
                    2_000))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="folder for user_calls.json")
    ap.add_argument("--groups", default="saved,newton,constrained,call",
                    help="comma-separated groups to run (default: all)")
    args = ap.parse_args()
    groups = set(args.groups.split(","))
    rows = []
    for group, name, system, integ, (q0, v0), n, se in cases():
        if group not in groups:
            continue
        def call(n=n, se=se, system=system, integ=integ, q0=q0, v0=v0):
            return vj.simulate(system, integ, q0=q0, v0=v0, dt=0.01, n_steps=n, save_every=se)

        t = best(call, args.repeats)
        rows.append(dict(group=group, case=name, n_steps=n, save_every=se,
                         us_per_step=1e6 * t / n))
        print(f"{group:12s} {name:48s} {1e6 * t / n:8.3f} us/step", flush=True)
    system, integ = vj.systems.GeneralKepler(), vj.VPRK.gauss(2)
    q0, v0 = jnp.array([0.5, 0.0]), jnp.array([0.0, np.sqrt(3.0)])
    for n, repeats in ((10, 50), (100_000, args.repeats)) if "call" in groups else ():
        def call(q0, v0, n=n):
            return vj.simulate(system, integ, q0=q0, v0=v0, dt=0.01, n_steps=n)

        q_only, whole = jax.jit(lambda q0, v0: call(q0, v0).q), eqx.filter_jit(call)
        for how, f in (("direct (whole Solution)", lambda: call(q0, v0)),
                       ("eqx.filter_jit, whole Solution", lambda: whole(q0, v0)),
                       ("jax.jit, sol.q only", lambda: q_only(q0, v0))):
            t = best(f, repeats)
            rows.append(dict(group="call", case=f"GeneralKepler VPRK.gauss(2), {how}",
                             n_steps=n, ms_per_call=1e3 * t, us_per_step=1e6 * t / n))
            print(f"{'call':12s} n = {n:6d} {how:39s} {1e3 * t:9.3f} ms "
                  f"{1e6 * t / n:8.3f} us/step", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        info = dict(jax=jax.__version__, device=str(jax.devices()[0]), rows=rows)
        (out / "user_calls.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
