"""Constrained benchmarks: GalerkinVI (Wenger, Ober-Blöbaum & Leyendecker 2017) and constrained
VPRK on holonomic systems.

    python benchmarks/constrained.py               # full run (~10 min on 2 idle CPU cores)
    python benchmarks/constrained.py --quick       # smoke test (~70 s), *_quick files
    python benchmarks/constrained.py --parts a1,b  # a subset of a1, a2, b ("a" = a1,a2)
    python benchmarks/constrained.py --summary-only   # re-print summary / re-plot from JSON

Parts (see benchmarks/README.md, "Constrained benchmarks"):
  a1  accuracy vs run time across s, planar Cartesian pendulum (Wenger et al. (2017), §4.3,
      Figs. 4-5): GalerkinVI.gauss(s), s = 1..6, step h = T_p / n so that the period is a
      whole number of steps; error = max over whole periods of |q(j T_p) - q0|.
  a2  the same on the 3-D double pendulum (their §4, eq. (69)) against a DOP853 rtol 1e-13
      reference on the index-1 (multiplier-reduced) ODE, cross-checked by a fine Gauss-6 run.
      Both a1 and a2 add HolonomicVPRK.lobatto(s), s = 2..5, and GalerkinVI.lobatto(s),
      s = 2, 5 (Gauss vs Lobatto quadrature, their Fig. 5).
  b   long-time (T = 1000) energy and constraint errors at equal wall time: RATTLE and
      GalerkinVI.gauss(s), s = 2..4, on the Cartesian pendulum, against diffrax Dopri8/Tsit5
      (adaptive) and Dopri8 (fixed step) on the minimal-coordinate pendulum and on the
      index-reduced Cartesian ODE (no projection: it drifts off the constraint).

Timing rules are those of benchmarks/run.py (whose helpers are imported): float64, every
solver inside one jax.jit, compilation excluded (reported separately), median of >= 3
blocked calls, process CPU time recorded next to wall time, load average recorded.
Output: results/constrained{_quick}.json, constrained_*{_quick}.png,
constrained_summary{_quick}.txt.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import diffrax as dfx
import jax.numpy as jnp
import numpy as np
from scipy.integrate import solve_ivp
from scipy.special import ellipk

import vijax as vj

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _problems as P
from run import (
    _once,
    diffrax_runner,
    command_line,
    error_at_time,
    fmt,
    jsonable,
    panel_grid,
    log,
    machine_info,
    pareto,
    time_at_error,
    timed,
    unjson,
    write_summary,
)

RESULTS = Path(__file__).resolve().parent / "results"
SERIES_EVERY = 5   # part b stores every 5th save point of its time series, to 4 digits


def series(a):
    """A time series as stored in the JSON (maxima are taken before thinning)."""
    return [float(f"{x:.4g}") for x in np.asarray(a, dtype=float)[::SERIES_EVERY]]

TAG = ""
GRAV = 9.81

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


FULL = dict(
    a1=dict(
        theta_max=1.0, n_periods=10, repeats=5, budget=4.0, pair_repeats=7,
        n_per={  # steps per period, multiples of 4 (one compilation each: ~1.5-4 s)
            "gauss1": [32, 128, 512, 2048, 8192, 32768],
            "gauss2": [8, 16, 24, 32, 48, 64, 128, 256, 512],
            "gauss3": [4, 8, 12, 16, 24, 32, 48, 64, 128],
            "gauss4": [4, 8, 12, 16, 24, 32, 48, 64],
            "gauss5": [4, 8, 12, 16, 24, 32, 48],
            "gauss6": [4, 8, 12, 16, 24, 32, 48],
            "glob2": [8, 32, 128, 512],
            "glob5": [4, 12, 24, 48],
            "vprk_lob2": [32, 128, 512, 2048, 8192],
            "vprk_lob3": [8, 32, 128, 512],
            "vprk_lob4": [4, 8, 16, 32, 64, 128],
            "vprk_lob5": [4, 8, 16, 32, 64],
        },
        targets=[1e-6, 1e-8, 1e-10, 1e-12],          # paper's measure (whole periods)
        targets_quarter=[1e-4, 1e-6, 1e-8, 1e-10],   # quarter-period measure
        floor=1e-13,   # errors below this are round-off: ties in the monotonicity check
    ),
    a2=dict(
        T=4.0, n_saves=4, repeats=5, budget=4.0, pair_repeats=7,
        n_steps={  # over [0, T]; multiples of n_saves
            "gauss1": [100, 400, 1600, 6400, 25600, 102400],
            "gauss2": [40, 80, 160, 320, 640, 1280, 2560],
            "gauss3": [20, 28, 40, 56, 80, 160, 320],
            "gauss4": [12, 20, 28, 40, 56, 80, 160],
            "gauss5": [12, 20, 28, 40, 56, 80, 160],
            "gauss6": [12, 20, 28, 40, 56, 80, 160],
            "glob2": [40, 160, 640, 2560],
            "glob5": [20, 40, 80, 160],
            "vprk_lob2": [100, 400, 1600, 6400, 25600],
            "vprk_lob3": [40, 160, 640, 2560],
            "vprk_lob4": [20, 40, 80, 160, 320],
            "vprk_lob5": [20, 40, 80, 160, 320],
        },
        ref_rtol=1e-13, ref_atol=1e-15, ref_check=("gauss6", 2000),
        targets=[1e-6, 1e-8, 1e-10],
        floor=1e-12,
    ),
    b=dict(
        T=1000.0, n_save=1000, theta0=1.0, omega0=0.5, repeats=3, time_budget=4.0,
        h={"rattle": [0.01], "gvi_rattle": [0.01], "gauss2": [0.02, 0.01],
           "gauss3": [0.05, 0.025], "gauss4": [0.1, 0.05]},
        # vijax on the peers' own formulation (the minimal-coordinate Pendulum, unconstrained
        # VPRK with its FixedPoint stage solver): separates the formulation from the method.
        h_minimal={"vprk_gauss2": [0.1, 0.05], "vprk_gauss3": [0.1, 0.05],
                   "vprk_gauss4": [0.2, 0.1]},
        peers=["min_dopri8", "min_tsit5", "min_dopri8_fixed", "ir_dopri8", "ir_tsit5",
               "ir_dopri8_fixed"],
        tols=[10.0 ** (-k / 2) for k in range(6, 29)],   # 1e-3 ... 1e-14, half decades
        start_tol=1e-9, overshoot=1.3, max_steps=3_000_000,
        fixed_steps_per_unit_time=[5, 10, 20, 50, 100, 200, 500, 1000, 2000],
        fixed_start=50,
    ),
)

QUICK = dict(
    a1=dict(
        theta_max=1.0, n_periods=4, repeats=3, budget=1.0, pair_repeats=3,
        n_per={"gauss1": [64, 512], "gauss2": [8, 32], "gauss3": [4, 8], "gauss4": [4, 8],
               "gauss5": [4, 8], "gauss6": [4, 8], "glob2": [8, 32], "glob5": [4, 8],
               "vprk_lob3": [16], "vprk_lob5": [8]},
        targets=[1e-6, 1e-8, 1e-10], targets_quarter=[1e-4, 1e-6], floor=1e-13,
    ),
    a2=dict(
        T=2.0, n_saves=2, repeats=3, budget=1.0, pair_repeats=3,
        n_steps={"gauss1": [200, 800], "gauss3": [40, 80], "gauss6": [20, 40],
                 "glob2": [100], "gauss2": [100], "vprk_lob3": [100]},
        ref_rtol=1e-13, ref_atol=1e-15, ref_check=("gauss6", 400),
        targets=[1e-6, 1e-8], floor=1e-12,
    ),
    b=dict(
        T=100.0, n_save=100, theta0=1.0, omega0=0.5, repeats=3, time_budget=1.0,
        h={"rattle": [0.01], "gauss3": [0.05]}, h_minimal={"vprk_gauss4": [0.1]},
        peers=["min_dopri8", "min_dopri8_fixed", "ir_dopri8"],
        tols=[10.0 ** -k for k in range(4, 15)], start_tol=1e-8, overshoot=1.5,
        max_steps=1_000_000, fixed_steps_per_unit_time=[10, 50, 200, 1000, 5000],
        fixed_start=50,
    ),
)

METHODS = {  # key -> (label, order of q, factory)
    **{f"gauss{s}": (f"GalerkinVI Gauss s={s}", 2 * s, lambda s=s: vj.GalerkinVI.gauss(s))
       for s in range(1, 7)},
    **{f"glob{s}": (f"GalerkinVI Lobatto s={s} (r={s + 1})", 2 * s,
                    lambda s=s: vj.GalerkinVI.lobatto(s)) for s in (2, 5)},
    **{f"vprk_lob{s}": (f"HolonomicVPRK Lobatto s={s}" + (" (RATTLE)" if s == 2 else ""),
                        2 * s - 2, lambda s=s: vj.HolonomicVPRK.lobatto(s))
       for s in range(2, 6)},
    "rattle": ("RATTLE (HolonomicVPRK.rattle)", 2, lambda: vj.HolonomicVPRK.rattle()),
    "gvi_rattle": ("GalerkinVI.rattle", 2, lambda: vj.GalerkinVI.rattle()),
    **{f"vprk_gauss{s}": (f"VPRK Gauss s={s}, minimal coords", 2 * s,
                          lambda s=s: vj.VPRK.gauss(s)) for s in (2, 3, 4)},
}

PEERS = {  # key -> (label, diffrax solver class, equations, step-size control)
    "min_dopri8": ("Dopri8, minimal coords", dfx.Dopri8, "minimal", "adaptive"),
    "min_tsit5": ("Tsit5, minimal coords", dfx.Tsit5, "minimal", "adaptive"),
    "min_dopri8_fixed": ("Dopri8 fixed step, minimal coords", dfx.Dopri8, "minimal", "fixed"),
    "ir_dopri8": ("Dopri8, index-reduced Cartesian", dfx.Dopri8, "index_reduced", "adaptive"),
    "ir_tsit5": ("Tsit5, index-reduced Cartesian", dfx.Tsit5, "index_reduced", "adaptive"),
    "ir_dopri8_fixed": ("Dopri8 fixed step, index-reduced Cartesian", dfx.Dopri8,
                        "index_reduced", "fixed"),
}


def knob_str(row):
    return f"tol={row['tol']:<8.1e}" if "tol" in row else f"h={row['h']:<10.3g}"


def label(key):
    if "@" in key:
        base, extra = key.split("@", 1)
        return f"{label(base)} ({extra})"
    return (METHODS.get(key) or PEERS.get(key) or (key,))[0]


def style(key):
    key = key.split("@", 1)[0]
    if key.startswith("gauss"):
        s = int(key[5:])
        return dict(color=_viridis((s - 1) / 5), marker="o", ls="-")
    if key.startswith("glob"):
        s = int(key[4:])
        return dict(color=_viridis((s - 1) / 5), marker="s", ls="--", mfc="none")
    if key.startswith("vprk_lob"):
        s = int(key[8:])
        return dict(color=("C3", "C1", "C5", "C6")[s - 2], marker="^", ls=":")
    if key.startswith("vprk_gauss"):
        s = int(key[10:])
        return dict(color=_viridis((s - 1) / 5), marker="D", ls="-.")
    return {"rattle": dict(color="C3", marker="^", ls=":"),
            "gvi_rattle": dict(color="C7", marker="v", ls=":"),
            "min_dopri8": dict(color="C4", ls="--"), "min_tsit5": dict(color="C9", ls="--"),
            "min_dopri8_fixed": dict(color="C6", ls="--"),
            "ir_dopri8": dict(color="C1", ls="-."), "ir_tsit5": dict(color="C8", ls="-."),
            "ir_dopri8_fixed": dict(color="C2", ls="-.")}[key]


def _viridis(x):
    import matplotlib

    return matplotlib.colormaps["viridis"](0.9 * x)


def loadavg():
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


# --------------------------------------------------------------------------------------------
# Timing and runners
# --------------------------------------------------------------------------------------------


def measure(fn, *args, repeats=5, min_repeats=3, budget=None, warm=True):
    """run.py's ``timed`` with a floor of ``min_repeats`` timed calls; returns the compile
    time instead of the first call's time (``warm=True``: the first call's excess over the
    median; ``"aot"``: the ahead-of-time compilation)."""
    out, med, times, first = timed(fn, *args, repeats=repeats, min_repeats=min_repeats,
                                   budget=budget, warm=warm)
    return out, med, times, (first - med) if warm is True else first


_RUNNERS = {}


def cached_runner(problem, key, n_steps, save_every, system):
    """One compiled runner per (problem, method, n_steps, save_every), reused by the
    interleaved Gauss-vs-Lobatto timing."""
    k = (problem, key, n_steps, save_every)
    if k not in _RUNNERS:
        _RUNNERS[k] = constrained_runner(system, METHODS[key][2](), n_steps, save_every)
    return _RUNNERS[k]


def constrained_runner(system, integ, n_steps, save_every):
    """jit(q0, v0, dt) -> dict of saved q, v, multipliers and solver statistics, compiled
    with :func:`_problems.vijax_options`."""

    @functools.partial(jax.jit, compiler_options=P.vijax_options() or None)
    def run(q0, v0, dt):
        # throw=False: the sweeps record unconverged runs instead of stopping at them
        sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=dt, n_steps=n_steps,
                          save_every=save_every, throw=False)
        st = sol.stats
        return dict(q=sol.q, v=sol.v, lam=getattr(sol.states, "lam", None),
                    it=sol.mean_iterations,
                    itmax=jnp.max(st.max_iterations), ok=st.all_converged,
                    nfail_blocks=jnp.sum(~st.converged), first_fail=st.first_failure)

    return run


def _small_solve(a, b):
    """``a^{-1} b`` for the m x m constraint Gram matrix, LAPACK-free for m <= 2 (see
    README, "Caveats": a LAPACK custom call would slow the peers' step loop)."""
    m = a.shape[0]
    if m == 1:
        return b / a[0, 0]
    if m == 2:
        det = a[0, 0] * a[1, 1] - a[0, 1] * a[1, 0]
        return jnp.stack([a[1, 1] * b[0] - a[0, 1] * b[1], a[0, 0] * b[1] - a[1, 0] * b[0]]) / det
    return jnp.linalg.solve(a, b)


def index_reduced_rhs(system):
    """``(q, v)' = (v, a)`` of the index-1 ODE ``M a = f - G^T lam(q, v)``, ``lam`` from
    eq. (70) of Wenger et al. (2017) (the same autodiff expressions as
    ``vijax.constraints.multiplier``, with a closed-form small solve).  No projection: ``g(q)``
    and ``G v`` drift."""

    def rhs(q, v):
        G = vj.constraints.constraint_jacobian(system, q)
        hinv = system.inverse_velocity_hessian(q, v)
        mixed = jax.jacfwd(system.momentum, argnums=0)(q, v)
        f = system.d1_lagrangian(q, v) - mixed @ v
        gqvv = jax.jvp(lambda x: vj.constraints.constraint_jacobian(system, x), (q,), (v,))[1] @ v
        lam = _small_solve(G @ hinv @ G.T, G @ hinv @ f + gqvv)
        return v, hinv @ (f - G.T @ lam)

    def flat(y):
        n = y.shape[-1] // 2
        v, a = rhs(y[:n], y[n:])
        return jnp.concatenate([v, a])

    return flat


def check_index_reduced(system, q, v):
    """Max difference between the closed-form multiplier and vijax.constraints.multiplier."""
    f = index_reduced_rhs(system)
    a = np.asarray(jax.jit(f)(jnp.concatenate([q, v])))[q.shape[0]:]
    lam = vj.constraints.multiplier(system, q, v)
    G = vj.constraints.constraint_jacobian(system, q)
    mixed = jax.jacfwd(system.momentum, argnums=0)(q, v)
    fq = system.d1_lagrangian(q, v) - mixed @ v
    a_ref = np.asarray(system.inverse_velocity_hessian(q, v) @ (fq - G.T @ lam))
    return float(np.max(np.abs(a - a_ref)))


def constraint_residuals(system, q, v):
    """``|g(q)|`` and ``|G(q) v|`` (max-norm) at each saved point."""
    g = jax.vmap(system.holonomic)(jnp.asarray(q))
    gv = jax.vmap(lambda x, y: vj.constraints.constraint_jacobian(system, x) @ y)(
        jnp.asarray(q), jnp.asarray(v))
    return np.max(np.abs(np.asarray(g)), axis=-1), np.max(np.abs(np.asarray(gv)), axis=-1)


# --------------------------------------------------------------------------------------------
# Work-precision helpers
# --------------------------------------------------------------------------------------------


DIVERGED = 0.1   # a run with error above this (the length scale is 1) has left the solution


def usable(p, err_key="error"):
    """A measured run whose error is finite and not divergent.  Runs whose solver reported
    non-convergence are kept when their error is fine: in this benchmark that happens at the
    round-off floor of the Newton stopping test (see README); they stay flagged
    (``converged`` false) and their time includes the wasted iterations."""
    return ("time" in p and np.isfinite(p.get("error", np.nan)) and p["error"] < DIVERGED
            and np.isfinite(p.get(err_key, np.nan)))


def extrapolated_time(times, errors, target):
    """If the Pareto front never reaches ``target``: its slowest run time (a lower bound) and
    an estimate from the last two front points' slope (log t vs log err)."""
    front = pareto(times, errors)
    if not front:
        return None, None
    t1, e1 = front[-1]
    if len(front) < 2:
        return t1, None
    t0, e0 = front[-2]
    if e0 <= e1:
        return t1, None
    slope = (math.log(t1) - math.log(t0)) / (math.log(e1) - math.log(e0))
    return t1, math.exp(math.log(t1) + slope * (math.log(target) - math.log(e1)))


def observed_order(points, err_key="error"):
    """Least-squares slope of log err vs log h on the points above 1e3 x the smallest error
    (round-off excluded)."""
    pts = [(p["h"], p[err_key]) for p in points if usable(p, err_key)]
    if len(pts) < 2:
        return None
    emin = min(e for _, e in pts)
    pts = [(h, e) for h, e in pts if e > 1e3 * max(emin, 1e-16)] or pts
    if len(pts) < 2:
        return None
    x = np.log([h for h, _ in pts])
    y = np.log([e for _, e in pts])
    return float(np.polyfit(x, y, 1)[0])


def sweep(problem, system, key, ns, q0, v0, *, dt_of, save_every_of, err_of, repeats,
          budget, tag):
    """Time one method over a list of step counts; returns the rows."""
    rows = []
    for n in ns:
        n_steps, se, dt = n["n_steps"], save_every_of(n), dt_of(n)
        run = cached_runner(problem, key, n_steps, se, system)
        try:
            out, med, times, comp = measure(run, q0, v0, dt, repeats=repeats, budget=budget)
        except Exception as exc:
            log(f"  {label(key):36s} {tag}={n[tag]:<6} FAILED: {type(exc).__name__}: {exc}")
            rows.append(dict(n, h=dt, ok=False, error=float("nan"), exception=repr(exc)))
            continue
        q = np.asarray(out["q"])
        errs = err_of(q)          # {"error": primary measure, ...: secondary measures}
        err = errs["error"]
        ok = bool(np.isfinite(err) and err < DIVERGED)
        row = dict(n, h=float(dt), time=med, times=times, compile_s=comp, **errs,
                   us_per_step=med / n_steps * 1e6,
                   us_per_step_cpu=times["cpu_median"] / n_steps * 1e6,
                   mean_iterations=float(out["it"]), max_iterations=int(out["itmax"]),
                   converged=bool(out["ok"]), failed_blocks=int(out["nfail_blocks"]),
                   first_failed_step=int(out["first_fail"]), ok=ok, load1=loadavg()[0])
        rows.append(row)
        more = "".join(f" {k[6:]}={v:8.2e}" for k, v in errs.items() if k != "error")
        log(f"  {label(key):36s} {tag}={n[tag]:<6} h={dt:<9.3g} err={err:9.2e}{more} "
            f"time={med * 1e3:9.2f} ms ({row['us_per_step']:6.1f} us/step) "
            f"it/step={row['mean_iterations']:.2f} max={row['max_iterations']} "
            f"compile={comp:5.2f} s" + ("" if row["converged"] else
                                        f"  NOT CONVERGED (first failed step "
                                        f"{row['first_failed_step']})"))
    return rows


def analyse_wp(res, targets, floor, s_keys=tuple(f"gauss{s}" for s in range(1, 7)),
               err_key="error"):
    """Fig. 4 of Wenger et al. (2017) (time at target errors, monotonic error at fixed time),
    their Fig. 5 (Gauss vs Lobatto quadrature at equal h), per-step cost vs s."""
    methods = res["methods"]

    def good(key):
        return [p for p in methods.get(key, {}).get("points", []) if usable(p, err_key)]

    out = {"error_measure": err_key, "targets": {}, "fixed_time": {},
           "gauss_vs_lobatto": {}, "per_step": {}}
    for tgt in targets:
        row = {}
        for key in methods:
            pts = good(key)
            t = time_at_error([p["time"] for p in pts], [p[err_key] for p in pts], tgt)
            if t is not None:
                row[key] = dict(time=t, reached=True)
            else:
                lb, est = extrapolated_time([p["time"] for p in pts],
                                            [p[err_key] for p in pts], tgt)
                row[key] = dict(time=None, reached=False, lower_bound=lb, extrapolated=est)
        # s >= 3 faster than s = 1?
        ref = row.get("gauss1")
        verdict = {}
        if ref is not None:
            t1 = ref["time"] if ref["reached"] else ref.get("lower_bound")
            for key in [k for k in s_keys[2:] if k in methods]:
                r = row.get(key)
                if r is None or not r["reached"] or t1 is None:
                    verdict[key] = dict(met=None, note="not reached")
                    continue
                verdict[key] = dict(
                    met=bool(r["time"] < t1), speedup=t1 / r["time"],
                    speedup_is_lower_bound=not ref["reached"],
                    speedup_extrapolated=(ref["extrapolated"] / r["time"]
                                          if not ref["reached"] and ref.get("extrapolated")
                                          else None))
        out["targets"][f"{tgt:.0e}"] = dict(times=row, s_ge_3_beats_s1=verdict)
    # error at fixed run times: times where every Gauss s has data (a method whose slowest
    # run is at the round-off floor stays there for any longer time)
    have = [k for k in s_keys if good(k)]
    lo = max(min(p["time"] for p in good(k)) for k in have)
    his = [max(p["time"] for p in good(k)) for k in have
           if min(p[err_key] for p in good(k)) > floor]
    hi = min(his) if his else max(max(p["time"] for p in good(k)) for k in have)
    grid = [lo] if hi <= lo else sorted(set(
        [float(x) for x in np.geomspace(lo, hi, 6)] +
        [t for t in (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0) if lo < t < hi]))
    mono_all, n_compared = True, 0
    for t in grid:
        errs = {}
        for k in have:
            pts = good(k)
            errs[k] = error_at_time([p["time"] for p in pts], [p[err_key] for p in pts], t,
                                    floor)
        seq = [(k, errs[k]) for k in have if errs[k] is not None]
        n_compared += max(len(seq) - 1, 0)
        viol = []
        for (ka, a), (kb, b) in zip(seq[:-1], seq[1:]):
            if b > a and not (a <= floor and b <= floor):
                viol.append(f"s={kb[5:]} ({b:.2e}) > s={ka[5:]} ({a:.2e})")
        mono_all &= not viol
        out["fixed_time"][f"{t:.3e}"] = dict(errors=errs, monotone=not viol, violations=viol)
    out["monotone_at_all_fixed_times"] = mono_all if n_compared else None
    out["fixed_time_comparisons"] = n_compared
    out["fixed_time_floor"] = floor
    # Gauss vs Lobatto quadrature at the same h (Fig. 5); times from the interleaved
    # pair timing when present (robust to background load), else from the sweeps
    for s in (2, 5):
        g, lo_ = f"gauss{s}", f"glob{s}"
        if g not in methods or lo_ not in methods:
            continue
        gp = {p["h"]: p for p in good(g)}
        pt = {x["h"]: x for x in res.get("pair_timing", {}).get(f"s={s}", [])}
        pairs = []
        for p in good(lo_):
            q = gp.get(p["h"])
            if q is None:
                continue
            x = pt.get(p["h"])
            tg, tl = (x["time_gauss"], x["time_lobatto"]) if x else (q["time"], p["time"])
            cg, cl = ((x["cpu_gauss"], x["cpu_lobatto"]) if x else
                      (q["times"]["cpu_median"], p["times"]["cpu_median"]))
            pairs.append(dict(h=p["h"], n_steps=p["n_steps"], err_gauss=q[err_key],
                              err_lobatto=p[err_key], err_ratio=p[err_key] / q[err_key],
                              time_gauss=tg, time_lobatto=tl, interleaved=bool(x),
                              time_ratio_lobatto_over_gauss=tl / tg,
                              cpu_ratio_lobatto_over_gauss=cl / cg,
                              it_gauss=q["mean_iterations"], it_lobatto=p["mean_iterations"]))
        if pairs:
            above = [x for x in pairs if min(x["err_gauss"], x["err_lobatto"]) > floor]
            out["gauss_vs_lobatto"][f"s={s}"] = dict(
                pairs=pairs,
                max_abs_log10_err_ratio_above_floor=(
                    max(abs(math.log10(x["err_ratio"])) for x in above) if above else None),
                median_time_ratio=float(np.median([x["time_ratio_lobatto_over_gauss"]
                                                   for x in pairs])),
                median_cpu_ratio=float(np.median([x["cpu_ratio_lobatto_over_gauss"]
                                                  for x in pairs])),
                gauss_faster_fraction=float(np.mean([x["time_ratio_lobatto_over_gauss"] >= 1
                                                     for x in pairs])))
    # per-step cost: from each method's longest run (best timing resolution)
    for key in methods:
        pts = [p for p in methods[key]["points"] if "time" in p]
        if not pts:
            continue
        p = max(pts, key=lambda p: p["n_steps"])
        comps = [q["compile_s"] for q in pts if q.get("compile_s") is not None]
        out["per_step"][key] = dict(
            us_per_step=p["us_per_step"], us_per_step_cpu=p["us_per_step_cpu"],
            n_steps=p["n_steps"], mean_iterations=p["mean_iterations"],
            mean_iterations_all=float(np.mean([q["mean_iterations"] for q in pts])),
            compile_s_median=float(np.median(comps)) if comps else None,
            observed_order=observed_order(methods[key]["points"], err_key),
            nominal_order=METHODS[key][1],
            unconverged_runs=[q["n_steps"] for q in pts if not q["converged"]],
            divergent_runs=[q["n_steps"] for q in pts if not usable(q)])
    return out


def pair_timing(problem, res, system, q0, v0, *, dt_of, save_every_of, repeats):
    """Fig. 5: Gauss (r = s) and Lobatto (r = s + 1) quadrature at the same h, timed
    alternately (G, L, G, L, ...) with the compiled runners of the sweeps, so that
    background load falls on both alike."""
    out = {}
    for s in (2, 5):
        g, lo_ = f"gauss{s}", f"glob{s}"
        if g not in res["methods"] or lo_ not in res["methods"]:
            continue
        gh = {p["n_steps"]: p for p in res["methods"][g]["points"] if usable(p)}
        rows = []
        for p in res["methods"][lo_]["points"]:
            if not usable(p) or p["n_steps"] not in gh:
                continue
            n = {k: p[k] for k in ("n_steps", "n_per") if k in p}
            dt, se = dt_of(n), save_every_of(n)
            rg = cached_runner(problem, g, n["n_steps"], se, system)
            rl = cached_runner(problem, lo_, n["n_steps"], se, system)
            wall = {"g": [], "l": []}
            cpu = {"g": [], "l": []}
            for _ in range(repeats):
                for name, fn in (("g", rg), ("l", rl)):
                    _, w, c = _once(fn, q0, v0, dt)
                    wall[name].append(w)
                    cpu[name].append(c)
            row = dict(h=float(dt), n_steps=n["n_steps"],
                       time_gauss=float(np.median(wall["g"])),
                       time_lobatto=float(np.median(wall["l"])),
                       cpu_gauss=float(np.median(cpu["g"])),
                       cpu_lobatto=float(np.median(cpu["l"])), repeats=repeats)
            rows.append(row)
            log(f"  Fig. 5, s={s}, h={dt:<9.3g} interleaved: Gauss {row['time_gauss'] * 1e3:8.2f}"
                f" ms, Lobatto {row['time_lobatto'] * 1e3:8.2f} ms (L/G = "
                f"{row['time_lobatto'] / row['time_gauss']:.3f}, cpu "
                f"{row['cpu_lobatto'] / row['cpu_gauss']:.3f})")
        out[f"s={s}"] = rows
    return out


# --------------------------------------------------------------------------------------------
# Part a1: planar pendulum, whole periods
# --------------------------------------------------------------------------------------------


def part_a1(cfg):
    system = vj.systems.CartesianPendulum()
    th = cfg["theta_max"]
    q0 = jnp.asarray([math.sin(th), -math.cos(th)], jnp.float64)
    v0 = jnp.zeros(2, jnp.float64)
    k = math.sin(th / 2)
    Tp = 4.0 * math.sqrt(1.0 / GRAV) * float(ellipk(k * k))
    P_ = cfg["n_periods"]
    log(f"\n[a1] planar Cartesian pendulum (m = l = 1, g = {GRAV}), at rest at theta_max = "
        f"{th} rad, period T_p = {Tp:.15g}; {P_} periods; error = max_j |q(j T_p) - q0| "
        f"(quarter: max over t = j T_p / 4 of |q - q_exact|)")
    res = dict(problem="planar Cartesian pendulum", theta_max=th, period=Tp, n_periods=P_,
               error="our reading of Wenger et al. (2017), §4.3: max over j = 1..n_periods of "
               "the max-norm of q(j T_p) - q0 (a turning point: the phase error enters "
               "quadratically, so this measure shows order ~4s, not 2s)",
               error_quarter="max over t = j T_p / 4, j = 1..4 n_periods, of the max-norm of "
               "q - q_exact (q_exact = q0, (0, -l) at the bottom, (-sin, -cos)(theta_max) at "
               "the other turning point); dominated by the bottom passages, where the phase "
               "error enters linearly: order 2s",
               methods={})
    # exact q at the quarter periods
    q_quarter = np.array([[0.0, -1.0], [-math.sin(th), -math.cos(th)], [0.0, -1.0],
                          [math.sin(th), -math.cos(th)]] * P_)

    def err_of(q):
        return dict(error=float(np.max(np.abs(q[4::4] - q_quarter[3::4]))),
                    error_quarter=float(np.max(np.abs(q[1:] - q_quarter))))

    for key, nps in cfg["n_per"].items():
        assert all(n % 4 == 0 for n in nps), "n_per must be a multiple of 4 (quarter periods)"
        ns = [dict(n_per=n, n_steps=n * P_) for n in nps]
        rows = sweep("a1", system, key, ns, q0, v0, dt_of=lambda n: Tp / n["n_per"],
                     save_every_of=lambda n: n["n_per"] // 4, err_of=err_of,
                     repeats=cfg["repeats"], budget=cfg["budget"], tag="n_per")
        res["methods"][key] = dict(label=label(key), nominal_order=METHODS[key][1], points=rows)
    res["pair_timing"] = pair_timing("a1", res, system, q0, v0,
                                     dt_of=lambda n: Tp / n["n_per"],
                                     save_every_of=lambda n: n["n_per"] // 4,
                                     repeats=cfg["pair_repeats"])
    res["analysis"] = analyse_wp(res, cfg["targets"], cfg["floor"])
    res["analysis_quarter"] = analyse_wp(res, cfg["targets_quarter"], cfg["floor"],
                                         err_key="error_quarter")
    plot_wp(res, RESULTS / f"constrained_wp_pendulum{TAG}.png",
            f"Planar Cartesian pendulum, theta_max = {th}, {P_} periods", A1_PANELS)
    return res


# --------------------------------------------------------------------------------------------
# Part a2: 3-D double pendulum against a reference
# --------------------------------------------------------------------------------------------


def part_a2(cfg):
    system = vj.systems.DoublePendulum3D()
    q0, v0 = system.initial_conditions(dtype=jnp.float64)
    v0 = vj.constraints.project_velocity(system, q0, v0)
    T, ns_ = cfg["T"], cfg["n_saves"]
    ts = np.linspace(0.0, T, ns_ + 1)
    log(f"\n[a2] 3-D double pendulum (our initial data), T = {T}, error = max over t in "
        f"{ts[1:].tolist()} of the max-norm q error")
    # reference: DOP853 on the index-1 ODE
    f = jax.jit(index_reduced_rhs(system))
    y0 = np.concatenate([np.asarray(q0), np.asarray(v0)])
    t0 = time.perf_counter()
    ref = solve_ivp(lambda t, y: np.asarray(f(y)), (0.0, T), y0, method="DOP853",
                    rtol=cfg["ref_rtol"], atol=cfg["ref_atol"], t_eval=ts)
    t_ref = time.perf_counter() - t0
    q_ref = ref.y[:6].T
    g_ref, gv_ref = constraint_residuals(system, ref.y[:6].T, ref.y[6:].T)
    # cross-check: a fine high-order vijax run
    ck, cn = cfg["ref_check"]
    run = constrained_runner(system, METHODS[ck][2](), cn, cn // ns_)
    out = jax.block_until_ready(run(q0, v0, T / cn))
    q_chk = np.asarray(out["q"])
    unc = float(np.max(np.abs(q_chk[1:] - q_ref[1:])))
    log(f"  reference: DOP853 rtol={cfg['ref_rtol']:g} atol={cfg['ref_atol']:g} on the "
        f"index-1 ODE ({ref.nfev} rhs calls, {t_ref:.1f} s; drift max|g| = "
        f"{np.max(g_ref):.1e}, max|Gv| = {np.max(gv_ref):.1e}); |ref - {label(ck)} "
        f"(h = {T / cn:g})| = {unc:.2e}")
    res = dict(problem="3-D double pendulum (DoublePendulum3D, initial_conditions(), v0 "
               "projected)", T=T, save_times=ts.tolist(),
               reference=f"scipy DOP853 rtol={cfg['ref_rtol']}, atol={cfg['ref_atol']} on the "
               "index-1 ODE M a = f - G^T lam(q, v) (eq. (70))",
               reference_uncertainty=unc,
               reference_check=f"{label(ck)} with {cn} steps (h = {T / cn:g})",
               reference_constraint_drift=dict(max_g=float(np.max(g_ref)),
                                                max_Gv=float(np.max(gv_ref))),
               methods={})
    for key, ns in cfg["n_steps"].items():
        rows = sweep("a2", system, key, [dict(n_steps=n) for n in ns], q0, v0,
                     dt_of=lambda n: T / n["n_steps"],
                     save_every_of=lambda n: n["n_steps"] // ns_,
                     err_of=lambda q: dict(error=float(np.max(np.abs(q[1:] - q_ref[1:])))),
                     repeats=cfg["repeats"], budget=cfg["budget"], tag="n_steps")
        res["methods"][key] = dict(label=label(key), nominal_order=METHODS[key][1], points=rows)
    res["pair_timing"] = pair_timing("a2", res, system, q0, v0,
                                     dt_of=lambda n: T / n["n_steps"],
                                     save_every_of=lambda n: n["n_steps"] // ns_,
                                     repeats=cfg["pair_repeats"])
    floor = max(cfg["floor"], 10 * unc)
    res["analysis"] = analyse_wp(res, [t for t in cfg["targets"] if t >= floor], floor)
    plot_wp(res, RESULTS / f"constrained_wp_double_pendulum3d{TAG}.png",
            f"3-D double pendulum, T = {T}", A2_PANELS, hline=unc)
    return res


A1_PANELS = [("error", "max_j |q(j T_p) - q0|  (whole periods, Wenger et al. 2017, §4.3)"),
             ("error_quarter", "max over quarter periods |q - q_exact|")]
A2_PANELS = [("error", "max-norm q error at the save points")]


def plot_wp(res, path, title, panels, hline=None):
    """Work-precision panels ``[(error key, y label), ...]`` and the per-step cost vs s."""
    import matplotlib.pyplot as plt

    n = len(panels)
    fig, axes = plt.subplots(1, n + 1, figsize=(6.5 * n + 5, 5.4),
                             gridspec_kw=dict(width_ratios=[1.5] * n + [1]))
    for j, (ax, (err_key, ylabel)) in enumerate(zip(axes[:n], panels)):
        for key, m in res["methods"].items():
            pts = [p for p in m["points"] if usable(p, err_key) and p[err_key] > 0]
            if not pts:
                continue
            ax.loglog([p["time"] for p in pts], [max(p[err_key], 1e-16) for p in pts],
                      label=f"{label(key)} (ord {METHODS[key][1]})", ms=4, **style(key))
            unc = [p for p in pts if not p["converged"]]   # accurate, but flagged by Newton
            if unc:
                ax.loglog([p["time"] for p in unc], [p[err_key] for p in unc], "o", ms=9,
                          mfc="none", color="r", lw=0)
            bad = [p for p in m["points"] if "time" in p and not usable(p, err_key)]
            if bad:   # divergent runs: drawn at the top of the axis
                ax.loglog([p["time"] for p in bad], [1.0] * len(bad), "x",
                          color=style(key)["color"], ms=8)
        if hline:
            ax.axhline(hline, color="k", lw=0.8, ls=":", label="reference uncertainty")
        ax.set_xlabel("wall time [s] (median, compile excluded)")
        ax.set_ylabel(ylabel)
        ax.set_title(title + "\n(x at 1: divergent run; red ring: Newton reported "
                     "non-convergence)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if j == 0:
            ax.legend(fontsize=7, ncol=2)
    ax2 = axes[n]
    # per-step cost vs s
    ps = res["analysis"]["per_step"]
    for fam, keys, st in (("GalerkinVI Gauss", [f"gauss{s}" for s in range(1, 7)], "o-"),
                          ("GalerkinVI Lobatto", ["glob2", "glob5"], "s--"),
                          ("HolonomicVPRK Lobatto", [f"vprk_lob{s}" for s in range(2, 6)],
                           "^:")):
        ks = [k for k in keys if k in ps]
        if not ks:
            continue
        s_vals = [int("".join(c for c in k if c.isdigit())) for k in ks]
        ax2.plot(s_vals, [ps[k]["us_per_step"] for k in ks], st, label=fam)
        for sv, k in zip(s_vals, ks):
            ax2.annotate(f"{ps[k]['mean_iterations']:.1f}", (sv, ps[k]["us_per_step"]),
                         fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax2.set_xlabel("s (stages / polynomial degree)")
    ax2.set_ylabel("wall time per step [us] (longest run)")
    ax2.set_title("per-step cost (labels: Newton iterations / step)", fontsize=10)
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Part b: long-time energy and constraint at equal wall time
# --------------------------------------------------------------------------------------------


def part_b(cfg):
    T, n_save = cfg["T"], cfg["n_save"]
    ts = np.linspace(0.0, T, n_save + 1)
    th, om = cfg["theta0"], cfg["omega0"]
    cart = vj.systems.CartesianPendulum()
    mini = vj.systems.Pendulum()
    q0 = jnp.asarray([math.sin(th), -math.cos(th)], jnp.float64)
    v0 = om * jnp.asarray([math.cos(th), math.sin(th)], jnp.float64)
    E0 = float(cart.energy(q0, v0))
    log(f"\n[b] long-time energy/constraint at equal wall time: planar pendulum, theta0 = {th}"
        f", theta_dot0 = {om} (our defaults), T = {T:g}, {n_save} save points; "
        f"E0 = {E0:.15g}")
    ir_check = check_index_reduced(cart, q0, v0)
    res = dict(problem="planar pendulum (m = l = 1, g = 9.81)", T=T, n_save=n_save,
               theta0=th, omega0=om, E0=E0, index_reduced_rhs_vs_vijax_multiplier=ir_check,
               vijax={}, peers={}, ratios={}, series_t=series(ts))
    e_cart = jax.jit(jax.vmap(cart.energy))
    e_min = jax.jit(jax.vmap(mini.energy))
    for key, hs in cfg["h"].items():
        for h in hs:
            n = int(round(T / h))
            n -= n % n_save
            vkey = f"{key}@h={h:g}"
            run = constrained_runner(cart, METHODS[key][2](), n, n // n_save)
            out, med, times, comp = measure(run, q0, v0, T / n, repeats=cfg["repeats"],
                                            budget=cfg["time_budget"], warm="aot")
            q, v = np.asarray(out["q"]), np.asarray(out["v"])
            de = np.asarray(e_cart(q, v)) - E0
            g, gv = constraint_residuals(cart, q, v)
            res["vijax"][vkey] = dict(
                method=key, h=T / n, n_steps=n, time=med, times=times, compile_s=comp,
                max_abs_dE=float(np.max(np.abs(de))), max_g=float(np.max(g)),
                max_Gv=float(np.max(gv)), mean_iterations=float(out["it"]),
                converged=bool(out["ok"]), load1=loadavg()[0], dE=series(de),
                g=series(g), Gv=series(gv))
            log(f"  {label(key):30s} h={T / n:<7.3g} max|dE|={np.max(np.abs(de)):9.2e} "
                f"max|g|={np.max(g):8.1e} max|Gv|={np.max(gv):8.1e} time={med:7.3f} s "
                f"it/step={float(out['it']):.2f} compile={comp:.2f} s"
                + ("" if bool(out["ok"]) else "  NOT CONVERGED"))
    for key, hs in cfg.get("h_minimal", {}).items():
        for h in hs:
            n = int(round(T / h))
            n -= n % n_save
            vkey = f"{key}@h={h:g}"
            run = constrained_runner(mini, METHODS[key][2](), n, n // n_save)
            out, med, times, comp = measure(run, jnp.asarray([th]), jnp.asarray([om]), T / n,
                                            repeats=cfg["repeats"], budget=cfg["time_budget"],
                                            warm="aot")
            de = np.asarray(e_min(out["q"], out["v"])) - E0
            res["vijax"][vkey] = dict(
                method=key, coords="minimal", h=T / n, n_steps=n, time=med, times=times,
                compile_s=comp, max_abs_dE=float(np.max(np.abs(de))), max_g=None,
                max_Gv=None, mean_iterations=float(out["it"]), converged=bool(out["ok"]),
                load1=loadavg()[0], dE=series(de))
            log(f"  {label(key):30s} h={T / n:<7.3g} max|dE|={np.max(np.abs(de)):9.2e} "
                f"time={med:7.3f} s it/step={float(out['it']):.2f} compile={comp:.2f} s"
                + ("" if bool(out["ok"]) else "  NOT CONVERGED"))
    budgets = [r["time"] for r in res["vijax"].values()]
    bmax, bmin = max(budgets), min(budgets)
    for pkey in cfg["peers"]:
        plabel, cls, eqs, mode = PEERS[pkey]
        if eqs == "minimal":
            vf, y0 = P.vector_field(mini), jnp.asarray([th, om], jnp.float64)
        else:
            fl = index_reduced_rhs(cart)
            vf, y0 = (lambda t, y, args, fl=fl: fl(y)), jnp.concatenate([q0, v0])
        # knobs ordered from cheap to expensive: tolerances (adaptive) or step counts (fixed)
        if mode == "adaptive":
            knobs = sorted(cfg["tols"], reverse=True)
            start = int(np.argmin(np.abs(np.log(knobs) - np.log(cfg["start_tol"]))))
            max_steps = cfg["max_steps"]
        else:
            knobs = [int(round(T * k)) for k in cfg["fixed_steps_per_unit_time"]]
            start = int(np.argmin(np.abs(np.log(knobs) - np.log(T * cfg["fixed_start"]))))
            max_steps = max(knobs) + 10
        t0 = time.perf_counter()
        run = diffrax_runner(vf, cls(), T, saveat_ts=ts, step_ts=(mode == "adaptive"),
                             adaptive=(mode == "adaptive"),
                             max_steps=max_steps).lower(y0, 1e-6, 0.1).compile()
        comp = time.perf_counter() - t0
        rows = {}

        def evaluate(i, run=run, y0=y0, eqs=eqs, mode=mode, knobs=knobs, plabel=plabel,
                     rows=rows):
            tol, dt = (knobs[i], 0.0) if mode == "adaptive" else (0.0, T / knobs[i])
            (ys, nsteps, _, ok), med, times, _ = measure(
                run, y0, tol, dt, repeats=cfg["repeats"], budget=cfg["time_budget"],
                warm=False)
            ys = np.asarray(ys)
            row = dict(time=med, times=times, num_steps=int(nsteps), success=bool(ok),
                       load1=loadavg()[0])
            row.update(dict(tol=tol) if mode == "adaptive" else dict(h=dt))
            if eqs == "minimal":
                de = np.asarray(e_min(ys[:, :1], ys[:, 1:])) - E0
            else:
                de = np.asarray(e_cart(ys[:, :2], ys[:, 2:])) - E0
                g, gv = constraint_residuals(cart, ys[:, :2], ys[:, 2:])
                row.update(max_g=float(np.max(g)), max_Gv=float(np.max(gv)),
                           final_g=float(g[-1]), final_Gv=float(gv[-1]), g=series(g),
                           Gv=series(gv))
            row.update(max_abs_dE=float(np.max(np.abs(de))) if bool(ok) else float("nan"),
                       dE=series(de))
            rows[i] = row
            extra = (f" max|g|={row['max_g']:8.1e} max|Gv|={row['max_Gv']:8.1e}"
                     if "max_g" in row else "")
            log(f"  {plabel:44s} {knob_str(row)} max|dE|={row['max_abs_dE']:9.2e}{extra} "
                f"time={med:7.3f} s steps={int(nsteps)}" + ("" if ok else "  FAILED"))
            return row

        # bracket [min budget, overshoot x max budget] (benchmarks/run.py part b)
        r = evaluate(start)
        i = start
        while i + 1 < len(knobs) and r["success"] and r["time"] <= cfg["overshoot"] * bmax:
            i += 1
            r = evaluate(i)
        i, r = start, rows[start]
        while i > 0 and (not r["success"] or r["time"] > bmin):
            if not r["success"] and i < start:
                break
            i -= 1
            r = evaluate(i)
        res["peers"][pkey] = dict(label=plabel, equations=eqs, mode=mode, compile_s=comp,
                                  rows=[rows[k] for k in sorted(rows)])
    # equal-cost comparisons
    for vkey, vr in res["vijax"].items():
        for pkey, pr in res["peers"].items():
            ok = [r for r in pr["rows"] if r["success"] and np.isfinite(r["max_abs_dE"])]
            ge = [r for r in ok if r["time"] >= vr["time"]]
            le = [r for r in ok if r["time"] <= vr["time"]]
            entry = dict(vijax_time=vr["time"], vijax_max_abs_dE=vr["max_abs_dE"])

            def take(r, how, entry=entry, vr=vr):
                entry.update(ratio=r["max_abs_dE"] / vr["max_abs_dE"], peer_knob=knob_str(r),
                             peer_time=r["time"], peer_max_abs_dE=r["max_abs_dE"],
                             peer_steps=r["num_steps"], selection=how)
                if "max_g" in r:
                    entry.update(peer_max_g=r["max_g"], peer_max_Gv=r["max_Gv"])

            if ge:   # the cheapest peer run that had at least vijax's wall time
                take(min(ge, key=lambda r: r["time"]), "time >= vijax")
            elif le:  # the peer cannot spend as much: its most accurate (cheaper) run
                take(min(le, key=lambda r: r["max_abs_dE"]),
                     "no run as slow as vijax: most accurate run (cheaper than vijax)")
            else:
                entry.update(ratio=None, note="no successful peer run")
            if le:   # the most accurate peer run within vijax's wall time (run.py's rule)
                l_ = min(le, key=lambda r: r["max_abs_dE"])
                entry.update(ratio_within_budget=l_["max_abs_dE"] / vr["max_abs_dE"],
                             within_budget_knob=knob_str(l_), within_budget_time=l_["time"])
            e_int = error_at_time([r["time"] for r in ok], [r["max_abs_dE"] for r in ok],
                                  vr["time"])
            entry["ratio_interpolated"] = (e_int / vr["max_abs_dE"]) if e_int else None
            res["ratios"][f"{pkey}/{vkey}"] = entry
    plot_b(res, ts)
    return res


def plot_b(res, ts):
    import matplotlib.pyplot as plt

    ts = np.asarray(res.get("series_t", series(ts)))

    keys = list(res["vijax"])
    fig, axes = panel_grid(len(keys), 5.2, 3.9)
    for ax, vkey in zip(axes.flat, keys):
        vr = res["vijax"][vkey]
        ax.semilogy(ts[1:], np.abs(vr["dE"][1:]) + 1e-18, color=style(vkey)["color"],
                    label=f"{label(vr['method'])} h={vr['h']:.3g} ({vr['time']:.2f} s)")
        for pkey, pr in res["peers"].items():
            r = res["ratios"].get(f"{pkey}/{vkey}", {})
            if r.get("peer_knob") is None:
                continue
            row = next(x for x in pr["rows"] if knob_str(x) == r["peer_knob"])
            ax.semilogy(ts[1:], np.abs(row["dE"][1:]) + 1e-18, color=style(pkey)["color"],
                        ls=style(pkey)["ls"], lw=1,
                        label=f"{pr['label']} {knob_str(row).strip()} ({row['time']:.2f} s)")
        ax.set_title(f"equal cost as {label(vkey)}", fontsize=8)
        ax.set_xlabel("t")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for row_axes in axes:
        row_axes[0].set_ylabel("|E(t) - E(0)|")
    fig.suptitle(f"Energy error at equal wall time: {res['problem']}, T = {res['T']:g}")
    fig.tight_layout()
    fig.savefig(RESULTS / f"constrained_energy{TAG}.png", dpi=120)
    plt.close(fig)
    # constraint residuals
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for j, (name, ylabel) in enumerate((("g", "max |g(q(t))|"), ("Gv", "max |G(q) v|"))):
        ax = axes[j]
        for vkey, vr in res["vijax"].items():
            if vr.get("coords") == "minimal":
                continue
            ax.semilogy(ts, np.abs(vr[name]) + 1e-18, color=style(vkey)["color"], lw=1,
                        label=f"{label(vr['method'])} h={vr['h']:.3g}")
        for pkey, pr in res["peers"].items():
            if pr["equations"] != "index_reduced":
                continue
            rows = [r for r in pr["rows"] if r["success"]]
            for i, r in enumerate(rows):
                ax.semilogy(ts, np.abs(r[name]) + 1e-18, color=style(pkey)["color"],
                            ls=style(pkey)["ls"], lw=0.8, alpha=0.35 + 0.65 * i / max(
                                len(rows) - 1, 1),
                            label=f"{pr['label']} {knob_str(r).strip()}"
                            if i in (0, len(rows) - 1) else None)
        ax.set_xlabel("t")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle("Constraint residuals: vijax (projected / stiffly accurate) vs explicit "
                 "index-reduced ODE (no projection)", fontsize=10)
    fig.tight_layout()
    fig.savefig(RESULTS / f"constrained_constraint{TAG}.png", dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def _t(x):
    return "n/a" if x is None else (f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s")


def summary_wp(name, r):
    a = r["analysis"]
    aq = r.get("analysis_quarter")
    lines = [f"--- ({name}) {r['problem']}"]
    if "reference_uncertainty" in r:
        lines.append(f"    reference: {r['reference']}; uncertainty {r['reference_uncertainty']:.1e}"
                     f" ({r['reference_check']})")
    lines.append("    method                                 ord  observed" +
                 (" (quarter)" if aq else "") +
                 "  us/step (cpu)  it/step  compile  unconverged runs (n_steps)")
    for k, p in a["per_step"].items():
        oo = p["observed_order"]
        oq = aq["per_step"][k]["observed_order"] if aq else None
        obs = fmt(oo, "5.1f") if oo else "  n/a"
        if aq:
            obs += f" ({fmt(oq, '4.1f') if oq else 'n/a'})     "
        lines.append(f"    {label(k):38s} {p['nominal_order']:3d}  {obs}     "
                     f"{p['us_per_step']:7.1f} ({p['us_per_step_cpu']:6.1f})  "
                     f"{p['mean_iterations']:5.2f}  {fmt(p['compile_s_median'], '5.2f')} s  "
                     f"{p['unconverged_runs'] or '-'}"
                     + (f"; divergent (err > {DIVERGED}): {p['divergent_runs']}"
                        if p.get("divergent_runs") else ""))
    for akey in ("analysis", "analysis_quarter"):
        if akey in r:
            lines += _summary_claims(r, r[akey])
    return lines


def _summary_claims(r, a):
    measure = a.get("error_measure", "error")
    lines = [f"  error measure '{measure}': {r.get(measure, r.get('error', ''))}"
             if isinstance(r.get(measure), str) else f"  error measure '{measure}'"]
    lines.append("    time to reach a target error (log-log interpolation on the Pareto front; "
                 "'>' = lower bound, '~' = extrapolated):")
    for tgt, s in a["targets"].items():
        parts = []
        for k, v in s["times"].items():
            if v["reached"]:
                parts.append(f"{k}={_t(v['time'])}")
            else:
                parts.append(f"{k}>{_t(v['lower_bound'])}" +
                             (f"(~{_t(v['extrapolated'])})" if v.get("extrapolated") else ""))
        lines.append(f"      err<={tgt}: " + "  ".join(parts))
        ver = s["s_ge_3_beats_s1"]
        if ver:
            vs = []
            for k, v in ver.items():
                if v.get("met") is None:
                    vs.append(f"{k}: n/a")
                else:
                    sp = (f"{'>=' if v['speedup_is_lower_bound'] else ''}{v['speedup']:.3g}x"
                          + (f" (~{v['speedup_extrapolated']:.3g}x extrap.)"
                             if v.get("speedup_extrapolated") else ""))
                    vs.append(f"{k}: {'MET' if v['met'] else 'MISS'} {sp}")
            lines.append("        Fig. 4, s>=3 faster than s=1: " + "; ".join(vs))
    lines.append(f"    Fig. 4, error at fixed run time falls monotonically with s (errors "
                 f"<= {a['fixed_time_floor']:.0e} count as equal): "
                 f"{ {True: 'MET', False: 'MISS', None: 'n/a (no overlap of run times)'}[a['monotone_at_all_fixed_times']]}")
    for t, v in a["fixed_time"].items():
        errs = "  ".join(f"s{k[5:]}={fmt(e, '.1e') if e is not None else 'n/a'}"
                         for k, e in v["errors"].items())
        lines.append(f"      t={_t(float(t)):>9s}: {errs}  "
                     + ("ok" if v["monotone"] else "VIOLATED: " + "; ".join(v["violations"])))
    for s, v in a["gauss_vs_lobatto"].items():
        mx = v["max_abs_log10_err_ratio_above_floor"]
        lines.append(f"    Fig. 5 ({s}, Lobatto r=s+1 vs Gauss r=s at equal h): max "
                     f"|log10(err_L/err_G)| = {fmt(mx, '.2g') if mx is not None else 'n/a'} "
                     f"(same accuracy: {'MET' if mx is not None and mx < 0.05 else 'CHECK'}); "
                     f"median time ratio L/G = {v['median_time_ratio']:.3f} (cpu "
                     f"{v['median_cpu_ratio']:.3f}; Gauss faster in "
                     f"{100 * v['gauss_faster_fraction']:.0f}% of h) "
                     f"[{'MET' if v['median_time_ratio'] >= 1 else 'MISS'}]")
    return lines


def summary(results):
    lines = ["", "=" * 100, "CONSTRAINED BENCHMARKS: SUMMARY", "=" * 100]
    for name in ("a1", "a2"):
        if name in results:
            lines += summary_wp(name, results[name]["results"])
            lines.append(f"    load average start/end: {results[name]['loadavg_start']} / "
                         f"{results[name]['loadavg_end']}")
    if "b" in results:
        r = results["b"]["results"]
        lines.append(f"--- (b) {r['problem']}, theta0 = {r['theta0']}, theta_dot0 = "
                     f"{r['omega0']}, T = {r['T']:g}")
        lines.append("    vijax (Cartesian unless noted):           h      time    max|dE|   "
                     "max|g|    max|Gv|   it/step")
        for vkey, v in r["vijax"].items():
            lines.append(f"      {label(v['method']):36s} {v['h']:6.3g} {v['time']:7.3f} s "
                         f"{v['max_abs_dE']:9.2e} {fmt(v['max_g'], '9.1e'):>9s} "
                         f"{fmt(v['max_Gv'], '9.1e'):>9s}  {v['mean_iterations']:.2f}")
        lines.append("    energy-error ratio peer/vijax at equal wall time (target >= 100); "
                     "peer = cheapest run with time >= vijax's [also: best run within vijax's "
                     "time; log-log interpolation]:")
        for k, e in r["ratios"].items():
            pkey, vkey = k.split("/", 1)
            if e.get("ratio") is None:
                lines.append(f"      [n/a ] {label(vkey):40s} vs {PEERS[pkey][0]:42s}: "
                             f"{e.get('note')}")
                continue
            met = "MET " if e["ratio"] >= 100 else "MISS"
            extra = (f" max|g|={e['peer_max_g']:.1e} max|Gv|={e['peer_max_Gv']:.1e}"
                     if "peer_max_g" in e else "")
            cheaper = "" if e["selection"] == "time >= vijax" else " [peer cheaper: tightest]"
            lines.append(
                f"      [{met}] {label(vkey):40s} vs {PEERS[pkey][0]:42s}: {e['ratio']:9.3g} "
                f"[{fmt(e.get('ratio_within_budget'), '.3g')}; "
                f"{fmt(e.get('ratio_interpolated'), '.3g')}]  (vijax {e['vijax_time']:.3f} s "
                f"dE={e['vijax_max_abs_dE']:.2e}; peer {e['peer_knob'].strip()} "
                f"{e['peer_time']:.3f} s dE={e['peer_max_abs_dE']:.2e}{extra}){cheaper}")
        vg = max(v["max_g"] for v in r["vijax"].values() if v["max_g"] is not None)
        vgv = max(v["max_Gv"] for v in r["vijax"].values() if v["max_Gv"] is not None)
        lines.append(f"    constraint: vijax max|g| = {vg:.1e}, max|Gv| = {vgv:.1e} over all "
                     f"runs ({'MET' if vg < 1e-13 and vgv < 1e-12 else 'MISS'}: round-off "
                     f"level)")
        for pkey, pr in r["peers"].items():
            if pr["equations"] != "index_reduced":
                continue
            for row in pr["rows"]:
                if row["success"]:
                    lines.append(f"      {pr['label']:44s} {knob_str(row)} "
                                 f"time={row['time']:.3f} s  max|g|={row['max_g']:.1e} "
                                 f"max|Gv|={row['max_Gv']:.1e} (final {row['final_g']:.1e}, "
                                 f"{row['final_Gv']:.1e})  max|dE|={row['max_abs_dE']:.1e}")
        lines.append(f"    load average start/end: {results['b']['loadavg_start']} / "
                     f"{results['b']['loadavg_end']}")
    return lines


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main(argv=None):
    global RESULTS, TAG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (~2-3 min): smoke test")
    ap.add_argument("--parts", default="a1,a2,b", help="comma-separated subset of a1,a2,b "
                    "('a' = a1,a2)")
    ap.add_argument("--summary-only", action="store_true",
                    help="rebuild the summary and the plots from the JSON file and exit")
    ap.add_argument("--out", default=str(RESULTS), help="output folder")
    args = ap.parse_args(argv)
    RESULTS = Path(args.out)
    RESULTS.mkdir(parents=True, exist_ok=True)
    TAG = "_quick" if args.quick else ""
    cfg = QUICK if args.quick else FULL
    parts = []
    for p in args.parts.split(","):
        p = p.strip()
        parts += ["a1", "a2"] if p == "a" else ([p] if p else [])
    bad = set(parts) - {"a1", "a2", "b"}
    if bad:
        ap.error(f"unknown parts {sorted(bad)}; choose from a1, a2, b")
    path = RESULTS / f"constrained{TAG}.json"
    doc = unjson(json.loads(path.read_text())) if path.exists() else {"parts": {}}
    if args.summary_only:
        res = doc["parts"]
        for name in ("a1", "a2"):   # re-run the analysis on the stored measurements
            if name in res:
                r, c = res[name]["results"], res[name]["config"]
                floor = max(c["floor"], 10 * r.get("reference_uncertainty", 0.0))
                r["analysis"] = analyse_wp(r, [t for t in c["targets"] if t >= floor], floor)
                if "targets_quarter" in c:
                    r["analysis_quarter"] = analyse_wp(r, c["targets_quarter"], floor,
                                                       err_key="error_quarter")
        if "a1" in res:
            r = res["a1"]["results"]
            plot_wp(r, RESULTS / f"constrained_wp_pendulum{TAG}.png",
                    f"Planar Cartesian pendulum, theta_max = {r['theta_max']}, "
                    f"{r['n_periods']} periods", A1_PANELS)
        if "a2" in res:
            r = res["a2"]["results"]
            plot_wp(r, RESULTS / f"constrained_wp_double_pendulum3d{TAG}.png",
                    f"3-D double pendulum, T = {r['T']}", A2_PANELS,
                    hline=r["reference_uncertainty"])
        if "b" in res:
            r = res["b"]["results"]
            plot_b(r, np.linspace(0.0, r["T"], r["n_save"] + 1))
        write_summary(summary(res), RESULTS / f"constrained_summary{TAG}.txt")
        return
    info = machine_info()
    log(f"machine: {info['platform']} | {info['cpu']} x {info['cpu_count']} | jax "
        f"{info['jax']} | diffrax {info['diffrax']} | x64={info['x64']} | "
        f"{'QUICK' if args.quick else 'FULL'} | parts {','.join(parts)} | load {loadavg()}")
    t_start = time.perf_counter()
    fns = {"a1": part_a1, "a2": part_a2, "b": part_b}
    for p in ("a1", "a2", "b"):
        if p not in parts:
            continue
        t0 = time.perf_counter()
        load0 = loadavg()
        r = fns[p](cfg[p])
        dt = time.perf_counter() - t0
        log(f"[{p}] done in {dt:.1f} s (load average {load0} -> {loadavg()})")
        doc["parts"][p] = dict(part=p, machine=info, config=cfg[p], seconds=dt,
                               loadavg_start=load0, loadavg_end=loadavg(),
                               command=command_line("constrained.py", argv),
                               results=r)
        doc["parts"][p] = unjson(jsonable(doc["parts"][p]))
        path.write_text(json.dumps(jsonable(doc), indent=1))
    lines = summary(doc["parts"])
    write_summary(lines, RESULTS / f"constrained_summary{TAG}.txt", t_start,
                  command_line("constrained.py", argv))


if __name__ == "__main__":
    main()
