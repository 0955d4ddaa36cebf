"""Peer benchmarks: vijax VPRK against diffrax and scipy, side by side in one process.

    python benchmarks/run.py                 # full run (~15 min on 2 CPU cores)
    python benchmarks/run.py --quick         # smoke test (< 2 min)
    python benchmarks/run.py --parts b,c     # a subset of the parts

Parts (see benchmarks/README.md):
  a  work-precision: global error at T vs wall time (step-size / tolerance sweeps)
  b  max |Delta E| over T = 1e4 at equal wall time (ratio peer / vijax)
  c  wall time per step of implicit methods and of fixed-step Tsit5; iterations per step
  d  ensemble throughput: 1024 trajectories under jax.vmap, at equal accuracy
  e  jit compile time of vijax.simulate per preset and of the diffrax solvers

Fairness rules, applied everywhere: float64; every solver integrates the same autodiff
Euler-Lagrange equations (``benchmarks/_problems.py``); every JAX solver runs inside a
``jax.jit`` wrapper (so each call is one compiled executable plus one dispatch); the first
call (compilation) is excluded and the median of several ``jax.block_until_ready`` runs is
reported.  Results: ``benchmarks/results/*.json`` and ``*.png``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def _early_xla_flags(argv) -> int | None:
    """``--xla-small-loop-threshold BYTES`` must reach XLA_FLAGS before JAX starts its CPU
    backend, so it is read here, ahead of ``import jax`` (argparse validates it later)."""
    for i, a in enumerate(argv):
        if a.startswith("--xla-small-loop-threshold"):
            val = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                thr = int(val)
            except ValueError:
                return None
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_extra_"
                                       f"options=xla_cpu_small_while_loop_byte_threshold={thr}"
                                       ).strip()
            return thr
    return None


# (read whichever benchmark script runs: lie_groups.py takes the flag too and imports this
# module before JAX starts)
XLA_SMALL_LOOP_THRESHOLD = _early_xla_flags(sys.argv[1:])

import jax

jax.config.update("jax_enable_x64", True)

import diffrax as dfx
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import scipy
from scipy.integrate import solve_ivp

import vijax as vj

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _problems as P

RESULTS = Path(__file__).resolve().parent / "results"
TAG = ""                # file-name suffix of this configuration (--quick, sensitivity flags)
PEER_RHS = "autodiff"   # --peer-rhs: how the peers' vector field is built (see _problems.py)
ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

FULL = dict(
    repeats=3,
    a=dict(
        repeats=5,   # runs are short here: more repeats against load from other processes
        problems=["kepler", "double_pendulum"],
        n_steps={  # step counts over [0, T]  (Kepler T = 100, double pendulum T = 20)
            "kepler": {"gauss2": [1000, 2000, 4000, 8000, 16000, 32000],
                       "gauss3": [500, 1000, 2000, 4000, 8000, 16000],
                       "gauss4": [500, 1000, 2000, 4000, 8000],
                       "lobatto3": [1000, 2000, 4000, 8000, 16000, 32000]},
            "double_pendulum": {"gauss2": [500, 1000, 2000, 4000, 8000, 16000],
                                "gauss3": [250, 500, 1000, 2000, 4000, 8000],
                                "gauss4": [250, 500, 1000, 2000, 4000],
                                "lobatto3": [500, 1000, 2000, 4000, 8000, 16000]},
        },
        tols={"tsit5": [10.0 ** -k for k in range(3, 14)],
              "dopri8": [10.0 ** -k for k in range(3, 14)],
              "kvaerno5": [10.0 ** -k for k in range(3, 11)],
              "scipy_dop853": [10.0 ** -k for k in range(3, 14)]},
        max_point_seconds=8.0,   # stop a tolerance sweep once one run exceeds this
    ),
    b=dict(
        problems=["kepler", "double_pendulum"],
        t_final=1.0e4, n_save=1000,
        h={"kepler": {"gauss2": [0.05, 0.01], "gauss3": [0.05, 0.02], "gauss4": 0.1,
                      "lobatto3": [0.05, 0.01]},
           "double_pendulum": {"gauss2": 0.01, "gauss3": 0.02, "gauss4": 0.02,
                               "lobatto3": 0.01}},
        tols=[10.0 ** (-k / 2) for k in range(4, 27)],   # 1e-2 ... 1e-13, half decades
        start_tol=1e-6,  # the sweep starts here and brackets the vijax wall times
        overshoot=1.3,   # tighten until a run takes > overshoot x the largest vijax time
        time_budget=3.0,  # runs longer than this are timed once (after compilation)
    ),
    c=dict(n_steps=100_000, save_every=10_000, h=0.01, repeats=5, kvaerno_root_tol=1e-6,
           kvaerno_n_steps=20_000),
    d=dict(n_traj=1024, t_final=20.0, h={"gauss2": 0.01, "gauss3": 0.04, "gauss4": 0.1}, repeats=5,
           tols=[10.0 ** (-k / 2) for k in range(8, 27)]),
    e=dict(n_steps=1000),
)

QUICK = dict(
    repeats=2,
    a=dict(
        problems=["kepler"],
        n_steps={"kepler": {"gauss2": [1000, 4000], "gauss3": [1000], "lobatto3": [2000]}},
        tols={"tsit5": [1e-4, 1e-7, 1e-10], "dopri8": [1e-5, 1e-9],
              "kvaerno5": [1e-4, 1e-6], "scipy_dop853": [1e-5, 1e-9]},
        max_point_seconds=2.0,
    ),
    b=dict(
        problems=["kepler"], t_final=500.0, n_save=100,
        h={"kepler": {"gauss2": 0.05, "gauss3": 0.1}},
        tols=[10.0 ** -k for k in range(2, 11)], overshoot=1.5, start_tol=1e-5,
        time_budget=1.0,
    ),
    c=dict(n_steps=10_000, save_every=1000, h=0.01, repeats=3, kvaerno_root_tol=1e-6,
           kvaerno_n_steps=2000,
           presets=["gauss2", "gauss3"], solvers=["fixedpoint"]),
    d=dict(n_traj=64, t_final=6.0, h={"gauss2": 0.02}, tols=[10.0 ** -k for k in range(4, 11)]),
    e=dict(n_steps=1000, presets=["gauss2"], peers=["tsit5"]),
)

PRESETS = {
    "gauss2": ("vijax Gauss-2", lambda **kw: vj.VPRK.gauss(2, **kw)),
    "gauss3": ("vijax Gauss-3", lambda **kw: vj.VPRK.gauss(3, **kw)),
    "lobatto3": ("vijax Lobatto-3", lambda **kw: vj.VPRK.lobatto(3, **kw)),
    "gauss4": ("vijax Gauss-4", lambda **kw: vj.VPRK.gauss(4, **kw)),
}
SOLVERS = {"fixedpoint": lambda: vj.solvers.FixedPoint(), "newton": lambda: vj.solvers.Newton()}

PEERS = {
    "tsit5": ("diffrax Tsit5", dfx.Tsit5),
    "dopri8": ("diffrax Dopri8", dfx.Dopri8),
    "kvaerno5": ("diffrax Kvaerno5", dfx.Kvaerno5),
    "scipy_dop853": ("scipy DOP853", None),
}

STYLE = {
    "gauss2": dict(color="C0", marker="o"), "gauss3": dict(color="C1", marker="s"),
    "lobatto3": dict(color="C2", marker="^"), "gauss4": dict(color="C6", marker="*"),
    "tsit5": dict(color="C3", marker="v", ls="--"),
    "dopri8": dict(color="C4", marker="D", ls="--"), "kvaerno5": dict(color="C5", marker="P",
                                                                      ls="--"),
    "scipy_dop853": dict(color="C7", marker="x", ls=":"),
}


def label(key: str) -> str:
    if "@" in key:                       # e.g. "gauss2@h=0.05": a preset at one step size
        base, extra = key.split("@", 1)
        return f"{label(base)} ({extra})"
    return (PRESETS.get(key) or PEERS.get(key) or (key,))[0]


def style(key: str) -> dict:
    return STYLE[key.split("@", 1)[0]]


def problem(name: str) -> P.Problem:
    return {"kepler": P.kepler, "double_pendulum": P.double_pendulum}[name]()


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(msg, flush=True)


def _once(fn, *args):
    c0, t0 = time.process_time(), time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0, time.process_time() - c0


def _stats(wall, cpu):
    return dict(wall=wall, cpu=cpu, wall_min=float(np.min(wall)),
                cpu_median=float(np.median(cpu)))


def timed(fn, *args, repeats: int = 3, warm: bool = True, budget: float | None = None,
          min_repeats: int = 1):
    """Median wall time of ``fn(*args)`` over ``repeats`` blocked calls.

    ``warm``: make one untimed call first (compilation and first-call effects excluded).
    ``budget``: stop repeating once the timed calls have used this many seconds (at least
    ``min_repeats`` timed calls are always made).  Returns ``(output, median_wall, times, first_call)``;
    ``times`` holds every wall and process-CPU time (the CPU time of this process is immune
    to other processes competing for the cores; see README).
    """
    first = None
    if warm == "aot":
        # compile ahead of time instead of a full warm-up run (long runs)
        t0 = time.perf_counter()
        fn = fn.lower(*args).compile()
        first = time.perf_counter() - t0
    elif warm:
        _, first, _ = _once(fn, *args)
    wall, cpu, out = [], [], None
    for i in range(repeats):
        out, w, c = _once(fn, *args)
        wall.append(w)
        cpu.append(c)
        if budget is not None and i + 1 >= min_repeats and sum(wall) > budget:
            break
    return out, float(np.median(wall)), _stats(wall, cpu), first


# --------------------------------------------------------------------------------------------
# Runners: one compiled executable per configuration, all inside jax.jit
# --------------------------------------------------------------------------------------------


def vijax_runner(system, integ, n_steps: int, save_every: int):
    """jit(q0, v0, dt) -> (t, q, v, mean iterations, all converged), compiled with
    :func:`_problems.vijax_options`."""

    @functools.partial(jax.jit, compiler_options=P.vijax_options() or None)
    def run(q0, v0, dt):
        # throw=False: step-size sweeps run into non-convergence on purpose and record it
        sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=dt, n_steps=n_steps,
                          save_every=save_every, throw=False)
        return sol.t, sol.q, sol.v, sol.mean_iterations, sol.stats.all_converged

    return run


def peer_solver(key: str, root_tol: float | None = None):
    cls = PEERS[key][1]
    if key == "kvaerno5" and root_tol is not None:
        return cls(root_finder=dfx.VeryChord(rtol=root_tol, atol=root_tol, norm=optx.max_norm))
    return cls()


def diffrax_runner(vf, solver, t1: float, *, saveat_ts=None, adaptive=True,
                   max_steps=4_000_000, step_ts=False):
    """jit(y0, tol, dt) -> (ys, num_steps, num_accepted, success).

    adaptive: ``PIDController(rtol=tol, atol=tol)`` (dt0 chosen by diffrax); otherwise
    ``ConstantStepSize`` with step ``dt``.  ``saveat_ts``: save at these times (with
    ``step_ts`` the controller also steps onto them, so saved values are step values, not
    dense-output interpolants); default: the final state only.
    """
    term = dfx.ODETerm(vf)
    if saveat_ts is None:
        saveat = dfx.SaveAt(t1=True)
    else:
        saveat = dfx.SaveAt(ts=jnp.asarray(saveat_ts))

    @jax.jit
    def run(y0, tol, dt):
        if adaptive:
            ctrl = dfx.PIDController(rtol=tol, atol=tol,
                                     step_ts=jnp.asarray(saveat_ts) if step_ts else None)
            dt0 = None
        else:
            ctrl = dfx.ConstantStepSize()
            dt0 = dt
        sol = dfx.diffeqsolve(term, solver, 0.0, t1, dt0, y0, saveat=saveat,
                              stepsize_controller=ctrl, max_steps=max_steps, throw=False)
        return (sol.ys, sol.stats["num_steps"], sol.stats["num_accepted_steps"],
                sol.result == dfx.RESULTS.successful)

    return run


def scipy_runner(pb: P.Problem, t1: float):
    """scipy solve_ivp(DOP853) on the same autodiff rhs, jit-compiled and called from numpy."""
    f = jax.jit(P.first_order_rhs(pb.system, PEER_RHS))
    y0 = np.asarray(pb.y0)
    f(y0).block_until_ready()

    def fun(t, y):
        return np.asarray(f(y))

    def run(tol):
        out = solve_ivp(fun, (0.0, t1), y0, method="DOP853", rtol=tol, atol=tol)
        return out.y[:, -1], out.nfev, out.success

    return run


def state_error(q, v, q_ref, v_ref) -> float:
    return float(max(np.max(np.abs(np.asarray(q) - q_ref)), np.max(np.abs(np.asarray(v) - v_ref))))


# --------------------------------------------------------------------------------------------
# Part a: work-precision
# --------------------------------------------------------------------------------------------


def pareto(times, errors):
    """``[(time, error), ...]`` by increasing time, each run more accurate than every cheaper
    one (finite, positive errors only)."""
    pts = sorted((t, e) for t, e in zip(times, errors) if np.isfinite(e) and e > 0)
    front, best = [], np.inf
    for t, e in pts:
        if e < best:
            front.append((t, e))
            best = e
    return front


def error_at_time(times, errors, t, floor=None):
    """Error of a method's Pareto front at run time ``t`` (log-log interpolation).  None if
    its cheapest run is slower than ``t``, or if ``t`` is beyond its slowest run and that run
    is not yet at the round-off ``floor`` (then its best error stands for any longer time)."""
    front = pareto(times, errors)
    if not front or t < front[0][0] * (1 - 1e-9):
        return None
    if len(front) == 1 and t <= front[0][0] * (1 + 1e-9):
        return front[0][1]
    for i in range(1, len(front)):
        (t0, e0), (t1, e1) = front[i - 1], front[i]
        if t <= t1:
            w = (math.log(t) - math.log(t0)) / (math.log(t1) - math.log(t0))
            return math.exp(math.log(e0) + w * (math.log(e1) - math.log(e0)))
    if floor is None or front[-1][1] <= floor:
        return front[-1][1]
    return None


def time_at_error(times, errors, target):
    """Wall time at which a method's Pareto front first reaches ``errors <= target``
    (log-log interpolation between Pareto points); ``None`` if never reached."""
    front = pareto(times, errors)
    for i, (t, e) in enumerate(front):
        if e <= target:
            if i == 0:
                return t
            t0, e0 = front[i - 1]
            w = (math.log(target) - math.log(e0)) / (math.log(e) - math.log(e0))
            return math.exp(math.log(t0) + w * (math.log(t) - math.log(t0)))
    return None


def part_a(cfg, repeats, ref_cache):
    out = {}
    for name in cfg["problems"]:
        pb = problem(name)
        T = pb.t_wp
        q_ref, v_ref, ref_unc, ref_how = pb.reference(T, ref_cache)
        log(f"\n[a] work-precision: {pb.label}, T = {T:g}; reference: {ref_how} "
            f"(uncertainty {ref_unc:.1e})")
        res = {"problem": pb.label, "T": T, "reference": ref_how,
               "reference_uncertainty": ref_unc, "note": pb.note, "methods": {}}
        for key, ns in cfg["n_steps"][name].items():
            integ = PRESETS[key][1]()
            rows = []
            for n in ns:
                run = vijax_runner(pb.system, integ, n, n)
                dt = T / n
                (t, q, v, it, ok), med, times, first = timed(run, pb.q0, pb.v0, dt,
                                                             repeats=repeats, budget=5.0)
                err = state_error(q[-1], v[-1], q_ref, v_ref)
                rows.append(dict(n_steps=n, h=dt, time=med, times=times, error=err,
                                 mean_iterations=float(it), converged=bool(ok)))
                log(f"  {label(key):18s} h={dt:<9.3g} err={err:9.2e} time={med * 1e3:9.2f} ms "
                    f"it/step={float(it):.2f}")
            res["methods"][key] = dict(kind="fixed step", points=rows)
        vf = pb.vector_field(PEER_RHS)
        for key, tols in cfg["tols"].items():
            rows = []
            if key == "scipy_dop853":
                run = scipy_runner(pb, T)
                for tol in tols:
                    (y, nfev, ok), med, times, _ = timed(run, tol, repeats=repeats, warm=False,
                                                         budget=3.0)
                    err = state_error(y[:pb.ndim], y[pb.ndim:], q_ref, v_ref)
                    rows.append(dict(tol=tol, time=med, times=times, error=err, nfev=int(nfev),
                                     success=bool(ok)))
                    log(f"  {label(key):18s} tol={tol:<8.0e} err={err:9.2e} "
                        f"time={med * 1e3:9.2f} ms nfev={nfev}")
                    if med > cfg["max_point_seconds"]:
                        break
            else:
                run = diffrax_runner(vf, peer_solver(key), T, max_steps=500_000)
                for i, tol in enumerate(tols):
                    (ys, nsteps, nacc, ok), med, times, _ = timed(
                        run, pb.y0, tol, 0.0, repeats=repeats, warm=(i == 0), budget=3.0)
                    y = np.asarray(ys[-1])
                    err = state_error(y[:pb.ndim], y[pb.ndim:], q_ref, v_ref) if bool(ok) \
                        else float("nan")
                    rows.append(dict(tol=tol, time=med, times=times, error=err,
                                     num_steps=int(nsteps), num_accepted=int(nacc),
                                     success=bool(ok)))
                    log(f"  {label(key):18s} tol={tol:<8.0e} err={err:9.2e} "
                        f"time={med * 1e3:9.2f} ms steps={int(nsteps)}"
                        + ("" if bool(ok) else "  FAILED (diffrax result != successful)"))
                    if bool(ok) and med > cfg["max_point_seconds"]:
                        break
            res["methods"][key] = dict(kind="adaptive, rtol = atol = tol", points=rows)
        # Speed ratios at fixed error targets.
        floor = max(ref_unc * 10, 1e-12)
        targets = [t for t in (1e-4, 1e-6, 1e-8, 1e-10) if t >= floor]
        summary = {}
        for target in targets:
            tt = {}
            for key, m in res["methods"].items():
                pts = [p for p in m["points"] if p.get("success", True) and
                       p.get("converged", True)]
                tt[key] = time_at_error([p["time"] for p in pts], [p["error"] for p in pts],
                                        target)
            vij = {k: v for k, v in tt.items() if k in PRESETS and v is not None}
            best = min(vij, key=vij.get) if vij else None
            summary[f"{target:.0e}"] = dict(
                times=tt, best_vijax=best,
                ratio_peer_over_best_vijax={k: (tt[k] / vij[best] if best and tt[k] else None)
                                            for k in PEERS if k in tt})
        res["at_error"] = summary
        out[name] = res
        plot_work_precision(res, RESULTS / f"work_precision_{name}{TAG}.png")
    return out


def plot_work_precision(res, path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for key, m in res["methods"].items():
        pts = [p for p in m["points"] if np.isfinite(p["error"]) and p.get("success", True)]
        if not pts:
            continue
        ax.loglog([p["time"] for p in pts], [max(p["error"], 1e-16) for p in pts],
                  label=label(key), **style(key))
    if res["reference_uncertainty"] > 0:
        ax.axhline(res["reference_uncertainty"], color="k", lw=0.8, ls=":",
                   label="reference uncertainty")
    ax.set_xlabel("wall time [s] (median, compile excluded)")
    ax.set_ylabel(f"max-norm error of (q, v) at T = {res['T']:g}")
    ax.set_title(f"Work-precision: {res['problem']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Part b: energy error at equal wall time
# --------------------------------------------------------------------------------------------


def part_b(cfg, repeats):
    out = {}
    T, n_save = cfg["t_final"], cfg["n_save"]
    ts = np.linspace(0.0, T, n_save + 1)
    for name in cfg["problems"]:
        pb = problem(name)
        log(f"\n[b] energy error at equal wall time: {pb.label}, T = {T:g}, {n_save} saves")
        res = {"problem": pb.label, "T": T, "n_save": n_save, "vijax": {}, "peers": {},
               "ratios": {}}
        entries = [(key if not isinstance(hs, (list, tuple)) else f"{key}@h={h:g}", key, h)
                   for key, hs in cfg["h"][name].items()
                   for h in (hs if isinstance(hs, (list, tuple)) else [hs])]
        for vkey, key, h in entries:
            n = int(round(T / h))
            n -= n % n_save
            run = vijax_runner(pb.system, PRESETS[key][1](), n, n // n_save)
            (t, q, v, it, ok), med, times, _ = timed(run, pb.q0, pb.v0, T / n, repeats=repeats,
                                                     warm="aot", budget=cfg["time_budget"])
            de = pb.energy(q, v)
            de = de - de[0]
            res["vijax"][vkey] = dict(h=T / n, n_steps=n, time=med, times=times,
                                      max_abs_dE=float(np.max(np.abs(de))),
                                      mean_iterations=float(it), converged=bool(ok),
                                      t=np.asarray(t).tolist(), dE=de.tolist())
            log(f"  {label(key):18s} h={T / n:<7.3g} max|dE|={np.max(np.abs(de)):9.2e} "
                f"time={med:7.3f} s it/step={float(it):.2f}")
        budget = max(r["time"] for r in res["vijax"].values())
        budget_min = min(r["time"] for r in res["vijax"].values())
        # A too-loose tolerance can wreck the orbit (a Kepler orbit driven into the 1/r
        # singularity, where the step size collapses): cap the steps (3x the smallest vijax
        # step count; a peer step costs more than a vijax step here) so that such a run
        # stops early; it is recorded as failed.
        max_steps = max(100_000, 3 * min(r["n_steps"] for r in res["vijax"].values()))
        res["peer_max_steps"] = max_steps
        vf = pb.vector_field(PEER_RHS)
        tols = sorted(cfg["tols"], reverse=True)            # loose -> tight
        for key in ("tsit5", "dopri8"):
            # compiled once, ahead of time; every tolerance reuses the executable
            run = diffrax_runner(vf, peer_solver(key), T, saveat_ts=ts, step_ts=True,
                                 max_steps=max_steps).lower(pb.y0, 1e-6, 0.0).compile()
            rows = {}

            def evaluate(i):
                tol = tols[i]
                (ys, nsteps, nacc, ok), med, times, _ = timed(
                    run, pb.y0, tol, 0.0, repeats=repeats, warm=False, budget=cfg["time_budget"])
                ys = np.asarray(ys)
                de = pb.energy(ys[:, :pb.ndim], ys[:, pb.ndim:])
                de = de - de[0]
                mx = float(np.max(np.abs(de))) if bool(ok) else float("nan")
                rows[i] = dict(tol=tol, time=med, times=times, max_abs_dE=mx,
                               num_steps=int(nsteps), success=bool(ok), dE=de.tolist())
                log(f"  {label(key):18s} tol={tol:<8.1e} max|dE|={mx:9.2e} time={med:7.3f} s "
                    f"steps={int(nsteps)}" + ("" if bool(ok) else "  FAILED (max_steps)"))
                return rows[i]

            # Bracket the budgets: start at tol = start_tol, tighten while the runs fit the
            # largest budget (stop after the first run beyond overshoot x budget), loosen
            # while they exceed the smallest budget (stop at the first failure: looser
            # tolerances then wreck the orbit too).
            start = int(np.argmin(np.abs(np.log(tols) - np.log(cfg["start_tol"]))))
            r = evaluate(start)
            i = start
            while i + 1 < len(tols) and r["success"] and r["time"] <= cfg["overshoot"] * budget:
                i += 1
                r = evaluate(i)
            i = start
            r = rows[start]
            while i > 0 and (not r["success"] or r["time"] > budget_min):
                if not r["success"] and i < start:
                    break
                i -= 1
                r = evaluate(i)
            res["peers"][key] = [rows[k] for k in sorted(rows)]
        for vkey, vr in res["vijax"].items():
            for pkey, rows in res["peers"].items():
                ok_rows = [r for r in rows if r["success"] and r["time"] <= vr["time"]]
                if ok_rows:
                    best = min(ok_rows, key=lambda r: r["max_abs_dE"])
                    ratio = best["max_abs_dE"] / vr["max_abs_dE"]
                    res["ratios"][f"{pkey}/{vkey}"] = dict(
                        ratio=ratio, peer_tol=best["tol"], peer_time=best["time"],
                        peer_max_abs_dE=best["max_abs_dE"], vijax_time=vr["time"],
                        vijax_max_abs_dE=vr["max_abs_dE"])
                else:
                    cheapest = min(rows, key=lambda r: r["time"])
                    res["ratios"][f"{pkey}/{vkey}"] = dict(
                        ratio=float("inf"), peer_tol=None, vijax_time=vr["time"],
                        vijax_max_abs_dE=vr["max_abs_dE"],
                        note=f"no {pkey} run fits the budget; cheapest took "
                             f"{cheapest['time']:.3g} s (tol {cheapest['tol']:.1e})")
        out[name] = res
        plot_energy(res, ts, RESULTS / f"energy_{name}{TAG}.png")
    return out


def command_line(script, argv=None):
    """The command that produced a result, for the JSON and the summary."""
    return f"python benchmarks/{script} " + " ".join(argv if argv is not None else sys.argv[1:])


def write_summary(lines, path, t_start=None, command=None):
    """Print the summary and write it to ``path``; a full run adds its wall time and
    command, a ``--summary-only`` rebuild says so."""
    if t_start is None:
        lines = lines + ["(summary rebuilt from the JSON files; each part's command and "
                         "machine state are in its JSON)"]
    else:
        lines = lines + [f"total wall time {time.perf_counter() - t_start:.1f} s; command: "
                         f"{command}"]
    text = "\n".join(lines)
    print(text)
    path.write_text(text + "\n")


def panel_grid(n, width, height):
    """A figure of ``n`` panels, three per row, sharing the y axis; unused cells hidden."""
    import matplotlib.pyplot as plt

    ncol = min(3, n)
    nrow = -(-n // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(width * ncol, height * nrow), squeeze=False,
                             sharey=True)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def plot_energy(res, ts, path):
    import matplotlib.pyplot as plt

    keys = list(res["vijax"])
    fig, axes = panel_grid(len(keys), 5, 3.8)
    for ax, vkey in zip(axes.flat, keys):
        vr = res["vijax"][vkey]
        ax.semilogy(vr["t"][1:], np.abs(vr["dE"][1:]) + 1e-18,
                    label=f"{label(vkey.split('@', 1)[0])} "
                    f"(h={vr['h']:.3g}, {vr['time']:.2f} s)", color=style(vkey)["color"])
        for pkey, rows in res["peers"].items():
            r = res["ratios"].get(f"{pkey}/{vkey}", {})
            extra = ""
            if r.get("peer_tol") is not None:
                row = next(x for x in rows if x["tol"] == r["peer_tol"])
            else:   # nothing fits the budget: show the cheapest successful run
                ok = [x for x in rows if x["success"]]
                if not ok:
                    continue
                row, extra = min(ok, key=lambda x: x["time"]), ", OVER budget"
            ax.semilogy(ts[1:], np.abs(row["dE"][1:]) + 1e-18, color=style(pkey)["color"],
                        ls="--", label=f"{label(pkey)} (tol={row['tol']:.0e}, "
                                       f"{row['time']:.2f} s{extra})")
        ax.set_title(f"equal cost as {label(vkey)}", fontsize=10)
        ax.set_xlabel("t")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for row_axes in axes:
        row_axes[0].set_ylabel("|E(t) - E(0)|")
    fig.suptitle(f"Energy error at equal wall time: {res['problem']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Part c: per-step cost
# --------------------------------------------------------------------------------------------


def part_c(cfg, repeats_default):
    """Per-step cost.  Every configuration is compiled and warmed first; the timed runs are
    then interleaved round-robin (``repeats`` rounds) so that load from other processes
    falls on all configurations alike; the median per configuration is reported."""
    n, se, h, reps = cfg["n_steps"], cfg["save_every"], cfg["h"], cfg["repeats"]
    nk = cfg.get("kvaerno_n_steps", n)
    presets = cfg.get("presets", list(PRESETS))
    solvers = cfg.get("solvers", list(SOLVERS))
    kep = P.kepler()
    systems = {"Kepler": kep.system, "GeneralKepler": vj.systems.GeneralKepler()}
    log(f"\n[c] per-step cost: Kepler e = 0.5, h = {h}, {n} steps ({nk} for Kvaerno5), "
        f"save every {se}; {reps} interleaved rounds")
    entries = {}   # key -> (fn, args, row, n_steps)
    for sname, system in systems.items():
        for key in presets:
            for solver in solvers:
                integ = PRESETS[key][1](solver=SOLVERS[solver]())
                entries[f"{key}/{solver}/{sname}"] = (
                    vijax_runner(system, integ, n, se), (kep.q0, kep.v0, h),
                    dict(method=label(key), solver=solver, system=sname), n)
        for key in ("tsit5", "dopri8", "kvaerno5"):
            steps = nk if key == "kvaerno5" else n
            ts = np.linspace(0.0, steps * h, steps // se + 1)
            solver = peer_solver(key, root_tol=cfg["kvaerno_root_tol"])
            # what a vijax user would derive by autodiff, and what a user who picks diffrax
            # instead writes by hand (a = -q/|q|^3: the same ODE for both declarations)
            vfs = {"autodiff EL rhs": P.vector_field(system, "autodiff"),
                   "autodiff EL rhs, no LAPACK": P.vector_field(system, "autodiff-nolapack"),
                   "hand-written rhs": P.vector_field(system, "hand-written")}
            for vname, vf in vfs.items():
                row = dict(method=label(key), solver="constant step", system=sname, rhs=vname)
                if key == "kvaerno5":
                    row["root_finder"] = (f"VeryChord(rtol=atol={cfg['kvaerno_root_tol']}, "
                                          f"max_norm), root_find_max_steps=10")
                entries[f"{key}/{vname}/{sname}"] = (
                    diffrax_runner(vf, solver, steps * h, saveat_ts=ts, adaptive=False,
                                   max_steps=steps + 10), (kep.y0, 0.0, h), row, steps)
    outs, wall, cpu = {}, {k: [] for k in entries}, {k: [] for k in entries}
    for k, (fn, args, _, _) in entries.items():   # compile + warm-up
        outs[k], first, _ = _once(fn, *args)
        entries[k][2]["first_call_s"] = first
    for _ in range(reps):
        for k, (fn, args, _, _) in entries.items():
            _, w, c = _once(fn, *args)
            wall[k].append(w)
            cpu[k].append(c)
    rows = {}
    for k, (fn, args, row, steps) in entries.items():
        out = outs[k]
        med = float(np.median(wall[k]))
        row = dict(row, time=med, times=_stats(wall[k], cpu[k]))
        if row["method"].startswith("vijax"):
            _, _, _, it, ok = out
            row.update(n_steps=steps, mean_iterations=float(it), converged=bool(ok))
        else:
            _, nsteps, _, ok = out
            steps = int(nsteps)
            row.update(n_steps=steps, success=bool(ok))
        row["us_per_step"] = med / steps * 1e6
        row["us_per_step_cpu"] = float(np.median(cpu[k])) / steps * 1e6
        rows[k] = row
        extra = (f"it/step={row['mean_iterations']:.2f}" if "mean_iterations" in row
                 else f"success={row['success']}")
        log(f"  {k:46s} {row['us_per_step']:8.3f} us/step (cpu {row['us_per_step_cpu']:7.3f})"
            f"  {extra}")
    ratios = {}

    def ratio(a, b, target, what):
        if a in rows and b in rows:
            r = rows[a]["us_per_step"] / rows[b]["us_per_step"]
            rc = rows[a]["us_per_step_cpu"] / rows[b]["us_per_step_cpu"]
            ratios[what] = dict(ratio=r, ratio_cpu=rc, target=target, met=bool(r <= target),
                                num=a, den=b)

    # (vijax row, peer row, target, label); rows are "method/solver or rhs/system"
    table = [
        ("gauss2/fixedpoint/Kepler", "tsit5/autodiff EL rhs/Kepler", 1.5,
         "Gauss-2 / Tsit5 per step, Kepler (MechanicalSystem)"),
        ("gauss2/fixedpoint/GeneralKepler", "tsit5/autodiff EL rhs/GeneralKepler", 3.0,
         "Gauss-2 / Tsit5 per step, GeneralKepler (same system's rhs)"),
        ("gauss2/fixedpoint/GeneralKepler", "tsit5/autodiff EL rhs/Kepler", 3.0,
         "Gauss-2 (GeneralKepler) / Tsit5 (Kepler rhs) per step [strict]"),
        ("gauss2/fixedpoint/Kepler", "tsit5/autodiff EL rhs, no LAPACK/Kepler", 1.5,
         "Gauss-2 / Tsit5 (EL rhs, no LAPACK) per step, Kepler [sensitivity]"),
        ("gauss2/fixedpoint/GeneralKepler", "tsit5/autodiff EL rhs, no LAPACK/GeneralKepler",
         3.0, "Gauss-2 / Tsit5 (EL rhs, no LAPACK) per step, GeneralKepler [sens.]"),
        ("gauss2/fixedpoint/Kepler", "tsit5/hand-written rhs/Kepler", 0.75,
         "Gauss-2 / Tsit5 (hand-written rhs) per step, Kepler"),
        ("gauss2/fixedpoint/GeneralKepler", "tsit5/hand-written rhs/Kepler", 1.0,
         "Gauss-2 (GeneralKepler) / Tsit5 (hand-written rhs) per step"),
        ("gauss4/fixedpoint/Kepler", "dopri8/hand-written rhs/Kepler", 1.0,
         "Gauss-4 / Dopri8 (hand-written rhs) per step, Kepler"),
        ("gauss4/fixedpoint/GeneralKepler", "dopri8/hand-written rhs/Kepler", 1.0,
         "Gauss-4 (GeneralKepler) / Dopri8 (hand-written rhs) per step"),
    ]
    for sname in systems:
        for solver in solvers:
            for rhs, what in (
                    ("autodiff EL rhs", "Kvaerno5 per step, {}"),
                    ("autodiff EL rhs, no LAPACK", "Kvaerno5 (no LAPACK) per step, {} [sens.]"),
                    ("hand-written rhs", "Kvaerno5 (hand-written rhs) per step, {}")):
                table.append((f"gauss3/{solver}/{sname}", f"kvaerno5/{rhs}/{sname}", 1.0,
                              f"Gauss-3 ({solver}) / " + what.format(sname)))
    for num, den, target, what in table:
        ratio(num, den, target, what)
    plot_per_step(rows, RESULTS / f"per_step_cost{TAG}.png")
    return dict(n_steps=n, save_every=se, h=h, repeats=reps, rows=rows, ratios=ratios)


def plot_per_step(rows, path):
    import matplotlib.pyplot as plt

    systems = sorted({r["system"] for r in rows.values()}, reverse=True)
    fig, axes = plt.subplots(1, len(systems), figsize=(7 * len(systems), 4.5), squeeze=False)
    for ax, sname in zip(axes[0], systems):
        keys = [k for k, r in rows.items() if r["system"] == sname]
        names = []
        for k in keys:
            r = rows[k]
            extra = r.get("rhs", r["solver"])
            names.append(f"{r['method'].replace('vijax ', '').replace('diffrax ', '')}\n{extra}")
        vals = [rows[k]["us_per_step"] for k in keys]
        colors = ["C0" if rows[k]["method"].startswith("vijax") else "C3" for k in keys]
        bars = ax.bar(range(len(keys)), vals, color=colors)
        for b, k in zip(bars, keys):
            it = rows[k].get("mean_iterations")
            txt = f"{b.get_height():.2f}" + (f"\n{it:.1f} it" if it is not None else "")
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(), txt, ha="center",
                    va="bottom", fontsize=7)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(names, fontsize=7, rotation=45, ha="right")
        ax.set_ylabel("wall time per step [us]")
        ax.set_title(f"Per-step cost, {sname} (vijax blue, diffrax red)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Part d: ensemble throughput
# --------------------------------------------------------------------------------------------


def part_d(cfg, repeats):
    """Ensemble throughput.  First the accuracy of every configuration (one call each) and
    the matching peer tolerances; then all timed configurations are run round-robin
    (``repeats`` rounds, after a warm-up) so that background load hits them alike."""
    nt, T = cfg["n_traj"], cfg["t_final"]
    reps = cfg.get("repeats", repeats)
    e, q0, v0 = P.kepler_ensemble(nt)
    q_ref, v_ref = P.kepler_exact(T, e)
    q0, v0 = jnp.asarray(q0), jnp.asarray(v0)
    y0 = jnp.concatenate([q0, v0], axis=1)
    log(f"\n[d] ensemble throughput: {nt} Kepler orbits (e in [0.3, 0.6]), T = {T:g}, "
        f"error = max over trajectories of the max-norm (q, v) error at T; {reps} interleaved "
        f"rounds")
    system = vj.systems.Kepler()

    def ens_err(q, v):
        return float(max(np.max(np.abs(np.asarray(q) - q_ref)),
                         np.max(np.abs(np.asarray(v) - v_ref))))

    res = {"n_traj": nt, "T": T, "eccentricities": [float(e.min()), float(e.max())],
           "vijax": {}, "peers": {}, "matched": {}}
    timed_cfgs = {}   # name -> (fn, args)
    for key, h in cfg["h"].items():
        n = int(round(T / h))
        integ = PRESETS[key][1]()

        @jax.jit
        def run(q0, v0, dt, integ=integ, n=n):
            def one(q, v):
                sol = vj.simulate(system, integ, q0=q, v0=v, dt=dt, n_steps=n, save_every=n,
                                  throw=False)  # convergence is recorded per lane
                return (sol.q[-1], sol.v[-1], sol.mean_iterations, sol.stats.all_converged,
                        jnp.max(sol.stats.max_iterations))
            return jax.vmap(one)(q0, v0)

        q, v, it, ok, itmax = jax.block_until_ready(run(q0, v0, T / n))   # compile + accuracy
        res["vijax"][key] = dict(h=T / n, n_steps=n, error=ens_err(q, v),
                                 mean_iterations=float(np.mean(it)),
                                 max_iterations_any_step=int(np.max(itmax)),
                                 all_converged=bool(np.all(ok)))
        timed_cfgs[key] = (run, (q0, v0, T / n))
    vf = P.vector_field(system, PEER_RHS)
    for key in ("tsit5", "dopri8"):
        single = diffrax_runner(vf, peer_solver(key), T, max_steps=1_000_000)
        run = jax.jit(jax.vmap(single, in_axes=(0, None, None)))
        rows = []
        for tol in cfg["tols"]:
            ys, nsteps, nacc, ok = jax.block_until_ready(run(y0, tol, 0.0))
            ys = np.asarray(ys)[:, -1]
            err = ens_err(ys[:, :2], ys[:, 2:]) if bool(np.all(ok)) else float("nan")
            rows.append(dict(tol=tol, error=err, max_steps_taken=int(np.max(nsteps)),
                             mean_steps=float(np.mean(nsteps)), success=bool(np.all(ok))))
            if err < 0.1 * min(r["error"] for r in res["vijax"].values()):
                break
        res["peers"][key] = rows
        for vkey, vr in res["vijax"].items():
            ok_rows = [r for r in rows if r["success"] and r["error"] <= vr["error"]]
            if not ok_rows:
                res["matched"][f"{key}/{vkey}"] = dict(note="no tolerance reached the error")
                continue
            r = max(ok_rows, key=lambda r: r["tol"])   # loosest tol that is as accurate
            name = f"{key}@{r['tol']:.1e}"
            timed_cfgs[name] = (run, (y0, r["tol"], 0.0))
            res["matched"][f"{key}/{vkey}"] = dict(
                peer=name, peer_tol=r["tol"], peer_error=r["error"], vijax_error=vr["error"],
                peer_max_steps=r["max_steps_taken"], peer_mean_steps=r["mean_steps"])
    wall = {k: [] for k in timed_cfgs}
    cpu = {k: [] for k in timed_cfgs}
    for k, (fn, args) in timed_cfgs.items():
        _once(fn, *args)                                     # warm-up
    for _ in range(reps):
        for k, (fn, args) in timed_cfgs.items():
            _, w, c = _once(fn, *args)
            wall[k].append(w)
            cpu[k].append(c)
    med = {k: float(np.median(wall[k])) for k in timed_cfgs}
    res["timings"] = {k: dict(time=med[k], times=_stats(wall[k], cpu[k]),
                              traj_per_s=nt / med[k]) for k in timed_cfgs}
    for key, vr in res["vijax"].items():
        vr.update(time=med[key], traj_per_s=nt / med[key])
        log(f"  {label(key):18s} h={vr['h']:<7.3g} err={vr['error']:9.2e} "
            f"time={med[key]:7.3f} s -> {nt / med[key]:9.1f} traj/s  it/step={vr['mean_iterations']:.2f}")
    for mk, m in res["matched"].items():
        if "peer" not in m:
            continue
        pkey, vkey = mk.split("/")
        tp, tv = med[m["peer"]], med[vkey]
        m.update(peer_time=tp, peer_traj_per_s=nt / tp, vijax_time=tv,
                 vijax_traj_per_s=nt / tv, throughput_ratio_vijax_over_peer=tp / tv)
        log(f"  {label(pkey):18s} tol={m['peer_tol']:<8.1e} err={m['peer_error']:9.2e} "
            f"time={tp:7.3f} s -> {nt / tp:9.1f} traj/s  steps<= {m['peer_max_steps']}  "
            f"(vs {label(vkey)}: vijax/peer throughput = {tp / tv:.2f})")
    return res


# --------------------------------------------------------------------------------------------
# Part e: compile time
# --------------------------------------------------------------------------------------------


def part_e(cfg, repeats):
    """Compile time, measured two ways on fresh traces (unique static arguments):
    AOT ``jax.jit(wrapper).lower(...)`` (trace + lower) and ``.compile()`` (XLA), and
    "first call - median steady-state call" of a second fresh wrapper."""
    kep = P.kepler()
    log("\n[e] jit compile time (Kepler; fresh traces; AOT lower/compile and first call - "
        "steady state)")
    presets = cfg.get("presets", list(PRESETS))
    peers = cfg.get("peers", ["tsit5", "dopri8", "kvaerno5"])
    n0 = cfg["n_steps"]
    rows = {}
    salt = [0]

    def fresh_n():
        salt[0] += 1
        return n0 + 10 * salt[0]  # unique static n_steps -> no trace/compile cache hit

    # warm the compiler itself (first compilation in a process pays one-off costs)
    jax.jit(lambda x: jnp.sin(x) @ x)(jnp.ones((3, 3))).block_until_ready()

    def measure(make, args):
        f = make()
        t0 = time.perf_counter()
        lowered = jax.jit(f).lower(*args)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        g = jax.jit(make())
        _, med, _, first = timed(g, *args, repeats=repeats)
        return dict(trace_lower_s=t1 - t0, compile_s=t2 - t1, aot_total_s=t2 - t0,
                    first_call_s=first, steady_s=med, first_minus_steady_s=first - med)

    systems = {"Kepler": kep.system, "GeneralKepler": vj.systems.GeneralKepler()}
    for sname, system in systems.items():
        for key in presets:
            for solver in (["fixedpoint", "newton"] if sname == "Kepler" else ["fixedpoint"]):
                integ = PRESETS[key][1](solver=SOLVERS[solver]())

                def make(integ=integ, system=system):
                    n = fresh_n()

                    def f(q0, v0, dt):
                        sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=dt, n_steps=n,
                                          save_every=n // 10)
                        return sol.q, sol.v
                    return f

                r = measure(make, (kep.q0, kep.v0, 0.01))
                rows[f"{key}/{solver}/{sname}"] = dict(method=label(key), solver=solver,
                                                       system=sname, **r)
                log(f"  {label(key):16s} {solver:10s} {sname:13s} trace+lower "
                    f"{r['trace_lower_s']:6.2f} s  compile {r['compile_s']:6.2f} s  "
                    f"first-steady {r['first_minus_steady_s']:6.2f} s")
    ts = jnp.linspace(0.0, 10.0, 11)
    for key in peers:
        for adaptive in (True, False):
            if key == "dopri8" and not adaptive:
                continue

            def make(key=key, adaptive=adaptive):
                vf = kep.vector_field()  # fresh closure -> fresh trace
                solver = peer_solver(key, root_tol=None if adaptive else 1e-6)
                term = dfx.ODETerm(vf)

                def f(y0, tol, dt):
                    ctrl = dfx.PIDController(rtol=tol, atol=tol) if adaptive \
                        else dfx.ConstantStepSize()
                    sol = dfx.diffeqsolve(term, solver, 0.0, 10.0, None if adaptive else dt,
                                          y0, saveat=dfx.SaveAt(ts=ts),
                                          stepsize_controller=ctrl, max_steps=100_000,
                                          throw=False)
                    return sol.ys
                return f

            r = measure(make, (kep.y0, 1e-8, 0.01))
            mode = "PIDController" if adaptive else "ConstantStepSize"
            rows[f"{key}/{mode}"] = dict(method=label(key), solver=mode, system="Kepler", **r)
            log(f"  {label(key):16s} {mode:24s} trace+lower {r['trace_lower_s']:6.2f} s  "
                f"compile {r['compile_s']:6.2f} s  first-steady {r['first_minus_steady_s']:6.2f} s")
    # Python-side overhead of an eager (non-jitted) simulate call, per system.
    overhead = {}
    for sname, system in systems.items():
        integ = vj.VPRK.gauss(2)
        f = lambda: vj.simulate(system, integ, q0=kep.q0, v0=kep.v0, dt=0.01, n_steps=10)  # noqa
        _, eager, _, _ = timed(f, repeats=20)
        g = jax.jit(lambda q0, v0, dt: vj.simulate(system, integ, q0=q0, v0=v0, dt=dt,
                                                   n_steps=10).q)
        _, jitted, _, _ = timed(g, kep.q0, kep.v0, 0.01, repeats=20)
        overhead[sname] = dict(eager_call_10_steps_ms=eager * 1e3,
                               jitted_call_10_steps_ms=jitted * 1e3)
        log(f"  eager simulate call overhead ({sname}, 10 steps): {eager * 1e3:.2f} ms vs "
            f"{jitted * 1e3:.3f} ms inside jax.jit")
    plot_compile(rows, RESULTS / f"compile_time{TAG}.png")
    return dict(rows=rows, eager_simulate_overhead=overhead,
                note="save points: 10 (vijax save_every = n/10; diffrax SaveAt(ts) 11 points)")


def plot_compile(rows, path):
    import matplotlib.pyplot as plt

    keys = list(rows)
    fig, ax = plt.subplots(figsize=(max(7, 0.7 * len(keys)), 4.5))
    tl = [rows[k]["trace_lower_s"] for k in keys]
    cp = [rows[k]["compile_s"] for k in keys]
    x = np.arange(len(keys))
    ax.bar(x, tl, label="trace + lower", color="C1")
    ax.bar(x, cp, bottom=tl, label="XLA compile", color="C0")
    ax.set_xticks(x)
    ax.set_xticklabels([k.replace("/", "\n") for k in keys], fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title("jit compile time (AOT lower + compile)")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Machine info, summary, main
# --------------------------------------------------------------------------------------------


def machine_info():
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    src = hashlib.sha256()
    for f in sorted((ROOT / "vijax").rglob("*.py")):
        src.update(f.read_bytes())
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "vijax"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head, dirty = None, ""
    return dict(
        platform=platform.platform(), python=platform.python_version(), cpu=cpu,
        cpu_count=os.cpu_count(),
        cpus_available=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else None,
        jax=jax.__version__, jaxlib=getattr(jax.lib, "__version__", None) or
        __import__("jaxlib").__version__, devices=[str(d) for d in jax.devices()],
        x64=bool(jax.config.jax_enable_x64), diffrax=dfx.__version__,
        equinox=eqx.__version__, scipy=scipy.__version__, numpy=np.__version__,
        vijax=vj.__version__, vijax_source_sha256=src.hexdigest()[:16], git_head=head,
        vijax_worktree_dirty=bool(dirty), xla_flags=os.environ.get("XLA_FLAGS"),
        loadavg_start=os.getloadavg() if hasattr(os, "getloadavg") else None,
    )


def jsonable(x):
    """Strict JSON: non-finite floats become strings ("inf", "-inf", "nan")."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else str(x)
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    return x


