"""XLA:GPU options for vijax's ensembles: command buffers (CUDA graphs) over the loops.

An ensemble step is a ``lax.scan`` over steps with a ``while_loop`` (the stage solve) inside:
on XLA:GPU every loop iteration launches its kernels one by one and reads its predicate back
on the host, so a batch below a few thousand members is bound by launches, not by the lanes'
work.  XLA can record the kernels of a loop body, and the loop itself (its ``WHILE`` and
``CONDITIONAL`` command types: the predicate stays on the device), into a command buffer
that is launched as one CUDA graph.  This script compiles the same ensemble programs with
several option sets (``jax.jit(...).lower(...).compile(compiler_options=...)``), checks that
they agree, and times them alternating in one process.

    python benchmarks/gpu_options.py --out benchmarks/results --tag gpu_h200

The option sets that this jaxlib refuses are reported and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
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

# XLA's default command types (jax 0.10-0.11), and the same with the loops added
_DEFAULT_CMDS = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION"
_LOOPS = _DEFAULT_CMDS + ",WHILE,CONDITIONAL"
OPTION_SETS = {
    "default": {},
    "no_command_buffers": {"xla_gpu_enable_command_buffer": ""},
    "loops_min5": {"xla_gpu_enable_command_buffer": _LOOPS},
    "loops_min1": {"xla_gpu_enable_command_buffer": _LOOPS, "xla_gpu_graph_min_graph_size": 1},
    "loops_min2": {"xla_gpu_enable_command_buffer": _LOOPS, "xla_gpu_graph_min_graph_size": 2},
    "loops_min1_unrolled": {"xla_gpu_enable_command_buffer": _LOOPS,
                            "xla_gpu_graph_min_graph_size": 1,
                            "xla_gpu_command_buffer_unroll_loops": True},
    "vijax": None,   # vj.compiler_options("gpu"): what vijax's direct calls use
}


def log(msg):
    print(msg, flush=True)


def accepted(options) -> tuple[bool, str]:
    try:
        jax.jit(lambda x: x + 1).lower(jnp.zeros(1)).compile(compiler_options=options or None)
    except Exception as e:   # noqa: BLE001
        return False, str(e).splitlines()[0][:200]
    return True, ""


def problems():
    """``name -> (system, integrator, h, T, init(batch) -> (q0, v0))``: the ensembles of
    ``lane_compaction.py`` (double pendulum from rest, the chaotic system on its energy sheet)
    and Kepler orbits around ``ab_versions.py``'s."""
    import ab_versions
    import lane_compaction

    kepler, k_integ, k_h, (kq0, kv0) = ab_versions.case_data(vj, "kepler")

    def orbit(b):
        dv = 0.01 * jax.random.normal(jax.random.PRNGKey(1), (b, kv0.shape[0]))
        return jnp.broadcast_to(kq0, (b,) + kq0.shape), kv0[None, :] + dv

    shared = lane_compaction.problems()
    dp, ch = shared["double_pendulum_gauss6"], shared["chaotic_lobatto3"]
    return {
        "kepler_gauss2": (kepler, k_integ, k_h, 10.0, orbit),
        "double_pendulum_gauss6": (*dp[:3], 10.0, dp[3]),
        "chaotic_lobatto3": (*ch[:3], 20.0, ch[3]),
    }


def dopri8(T: float):
    """``(q0, v0) -> (ys, steps)``: the double-pendulum ensemble's Dopri8 (hand-written field,
    rtol = atol = 1e-10) of ``benchmarks/ensemble.py``, to be compiled here."""
    import ensemble

    call = ensemble.dopri8_run("hand-written", T, 1)

    def run(q0, v0):
        ys, steps, _ = call(q0, v0, 1e-10)
        return ys, steps

    return run


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1024,4096")
    ap.add_argument("--problems", default="kepler_gauss2,double_pendulum_gauss6,chaotic_lobatto3")
    ap.add_argument("--sets", default=",".join(OPTION_SETS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dopri8", action="store_true", help="also Dopri8 (rtol 1e-10) per set")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tag", default=None)
    args = ap.parse_args(argv)

    OPTION_SETS["vijax"] = vj.compiler_options()
    sets = {}
    for name in args.sets.split(","):
        ok, why = accepted(OPTION_SETS[name])
        log(f"option set {name}: {'accepted' if ok else 'refused: ' + why}")
        if ok:
            sets[name] = OPTION_SETS[name]
    rows = []
    probs = problems()
    for pname in args.problems.split(","):
        system, integ, h, T, init = probs[pname]
        n = int(round(T / h))
        for b in [int(x) for x in args.batches.split(",")]:
            q0, v0 = init(b)

            def run(q0, v0):
                sol = vj.simulate_ensemble(system, integ, q0=q0, v0=v0, dt=T / n, n_steps=n,
                                           save_every=n, throw=False)
                return sol.q[:, -1], sol.stats.iterations

            programs = {}
            for sname, opts in sets.items():
                t = time.perf_counter()
                exe = jax.jit(run).lower(q0, v0).compile(compiler_options=opts or None)
                compile_s = time.perf_counter() - t
                try:
                    q, it = jax.block_until_ready(exe(q0, v0))
                except Exception as e:   # noqa: BLE001 -- XLA's runtime refused the program
                    why = str(e).splitlines()[0][:300]
                    log(f"  {pname:24s} batch {b:6d} {sname:40s} FAILED: {why}")
                    rows.append(dict(problem=pname, batch=b, options=sname, failed=why))
                    continue
                programs[sname] = (exe, compile_s, np.asarray(q), float(np.mean(it)))
            if args.dopri8 and pname.startswith("double_pendulum"):
                for sname, opts in sets.items():
                    if sname not in programs:
                        continue
                    exe = jax.jit(dopri8(T)).lower(q0, v0).compile(compiler_options=opts or None)
                    ys, steps = jax.block_until_ready(exe(q0, v0))
                    programs["dopri8/" + sname] = (exe, 0.0, None, float(np.max(steps)))
            best = {k: np.inf for k in programs}
            for _ in range(args.repeats):
                for k, (exe, *_rest) in programs.items():
                    t = time.perf_counter()
                    jax.block_until_ready(exe(q0, v0))
                    best[k] = min(best[k], time.perf_counter() - t)
            ref = programs["default"][2] if "default" in programs else None
            if not programs:
                continue
            for k, (exe, compile_s, q, it) in programs.items():
                diff = (float(np.max(np.abs(q - ref))) if q is not None and ref is not None
                        else None)
                steps = n if not k.startswith("dopri8") else it
                row = dict(problem=pname, batch=b, options=k, wall=best[k],
                           compile_s=compile_s, loop_steps=steps,
                           traj_steps_per_s=b * steps / best[k],
                           traj_time_per_s=b * T / best[k], mean_iterations=it,
                           max_diff_vs_default=diff)
                rows.append(row)
                log(f"  {pname:24s} batch {b:6d} {k:40s} {best[k] * 1e3:9.2f} ms  "
                    f"{b * T / best[k]:10.4g} traj-time/s  compile {compile_s:5.1f} s  "
                    f"diff {diff}")
    res = dict(machine=dict(platform=platform.platform(), jax=jax.__version__,
                            devices=[f"{d.platform}:{d.device_kind}" for d in jax.devices()],
                            xla_flags=os.environ.get("XLA_FLAGS")),
               option_sets={k: OPTION_SETS[k] for k in sets}, rows=rows)
    if args.out:
        tag = args.tag or jax.default_backend()
        path = Path(args.out) / f"gpu_options_{tag}.json"
        path.write_text(json.dumps(res, indent=1))
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
