"""Ensembles whose members need different iteration counts: the stage solver's loop under
``jax.vmap`` with and without lane compaction (``vijax.solvers.lane_compacting_while``), in
one process, same inputs.

Without compaction every member of a batch runs as many stage-solver updates as the slowest
one; with it, the members still iterating once at most 1/8 of the batch is left are gathered
and finished in a batch of that size.  Reported per batch size: wall time of each variant
(best of ``--repeats`` after a compiling call), their ratio, the largest difference of the
final states (round-off: the compacted batch is a separately compiled kernel) and of the
per-member iteration counts.  The two compiled programs are called in alternation.

    python benchmarks/lane_compaction.py --out benchmarks/results            # CPU
    python benchmarks/lane_compaction.py --batches 4096,16384,65536,262144 --tag gpu_h200
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vijax as vj  # noqa: E402
import vijax.solvers as S  # noqa: E402


def problems():
    chaotic = vj.systems.ChaoticNonholonomic()
    pendulum = vj.systems.DoublePendulum()

    def sheet(b):
        return chaotic.sample_energy_sheet(jax.random.PRNGKey(2), b, energy=3.06)

    def rest(b):
        rng = np.random.default_rng(0)
        q0 = np.stack([rng.uniform(0.9, 1.1, b), rng.uniform(1.4, 1.6, b)], axis=1)
        return jnp.asarray(q0), jnp.zeros((b, 2))

    import lie_groups as L

    def group_members(entry, lock=None):
        """``(system, integrator, init)`` of a ``lie_groups.step_configs()`` entry: members
        around its initial state, the velocity component ``lock`` unperturbed."""
        _, system, integ, g0, xi0 = entry

        def init(b):
            dv = 0.05 * jax.random.normal(jax.random.PRNGKey(0), (b, xi0.shape[0]))
            if lock is not None:
                dv = dv.at[:, lock].set(0.0)     # keep the rolling constraint
            return jnp.broadcast_to(g0, (b,) + g0.shape), xi0[None, :] + dv

        return system, integ, init

    top = group_members(L.step_configs()["so3_cay"])
    uni = group_members(("unicycle", vj.systems.Unicycle(),
                         vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley()),
                         vj.systems.Unicycle.element(1.0, 0.2, 0.3), jnp.array([0.5, 0.0, 0.8])),
                        lock=1)
    return {
        "chaotic_lobatto3": (chaotic, vj.NonholonomicVPRK.lobatto(3), 0.2, sheet),
        "double_pendulum_gauss6": (pendulum, vj.VPRK.gauss(6), 0.035, rest),
        "heavy_top_gauss2_cayley": (top[0], top[1], 0.05, top[2]),
        "unicycle_lobatto3_cayley": (uni[0], uni[1], 0.1, uni[2]),
    }


def compiled(system, integ, h, T, q0, v0, compact: bool):
    """The ensemble run compiled with (or without) lane compaction, and its first result."""
    S._COMPACT_MIN = {"cpu": 1 if compact else 10**12, "gpu": 1 if compact else 10**12}
    jax.clear_caches()   # the switch is read when the step is traced
    n = int(round(T / h))

    @jax.jit
    def run(q0, v0):
        sol = vj.simulate_ensemble(system, integ, q0=q0, v0=v0, dt=T / n, n_steps=n,
                                   save_every=n, throw=False)
        return (jax.tree_util.tree_map(lambda x: x[:, -1], sol.q), sol.stats.iterations,
                sol.stats.converged)

    exe = run.lower(q0, v0).compile()
    q, it, ok = jax.block_until_ready(exe(q0, v0))
    return exe, (jax.tree_util.tree_map(np.asarray, q), np.asarray(it), np.asarray(ok)), n


def interleaved(exes, q0, v0, repeats: int):
    """Best wall time of each executable, called in alternation (the 2-core benchmark machine
    changes speed between calls: alternating exposes both to the same states)."""
    best = [np.inf] * len(exes)
    for _ in range(repeats):
        for i, exe in enumerate(exes):
            t = time.perf_counter()
            jax.block_until_ready(exe(q0, v0))
            best[i] = min(best[i], time.perf_counter() - t)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="16,64,256,1024,4096")
    ap.add_argument("--problems", default="chaotic_lobatto3,double_pendulum_gauss6,"
                                          "heavy_top_gauss2_cayley,unicycle_lobatto3_cayley")
    ap.add_argument("--T", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tag", default=None)
    args = ap.parse_args(argv)
    default_min = S._COMPACT_MIN
    rows = {}
    for name in args.problems.split(","):
        system, integ, h, init = problems()[name]
        rows[name] = {}
        for b in (int(x) for x in args.batches.split(",")):
            q0, v0 = init(b)
            plain, (q_p, it_p, ok_p), n = compiled(system, integ, h, args.T, q0, v0, False)
            comp, (q_c, it_c, ok_c), _ = compiled(system, integ, h, args.T, q0, v0, True)
            t_plain, t_comp = interleaved([plain, comp], q0, v0, args.repeats)
            dq = jax.tree_util.tree_map(lambda a, c: float(np.abs(a - c).max()), q_c, q_p)
            row = dict(plain_s=t_plain, compacted_s=t_comp, speedup=t_plain / t_comp,
                       n_steps=n, mean_updates=float(it_p.sum() / (b * n)),
                       max_dq=max(jax.tree_util.tree_leaves(dq)),
                       updates_changed=int(np.abs(it_c - it_p).sum()),
                       updates_total=int(it_p.sum()),
                       converged=bool(ok_p.all() and ok_c.all()))
            rows[name][b] = row
            print(f"{name:24s} batch {b:7d}: plain {t_plain * 1e3:9.1f} ms  compacted "
                  f"{t_comp * 1e3:9.1f} ms  x{row['speedup']:.2f}  max|dq| {row['max_dq']:.1e}  "
                  f"updates {row['mean_updates']:.2f}/step, changed {row['updates_changed']} "
                  f"of {row['updates_total']}", flush=True)
    S._COMPACT_MIN = default_min
    res = dict(machine=dict(platform=platform.platform(), jax=jax.__version__,
                            devices=[f"{d.platform}:{d.device_kind}" for d in jax.devices()]),
               command=" ".join(["python", "benchmarks/lane_compaction.py", *sys.argv[1:]]),
               T=args.T, share=S._COMPACT_SHARE, results=rows)
    if args.out:
        tag = args.tag or jax.devices()[0].platform
        path = Path(args.out) / f"lane_compaction_{tag}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