def replot(results):
    """Redraw the PNGs of the loaded parts (``--summary-only``)."""
    for name, r in results.get("a", {}).items():
        plot_work_precision(r, RESULTS / f"work_precision_{name}{TAG}.png")
    for name, r in results.get("b", {}).items():
        ts = np.linspace(0.0, r["T"], r["n_save"] + 1)
        plot_energy(r, ts, RESULTS / f"energy_{name}{TAG}.png")
    if "c" in results:
        plot_per_step(results["c"]["rows"], RESULTS / f"per_step_cost{TAG}.png")
    if "e" in results:
        plot_compile(results["e"]["rows"], RESULTS / f"compile_time{TAG}.png")


def unjson(x):
    """Inverse of :func:`jsonable` for the non-finite markers."""
    if isinstance(x, dict):
        return {k: unjson(v) for k, v in x.items()}
    if isinstance(x, list):
        return [unjson(v) for v in x]
    if x in ("inf", "-inf", "nan"):
        return float(x)
    return x


def fmt(x, spec=".3g"):
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def summary(results) -> list[str]:
    lines = ["", "=" * 100, "SUMMARY OF RATIOS", "=" * 100]
    if "a" in results:
        lines.append("(a) work-precision: wall time of the peer / best vijax preset at equal "
                     "error (>1: vijax faster)")
        for name, r in results["a"].items():
            for tgt, s in r["at_error"].items():
                best = s["best_vijax"]
                parts = [f"{label(k).split()[-1]}={fmt(v)}" for k, v in
                         s["ratio_peer_over_best_vijax"].items()]
                lines.append(f"    {name:16s} err<={tgt}: best vijax={label(best) if best else 'n/a'}"
                             f" ({fmt(s['times'].get(best), '.3g')} s)  " + "  ".join(parts))
    if "b" in results:
        lines.append("(b) energy error at equal wall time, T=1e4: peer max|dE| / vijax max|dE| "
                     "(target >= 100)")
        for name, r in results["b"].items():
            for k, v in r["ratios"].items():
                pk, vk = k.split("/")
                met = "MET " if v["ratio"] >= 100 else "MISS"
                peer = (f"peer tol={v['peer_tol']:.1e} {v['peer_time']:.2f}s "
                        f"dE={v['peer_max_abs_dE']:.2e}") if v.get("peer_tol") else v.get("note")
                lines.append(f"    [{met}] {name:16s} {label(pk):15s} / {label(vk):16s} = "
                             f"{fmt(v['ratio'], '10.3g')}   (vijax {v['vijax_time']:.2f}s "
                             f"dE={v['vijax_max_abs_dE']:.2e}; {peer})")
    if "c" in results:
        lines.append("(c) per-step cost ratios")
        for what, v in results["c"]["ratios"].items():
            lines.append(f"    [{'MET ' if v['met'] else 'MISS'}] {what:68s} = {v['ratio']:6.3f}"
                         f"  (cpu-time ratio {v['ratio_cpu']:6.3f}; target <= {v['target']})")
        lines.append("    us/step wall (cpu) [mean iterations/step]:")
        for k, r in results["c"]["rows"].items():
            it = f" [{r['mean_iterations']:.2f} it]" if "mean_iterations" in r else ""
            lines.append(f"      {k:46s} {r['us_per_step']:8.3f} ({r['us_per_step_cpu']:.3f}){it}")
    if "d" in results:
        lines.append("(d) ensemble throughput (trajectories/s), vijax / peer at equal-or-better "
                     "peer accuracy")
        for k, v in results["d"]["matched"].items():
            pk, vk = k.split("/")
            if "peer_tol" not in v:
                lines.append(f"    {label(pk)} vs {label(vk)}: {v['note']}")
                continue
            lines.append(f"    {label(vk):16s} ({v['vijax_traj_per_s']:8.1f}/s, err "
                         f"{v['vijax_error']:.1e}) / {label(pk):15s} ({v['peer_traj_per_s']:8.1f}/s,"
                         f" tol {v['peer_tol']:.0e}, err {v['peer_error']:.1e}) = "
                         f"{v['throughput_ratio_vijax_over_peer']:.2f}")
    if "e" in results:
        lines.append("(e) compile time [s]: AOT trace+lower + compile  (first call - steady)")
        for k, r in results["e"]["rows"].items():
            lines.append(f"    {k:36s} {r['aot_total_s']:6.2f}  ({r['first_minus_steady_s']:.2f})")
        for s, o in results["e"]["eager_simulate_overhead"].items():
            lines.append(f"    eager simulate() call overhead, {s}: "
                         f"{o['eager_call_10_steps_ms']:.2f} ms (jitted: "
                         f"{o['jitted_call_10_steps_ms']:.3f} ms)")
    return lines


