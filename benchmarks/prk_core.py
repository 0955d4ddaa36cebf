"""Per-step cost of the PRK families before and after a change of their shared stage equations.

Every PRK family (VPRK, HolonomicVPRK, NonholonomicVPRK, GroupVPRK) builds its stage residual
with ``vijax.integrators._prk_core.stage_equations``, which is written on a Lie group and
called with ``R^n`` for the vector-space families.  This benchmark checks that writing them
once cost the vector-space presets nothing: it times the same runs on two source trees, the
working tree and a git revision (``--before``, default the commit before the shared core),
in one invocation, alternating the trees between repeats so that machine noise hits both
alike.  Each run is a jitted ``vj.simulate`` call (compile excluded, best of ``--repeats``).
It also records what a change costs or saves at compile time: the first call of that jitted
run (trace and compilation), and the trace and the compilation of the gradient program of a
20-step run (``jax.jit(jax.grad(...))`` with respect to ``v0``), the program an optimal-control
or fitting loop compiles.

    python benchmarks/prk_core.py                 # writes results/prk_core.json and a summary
    python benchmarks/prk_core.py --before HEAD~3 --repeats 7
    python benchmarks/prk_core.py --before fa3b272 --out trace_once.json   # any baseline

Each tree is imported in its own subprocess (``PYTHONPATH``), so one process never mixes the
two versions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

#: The last commit whose families had their own stage equations.
DEFAULT_BEFORE = "cda05ba"

# name -> (code building `system, integ, q0, v0, dt, n`), evaluated in the child
CASES = {
    "VPRK.gauss(2), Kepler as a general Lagrangian (momentum form)": """
system = vj.systems.GeneralKepler()
integ = vj.VPRK.gauss(2)
q0, v0 = jnp.array([0.5, 0.0]), jnp.array([0.0, 3.0 ** 0.5])
dt, n = 0.01, 20000
""",
    "VPRK.gauss(2), double pendulum (velocity form; control)": """
system = vj.systems.DoublePendulum()
integ = vj.VPRK.gauss(2)
q0, v0 = jnp.array([1.0, 0.5]), jnp.array([0.0, 0.0])
dt, n = 0.01, 20000
""",
    "HolonomicVPRK.rattle(), Cartesian pendulum": """
system = vj.systems.CartesianPendulum()
integ = vj.HolonomicVPRK.rattle()
q0, v0 = jnp.array([1.0, 0.0]), jnp.array([0.0, 0.5])
dt, n = 0.01, 20000
""",
    "HolonomicVPRK.lobatto(3), Cartesian pendulum": """
system = vj.systems.CartesianPendulum()
integ = vj.HolonomicVPRK.lobatto(3)
q0, v0 = jnp.array([1.0, 0.0]), jnp.array([0.0, 0.5])
dt, n = 0.01, 10000
""",
    "NonholonomicVPRK.lobatto(3), nonholonomic particle": """
system = vj.systems.NonholonomicParticle()
integ = vj.NonholonomicVPRK.lobatto(3)
q0, v0 = system.initial_conditions()
dt, n = 0.01, 10000
""",
    "NonholonomicVPRK.lobatto(3, form='hamiltonian'), nonholonomic particle": """
system = vj.systems.NonholonomicParticle()
integ = vj.NonholonomicVPRK.lobatto(3, form="hamiltonian")
q0, v0 = system.initial_conditions()
dt, n = 0.01, 10000
""",
    "GroupVPRK.lobatto(3), heavy top (SO(3), exp)": """
system = vj.systems.HeavyTop(gravity=1.0)
integ = vj.GroupVPRK.lobatto(3)
q0, v0 = vj.lie.SO3().exp(jnp.array([0.5, 0.0, 0.0])), jnp.array([0.3, -0.2, 2.0])
dt, n = 0.01, 10000
""",
    "GroupVPRK.lobatto(3, Cayley), unicycle (SE(2), nonholonomic)": """
system = vj.systems.Unicycle()
integ = vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley())
q0, v0 = system.initial()
dt, n = 0.01, 10000
""",
}

CHILD = r"""
import json, sys, time
import jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import vijax as vj
case = json.loads(sys.argv[1])
ns = {"vj": vj, "jnp": jnp}
exec(case["code"], ns)
system, integ, q0, v0, dt, n = (ns[k] for k in ("system", "integ", "q0", "v0", "dt", "n"))
run = jax.jit(lambda q0, v0: vj.simulate(system, integ, q0=q0, v0=v0, dt=dt, n_steps=n,
                                         save_every=n))
