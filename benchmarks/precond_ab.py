"""Before/after check of the stage solver's preconditioner on ensembles (GPU or CPU).

Runs ``vj.simulate_ensemble`` on 16384 members for 200 steps and prints trajectory-steps per
second (best of five calls after a compiling one) and fixed-point updates per step, for the
heavy top on SO(3) (``GroupVPRK.gauss(2)``, Cayley and Exp, h = 0.05), the R^3 particle in a
magnetic field (``VPRK.gauss(2)``, the diagnostic of ``lie_groups.py`` part 2) and the unicycle
on SE(2) (nonholonomic, ``GroupVPRK.lobatto(3, Cayley)``, h = 0.1).  Run it once per tree,
alternating, with the tree's ``vijax`` first on the path:

    PYTHONPATH=<old tree> python benchmarks/precond_ab.py base
    PYTHONPATH=. python benchmarks/precond_ab.py new

Each run writes ``<label>_<time>.json`` to ``$OUT`` (default: the current folder);
``results/precond_gpu_h200.json`` collects two such rounds from an H200.
"""
import sys, time, json, os
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
import vijax as vj
label = sys.argv[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lie_groups as L
cfg = L.step_configs()
uni = vj.systems.Unicycle()
cfg["unicycle_l3cay"] = ("unicycle", uni, vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley()),
                         vj.systems.Unicycle.element(1.0, 0.2, 0.3), jnp.array([0.5, 0.0, 0.8]))
rows = {}
for key, h in [("so3_cay", 0.05), ("so3_exp", 0.05), ("r3_gyro", 0.05), ("unicycle_l3cay", 0.1)]:
    lab, system, integ, q0, v0 = cfg[key]
    for b in (16384,):
        n = 200
        dv = 0.05 * jax.random.normal(jax.random.PRNGKey(0), (b, v0.shape[0]))
        if key.startswith("unicycle"):
            dv = dv.at[:, 1].set(0.0)
        V0 = v0[None, :] + dv
        Q0 = jnp.broadcast_to(q0, (b,) + q0.shape)
        f = jax.jit(lambda Q, V: vj.simulate_ensemble(system, integ, q0=Q, v0=V, dt=h, n_steps=n, save_every=n, throw=False))
        t = time.perf_counter(); sol = jax.block_until_ready(f(Q0, V0)); first = time.perf_counter() - t
        ts = []
        for _ in range(5):
            t = time.perf_counter(); jax.block_until_ready(f(Q0, V0)); ts.append(time.perf_counter() - t)
        it = float(np.sum(sol.stats.iterations)) / n / b
        ok = bool(np.all(np.asarray(sol.stats.converged)))
        rows[f"{key}@{b}"] = dict(traj_steps_per_s=b * n / min(ts), median=b * n / float(np.median(ts)), it=it, first_call=first, converged=ok)
        print(label, key, b, f"{b*n/min(ts):.4g} traj-steps/s (median {b*n/np.median(ts):.4g}) it/step {it:.2f} first {first:.1f}s ok={ok}", flush=True)
out = os.environ.get("OUT", ".")
with open(f"{out}/{label}_{int(time.time())}.json", "w") as fh:
    json.dump(dict(device=str(jax.devices()[0]), vijax=vj.__file__, rows=rows), fh, indent=1)