def main(argv=None):
    global RESULTS, PEER_RHS, TAG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (< 2 min): smoke test")
    ap.add_argument("--parts", default="a,b,c,d,e", help="comma-separated subset of a,b,c,d,e")
    ap.add_argument("--peer-rhs", default="autodiff", choices=P.RHS_KINDS,
                    help="peers' vector field in parts a, b, d: 'autodiff' = "
                         "vijax.diagnostics.euler_lagrange_rhs (default); 'autodiff-nolapack' "
                         "= same expressions with a closed-form 2x2 solve")
    ap.add_argument("--xla-small-loop-threshold", type=int, default=None, metavar="BYTES",
                    help="sensitivity check: raise XLA:CPU's small-while-loop hoisting "
                         "threshold (default 1 kB) so that small loops compile into single "
                         "kernels; sets XLA_FLAGS before JAX starts. Default: XLA's default")
    ap.add_argument("--summary-only", action="store_true",
                    help="print the summary table from the JSON files already in --out "
                         "(same --quick/--peer-rhs/--xla-small-loop-threshold tag) and exit")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="output folder for JSON and PNG")
    args = ap.parse_args(argv)
    RESULTS = Path(args.out)
    RESULTS.mkdir(parents=True, exist_ok=True)
    cfg = QUICK if args.quick else FULL
    PEER_RHS = args.peer_rhs
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = set(parts) - set("abcde")
    if bad:
        ap.error(f"unknown parts {sorted(bad)}; choose from a,b,c,d,e")
    tag = ("_quick" if args.quick else "") + \
        ("" if PEER_RHS == "autodiff" else "_" + PEER_RHS.replace("autodiff-", "")) + \
        ("" if args.xla_small_loop_threshold is None else
         f"_xlaloop{args.xla_small_loop_threshold}")
    TAG = tag
    info = machine_info()
    info["peer_rhs"] = PEER_RHS
    info["rhs_variants_max_rel_diff"] = {
        name: P.check_rhs_agree(problem(name).system, problem(name).y0)
        for name in ("kepler", "double_pendulum")}
    log(f"machine: {info['platform']} | {info['cpu']} x {info['cpu_count']} | jax "
        f"{info['jax']} | diffrax {info['diffrax']} | x64={info['x64']} | "
        f"{'QUICK' if args.quick else 'FULL'} | parts {','.join(parts)} | peer rhs {PEER_RHS}"
        f" | XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}")
    names = {"a": "work_precision", "b": "energy_equal_cost", "c": "per_step_cost",
             "d": "ensemble_throughput", "e": "compile_time"}
    if args.summary_only:
        results = {}
        for p in parts:
            f = RESULTS / f"{names[p]}{tag}.json"
            if f.exists():
                results[p] = unjson(json.loads(f.read_text())["results"])
        replot(results)
        write_summary(summary(results), RESULTS / f"summary{tag}.txt")
        return
    t_start = time.perf_counter()
    results, ref_cache = {}, {}
    fns = {"a": lambda: part_a(cfg["a"], cfg["a"].get("repeats", cfg["repeats"]), ref_cache),
           "b": lambda: part_b(cfg["b"], cfg["repeats"]),
           "c": lambda: part_c(cfg["c"], cfg["repeats"]),
           "d": lambda: part_d(cfg["d"], cfg["repeats"]),
           "e": lambda: part_e(cfg["e"], cfg["repeats"])}
    for p in "abcde":
        if p not in parts:
            continue
        t0 = time.perf_counter()
        load0 = os.getloadavg() if hasattr(os, "getloadavg") else None
        results[p] = fns[p]()
        dt = time.perf_counter() - t0
        log(f"[{p}] done in {dt:.1f} s")
        payload = dict(part=p, title=names[p], machine=info, config=cfg[p], seconds=dt,
                       loadavg_start=load0,
                       loadavg_end=os.getloadavg() if hasattr(os, "getloadavg") else None,
                       results=results[p])
        (RESULTS / f"{names[p]}{tag}.json").write_text(json.dumps(jsonable(payload),
                                                                  indent=1))
    lines = summary(results)
    write_summary(lines, RESULTS / f"summary{tag}.txt", t_start, command_line("run.py", argv))


if __name__ == "__main__":
    main()