t = time.perf_counter(); out = run(q0, v0); jax.block_until_ready(out); compile_s = time.perf_counter() - t
best = float("inf")
for _ in range(case["inner"]):
    t = time.perf_counter(); out = run(q0, v0); jax.block_until_ready(out)
    best = min(best, time.perf_counter() - t)
# the gradient program of a short run (20 steps): trace and lowering, then XLA's compilation
loss = lambda q0, v0: jnp.sum(vj.simulate(system, integ, q0=q0, v0=v0, dt=dt, n_steps=20).q[-1])
t = time.perf_counter(); lowered = jax.jit(jax.grad(loss, argnums=1)).lower(q0, v0)
grad_trace_s = time.perf_counter() - t
t = time.perf_counter(); lowered.compile(); grad_compile_s = time.perf_counter() - t
print(json.dumps({"us_per_step": 1e6 * best / n, "compile_s": compile_s,
                  "grad_trace_s": grad_trace_s, "grad_compile_s": grad_compile_s,
                  "iterations": float(jnp.sum(out.stats.iterations)) / n,
                  "vijax": vj.__file__}))
"""


def _child(tree: Path, code: str, inner: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps({"code": code, "inner": inner})],
                         cwd=tree, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child failed in {tree}:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if not res["vijax"].startswith(str(tree)):
        raise RuntimeError(f"child imported {res['vijax']}, not the tree {tree}")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=DEFAULT_BEFORE, help="git revision of the baseline")
    ap.add_argument("--repeats", type=int, default=3, help="subprocess pairs per case")
    ap.add_argument("--inner", type=int, default=3, help="timed calls per subprocess")
    ap.add_argument("--only", default="", help="substring filter on the case names")
    ap.add_argument("--out", default="prk_core.json", help="file name in benchmarks/results/")
    args = ap.parse_args(argv)
    sha = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "vijax"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.strip())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), sha], cwd=ROOT,
                       check=True)
        try:
            for name, code in CASES.items():
                if args.only not in name:
                    continue
                got = {"before": [], "after": []}
                for r in range(args.repeats):
                    order = (("before", base), ("after", ROOT))
                    for label, tree in (order if r % 2 == 0 else order[::-1]):
                        got[label].append(_child(tree, code, args.inner))
                b = min(x["us_per_step"] for x in got["before"])
                a = min(x["us_per_step"] for x in got["after"])
                row = {"case": name, "before_us": b, "after_us": a, "ratio": a / b,
                       "before_compile_s": min(x["compile_s"] for x in got["before"]),
                       "after_compile_s": min(x["compile_s"] for x in got["after"]),
                       "before_grad_trace_s": min(x["grad_trace_s"] for x in got["before"]),
                       "after_grad_trace_s": min(x["grad_trace_s"] for x in got["after"]),
                       "before_grad_compile_s": min(x["grad_compile_s"] for x in got["before"]),
                       "after_grad_compile_s": min(x["grad_compile_s"] for x in got["after"]),
                       "before_iterations": got["before"][0]["iterations"],
                       "after_iterations": got["after"][0]["iterations"]}
                rows.append(row)
                print(f"{name:72s} before {b:8.2f} us  after {a:8.2f} us  ratio {a / b:5.2f}"
                      f"  (compile {row['before_compile_s']:.1f} -> {row['after_compile_s']:.1f} s;"
                      f" gradient trace {row['before_grad_trace_s']:.1f} -> "
                      f"{row['after_grad_trace_s']:.1f} s, compile {row['before_grad_compile_s']:.1f}"
                      f" -> {row['after_grad_compile_s']:.1f} s;"
                      f" iterations {row['before_iterations']} -> {row['after_iterations']})",
                      flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           check=False)
    RESULTS.mkdir(exist_ok=True)
    out = {"before": sha, "after": head + ("+working tree" if dirty else ""),
           "repeats": args.repeats, "inner": args.inner, "date": time.strftime("%Y-%m-%d"),
           "rows": rows}
    (RESULTS / args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
