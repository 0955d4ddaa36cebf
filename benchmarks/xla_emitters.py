"""XLA:CPU's two code generators for fused loops, side by side: compile time and step time.

XLA:CPU compiles fused loops with its fusion emitters by default; ``XLA_FLAGS=
--xla_cpu_use_fusion_emitters=false`` selects the older loop emitters.  Both compile the same
optimised HLO program.  This script times, for a few ``simulate`` configurations, the XLA
compile (ahead of time: ``jax.jit(...).lower(...).compile()``) and the step (best and median of
seven calls of the compiled run), in a fresh process per flag setting, alternating the two for
``--rounds`` rounds (processes, so each setting starts from a cold compiler):

    python benchmarks/xla_emitters.py            # writes results/xla_emitters.json

The test suite runs with the loop emitters (``tests/conftest.py``); vijax itself sets no flag.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

FLAG = "--xla_cpu_use_fusion_emitters=false"
RESULTS = Path(__file__).resolve().parent / "results"


def measure() -> dict:
    """One process: every configuration under this process's ``XLA_FLAGS``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    import vijax as vj

    pendulum = vj.systems.CartesianPendulum()
    kepler = vj.systems.Kepler()
    qk, vk = kepler.initial_conditions(0.5)
    cases = {
        "Kepler, VPRK.gauss(2), h = 0.01": (kepler, vj.VPRK.gauss(2), qk, vk, 0.01, 100_000),
        "Kepler as a general Lagrangian, VPRK.gauss(2)": (
            vj.systems.GeneralKepler(), vj.VPRK.gauss(2), qk, vk, 0.01, 100_000),
        "double pendulum, VPRK.gauss(4), h = 0.02": (
            vj.systems.DoublePendulum(), vj.VPRK.gauss(4), jnp.array([1.0, 0.5]),
            jnp.array([0.0, 0.3]), 0.02, 20_000),
        "heavy top, GroupVPRK.gauss(2), h = 0.05": (
            vj.systems.HeavyTop(), vj.GroupVPRK.gauss(2),
            vj.lie.SO3().exp(jnp.array([0.4, 0.0, 0.0])), jnp.array([0.3, -0.2, 1.5]), 0.05,
            20_000),
        "Cartesian pendulum, HolonomicVPRK.rattle(), h = 0.01": (
            pendulum, vj.HolonomicVPRK.rattle(), jnp.array([1.0, 0.0]), jnp.array([0.0, 0.5]),
            0.01, 50_000),
        "Cartesian pendulum, GalerkinVI.gauss(4), h = 0.01": (
            pendulum, vj.GalerkinVI.gauss(4), jnp.array([1.0, 0.0]), jnp.array([0.0, 0.5]),
            0.01, 20_000),
    }
    out = {}
    for name, (system, integ, q0, v0, h, n) in cases.items():
        def run(q0, v0, system=system, integ=integ, h=h, n=n):
            return vj.simulate(system, integ, q0=q0, v0=v0, dt=h, n_steps=n, save_every=n).q

        t0 = time.perf_counter()
        lowered = jax.jit(run).lower(q0, v0)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        jax.block_until_ready(compiled(q0, v0))
        times = []
        for _ in range(7):
            t = time.perf_counter()
            jax.block_until_ready(compiled(q0, v0))
            times.append(time.perf_counter() - t)
        out[name] = dict(trace_lower_s=t1 - t0, compile_s=t2 - t1,
                         us_per_step_best=min(times) / n * 1e6,
                         us_per_step_median=float(np.median(times)) / n * 1e6)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "xla_emitters.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure()))
        return
    base = os.environ.get("XLA_FLAGS", "")
    settings = {"fusion emitters (XLA default)": base,
                "loop emitters (" + FLAG + ")": f"{base} {FLAG}".strip()}
    runs = {label: [] for label in settings}
    for r in range(args.rounds):
        for label, flags in settings.items():
            env = dict(os.environ, XLA_FLAGS=flags)
            res = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                                 capture_output=True, text=True)
            runs[label].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}, {label}: done", flush=True)
    summary = {}
    for label, rs in runs.items():
        for case in rs[0]:
            comp = [x[case]["compile_s"] for x in rs]
            best = [x[case]["us_per_step_best"] for x in rs]
            summary.setdefault(case, {})[label] = dict(
                compile_s_min=min(comp), compile_s_median=statistics.median(comp),
                us_per_step_min=min(best), us_per_step_median=statistics.median(best))
    default, loop = list(settings)
    print(f"\n{'configuration':55s} compile loop/default   step loop/default (min, median)")
    for case, by in summary.items():
        d, l = by[default], by[loop]
        by["ratios loop/default"] = dict(
            compile_median=l["compile_s_median"] / d["compile_s_median"],
            step_min=l["us_per_step_min"] / d["us_per_step_min"],
            step_median=l["us_per_step_median"] / d["us_per_step_median"])
        r = by["ratios loop/default"]
        print(f"{case:55s} {r['compile_median']:5.2f}                  "
              f"{r['step_min']:5.2f}, {r['step_median']:5.2f}")
    import jax

    info = dict(platform=platform.platform(), cpu_count=os.cpu_count(), jax=jax.__version__,
                rounds=args.rounds, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    Path(args.out).write_text(json.dumps(dict(machine=info, summary=summary, runs=runs),
                                         indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
