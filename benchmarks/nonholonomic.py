"""Nonholonomic benchmarks: NonholonomicVPRK, DiscreteGradient and the discrete
Lagrange-d'Alembert methods against diffrax on the index-1 ODE.

    python benchmarks/nonholonomic.py                 # full run (~15 min on 2 CPU cores)
    python benchmarks/nonholonomic.py --quick         # smoke test (< 2 min), *_quick files
    python benchmarks/nonholonomic.py --parts 2,4     # a subset of the parts 1, 2, 3, 4
    python benchmarks/nonholonomic.py --summary-only  # re-print the summary / re-plot from JSON
    python benchmarks/nonholonomic.py --parts 4 --tag _gpu_h200 \
        --batches 64,256,1024,4096,16384,65536,262144          # the ensemble part on a GPU

Parts (see benchmarks/README.md, "Nonholonomic benchmarks"):
  1  energy and constraint error vs cost over T = 1000 on the CVT gearbox of Celledoni, Farré
     Puiggalí, Høiseth & Martín de Diego (2016) and on one member of the chaotic ensemble of
     McLachlan & Perlmutter (2006) (energy sheet E0 = 3.06, m = 3): SI-DLA,
     NonholonomicVPRK.lobatto(2, 3, 4) (Martín de Diego & Sato Martín de Almagro (2022)),
     DiscreteGradient gonzalez / avf / gonzalez_full at a few step sizes each; diffrax Tsit5
     and Dopri8 (PIDController, tolerance sweep) on y = (q, v), v' = a(q, v).  Ratio of the
     energy errors at equal wall time and the constraint errors.
  2  per-step cost of a discrete-gradient step against an SI-DLA step (CVT, quartic system of
     McLachlan & Perlmutter (2006)), 1e4 steps of h = 0.1, with the root-solver and frame
     alternatives and a profile (cost outside the solve, cost per solver iteration).
  3  NonholonomicVPRK.lobatto(3) against SI-DLA / I-DLA: energy error vs cost (T = 100), time
     to reach 1e-6 and 1e-8 on each Pareto front.
  4  ensemble throughput of the chaotic energy-sheet study under jax.vmap: lobatto(2), (3)
     (vj.simulate_ensemble; --methods adds e.g. dg_gonzalez=0.2) against diffrax Tsit5 under
     jax.vmap, per batch size; where no Tsit5 step is as accurate, the ratio against its most
     accurate one.

Timing rules are those of benchmarks/run.py, whose helpers are imported: float64, every solver
inside its own jax.jit, compilation excluded (its time recorded separately), median of blocked
calls, process CPU time next to every wall time, machine info, vijax source hash and load
average in the JSON.  Output: results/nonholonomic{_quick}.json, nonholonomic_*{_quick}.png and
nonholonomic_summary{_quick}.txt.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (  # noqa: E402  (run.py also switches on float64, before any array exists)
    _once,
    _stats,
    command_line,
    diffrax_runner,
    fmt,
    jsonable,
    log,
    machine_info,
    error_at_time,
    time_at_error,
    timed,
    unjson,
    vijax_runner,
    write_summary,
)
from constrained import extrapolated_time, loadavg, series  # noqa: E402

import diffrax as dfx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import vijax as vj  # noqa: E402

jax.config.update("jax_enable_x64", True)

RESULTS = Path(__file__).resolve().parent / "results"
TAG = ""
E_SHEET = 3.06          # energy sheet of the chaotic study (McLachlan & Perlmutter (2006))
ROUND_OFF_PHI = 1e-14   # |Φ| at or below this counts as round-off (velocities are O(1))
ROUND_OFF_DE = 1e-11    # max |E - E0| / |E0| at or below this counts as energy kept (part 2)
DG_TOL = 0.01 * float(jnp.finfo(jnp.float64).eps)   # DiscreteGradient's default solver tolerance

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

FULL = {
    "1": dict(
        problems=["cvt", "chaotic"], T=1000.0, n_save=1000, repeats=3, time_budget=4.0,
        h={"cvt": {"si_dla": [0.1, 0.02, 0.005], "lob2": [0.1, 0.05], "lob3": [0.2, 0.1],
                   "lob4": [0.5, 0.2, 0.1], "dg_gonzalez": [0.2, 0.1], "dg_avf": [0.2, 0.1],
                   "dg_avf_sys": [0.2, 0.1], "dg_avf6": [0.2, 0.1],
                   "dg_gonzalez_full": [0.1, 0.05]},
           "chaotic": {"si_dla": [0.1, 0.02, 0.005], "lob2": [0.1, 0.05], "lob3": [0.2, 0.1],
                       "lob4": [0.5, 0.2, 0.1], "dg_gonzalez": [0.25, 0.1], "dg_avf": [0.25],
                       "dg_gonzalez_full": [0.1, 0.05]}},
        peers=["tsit5", "dopri8"], tols=[10.0 ** (-k / 2) for k in range(4, 29)],
        start_tol=1e-8, overshoot=1.3, max_steps=2_000_000,
    ),
    "2": dict(
        problems=["cvt", "quartic"], n_steps=10_000, h=0.1, save_every=1000, rounds=3,
        n_steps_slow=2000,   # AVF (12 quadrature nodes): fewer steps, same per-step measure
        profile_steps=2000, profile_updates=6,
    ),
    "3": dict(
        problems=["cvt", "chaotic"], T=100.0, n_save=100, repeats=3, time_budget=3.0,
        h={"lob3": [0.2, 0.1, 0.05, 0.025, 0.0125], "lob4": [0.4, 0.2, 0.1],
           "si_dla": [0.1, 0.03, 0.01, 0.003, 0.001, 0.0003, 0.0001],
           "i_dla": [0.1, 0.01, 0.001, 0.0003]},
        targets=[1e-4, 1e-6, 1e-8, 1e-10],
    ),
    "4": dict(
        batches=[64, 256, 1024, 4096], T=10.0, saves=10, repeats=2,
        vijax={"lob2": 0.1, "lob3": 0.2}, peer_dt=0.1,
        accuracy_members=64,
        peer_dts=[0.4, 0.2, 0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125, 0.0015625],
    ),
}

QUICK = {
    "1": dict(
        problems=["cvt"], T=100.0, n_save=100, repeats=2, time_budget=1.0,
        h={"cvt": {"si_dla": [0.1], "lob3": [0.1], "dg_gonzalez": [0.1]}},
        peers=["tsit5", "dopri8"], tols=[10.0 ** -k for k in range(3, 13)], start_tol=1e-7,
        overshoot=1.5, max_steps=500_000,
    ),
    "2": dict(problems=["cvt"], n_steps=2000, h=0.1, save_every=1000, rounds=2,
              n_steps_slow=500, profile_steps=500, profile_updates=4,
              configs=["si_dla", "dg_gonzalez", "dg_gonzalez_newton"], profile=["dg_gonzalez"]),
    "3": dict(problems=["cvt"], T=20.0, n_save=20, repeats=2, time_budget=1.0,
              h={"lob3": [0.2, 0.1, 0.05], "si_dla": [0.1, 0.01, 0.001]},
              targets=[1e-4, 1e-6]),
    "4": dict(batches=[64, 256], T=2.0, saves=4, repeats=2, vijax={"lob2": 0.1},
              peer_dt=0.1, accuracy_members=16, peer_dts=[0.4, 0.2, 0.1]),
}

DG = vj.DiscreteGradient
DLA = vj.DiscreteLagrangeDAlembert
METHODS = {  # key -> (label, factory)
    "si_dla": ("SI-DLA", DLA.semi_implicit),
    "i_dla": ("I-DLA", DLA.implicit),
    **{f"lob{s}": (f"NonholonomicVPRK.lobatto({s})", lambda s=s: vj.NonholonomicVPRK.lobatto(s))
       for s in (2, 3, 4)},
    "dg_gonzalez": ("DG Gonzalez-R", DG.gonzalez),
    "dg_avf": ("DG AVF(12)-R", DG.avf),
    "dg_avf_sys": ("DG AVF(12)-R system frame", lambda: DG.avf(frame="system")),
    # six nodes keep the CVT gearbox's energy to round-off at h = 0.1 and 0.2 (docs/
    # discrete_gradients.md, the node study), at 0.59x the step of twelve
    "dg_avf6": ("DG AVF(6)-R", lambda: DG.avf(nodes=6)),
    "dg_gonzalez_full": ("DG Gonzalez-F", DG.gonzalez_full),
}
# part 2: the discrete-gradient step with the alternatives it accepts (solver=, frame=)
STEP_CONFIGS = {
    "si_dla": ("SI-DLA (Newton)", DLA.semi_implicit),
    "i_dla": ("I-DLA (Newton)", DLA.implicit),
    "dg_gonzalez": ("Gonzalez-R, fixed point eps/100, QR frame [default]", DG.gonzalez),
    "dg_gonzalez_sys": ("Gonzalez-R, fixed point, system frame", lambda: DG.gonzalez(
        frame="system")),
    "dg_gonzalez_newton": ("Gonzalez-R, Newton eps/100, QR frame", lambda: DG.gonzalez(
        solver=vj.solvers.Newton(rtol=DG_TOL, atol=DG_TOL))),
    "dg_gonzalez_newton_sys": ("Gonzalez-R, Newton, system frame", lambda: DG.gonzalez(
        frame="system", solver=vj.solvers.Newton(rtol=DG_TOL, atol=DG_TOL))),
    "dg_gonzalez_sn": ("Gonzalez-R, SimplifiedNewton, QR frame", lambda: DG.gonzalez(
        solver=vj.solvers.SimplifiedNewton(rtol=DG_TOL, atol=DG_TOL))),
    "dg_avf": ("AVF(12)-R, fixed point, QR frame [default]", DG.avf),
    "dg_avf_newton": ("AVF(12)-R, Newton, QR frame", lambda: DG.avf(
        solver=vj.solvers.Newton(rtol=DG_TOL, atol=DG_TOL))),
    "dg_avf_sys": ("AVF(12)-R, fixed point, system frame", lambda: DG.avf(frame="system")),
    "dg_avf6": ("AVF(6)-R, fixed point, QR frame", lambda: DG.avf(nodes=6)),
    "dg_gonzalez_full": ("Gonzalez-F, Newton [default]", DG.gonzalez_full),
    "lob3": ("NonholonomicVPRK.lobatto(3), fixed point [default]", METHODS["lob3"][1]),
    "lob3_sn": ("NonholonomicVPRK.lobatto(3), SimplifiedNewton", lambda: vj.NonholonomicVPRK.lobatto(
        3, solver=vj.solvers.SimplifiedNewton())),
}
SLOW_CONFIGS = ("dg_avf", "dg_avf_newton", "dg_avf_sys")
# part 2 profile: the solver each configuration's updates are made of
PROFILE = {
    "si_dla": ("si_dla", lambda: vj.solvers.Newton()),
    "dg_gonzalez": ("dg_gonzalez", lambda: vj.solvers.FixedPoint(rtol=DG_TOL, atol=DG_TOL)),
    "dg_gonzalez_newton": ("dg_gonzalez", lambda: vj.solvers.Newton(rtol=DG_TOL, atol=DG_TOL)),
    "dg_gonzalez_sn": ("dg_gonzalez", lambda: vj.solvers.SimplifiedNewton(rtol=DG_TOL,
                                                                          atol=DG_TOL)),
}
PEERS = {"tsit5": ("diffrax Tsit5", dfx.Tsit5), "dopri8": ("diffrax Dopri8", dfx.Dopri8)}
TARGETED = ("lob3", "lob4", "dg_gonzalez", "dg_avf", "dg_avf_sys", "dg_avf6",   # part 1 targets
            "dg_gonzalez_full")

STYLE = {"si_dla": ("C0", "o"), "i_dla": ("C9", "P"), "lob2": ("C1", "^"),
         "lob3": ("C2", "s"), "lob4": ("C6", "D"), "dg_gonzalez": ("C3", "v"),
         "dg_avf": ("C5", "*"), "dg_avf_sys": ("C5", "p"), "dg_avf6": ("C5", "h"),
         "dg_gonzalez_full": ("C8", "X"), "tsit5": ("C4", "."),
         "dopri8": ("C7", ".")}


def label(key):
    return (METHODS.get(key) or PEERS.get(key) or STEP_CONFIGS.get(key) or (key,))[0]


# --------------------------------------------------------------------------------------------
# Problems and the peers' vector fields
# --------------------------------------------------------------------------------------------


def cvt_acceleration(eps):
    """The CVT's acceleration written by hand (unit masses): with
    ``V = ½(q1² + q2²) + cos q3 - ε sin 2q3`` and ``Φ = q1' + sin(q3) q2'``, the equations
    ``a = -∇V + (1, sin q3, 0) λ`` and ``d/dt Φ = a1 + sin(q3) a2 + cos(q3) q3' q2' = 0`` give
    ``λ = (q1 + sin(q3) q2 - cos(q3) q2' q3') / (1 + sin² q3)``."""

    def vf(t, y, args):
        q1, q2, q3, v1, v2, v3 = (y[i] for i in range(6))
        s, c = jnp.sin(q3), jnp.cos(q3)
        lam = (q1 + s * q2 - c * v2 * v3) / (1.0 + s * s)
        return jnp.stack([v1, v2, v3, lam - q1, s * lam - q2, jnp.sin(q3)
                          + 2.0 * eps * jnp.cos(2.0 * q3)])

    return vf


def library_acceleration(system):
    """``y' = (v, a(q, v))`` with ``a`` from :func:`vijax.constraints.nonholonomic_acceleration`
    (the multiplier eliminated by autodiff)."""

    def vf(t, y, args):
        n = y.shape[-1] // 2
        a, _ = vj.constraints.nonholonomic_acceleration(system, y[:n], y[n:])
        return jnp.concatenate([y[n:], a])

    return vf


def check_cvt_field(system, samples=64, seed=0):
    """Largest difference between the hand-written CVT field and the library's
    acceleration at random states (raises above 1e-12)."""
    rng = np.random.default_rng(seed)
    ys = jnp.asarray(rng.normal(size=(samples, 6)))
    mine = jax.jit(jax.vmap(lambda y: cvt_acceleration(system.eps)(0.0, y, None)))(ys)
    ref = jax.jit(jax.vmap(lambda y: library_acceleration(system)(0.0, y, None)))(ys)
    gap = float(np.max(np.abs(np.asarray(mine) - np.asarray(ref))))
    if not gap <= 1e-12:
        raise AssertionError(f"hand-written CVT acceleration differs from "
                             f"vj.constraints.nonholonomic_acceleration by {gap:.2e}")
    return gap


def problem(name):
    """``dict(system, q0, v0, field, field_label, label)``."""
    if name == "cvt":
        system = vj.systems.CVTGearbox()
        q0, v0 = system.initial()
        return dict(system=system, q0=q0, v0=v0, field=cvt_acceleration(system.eps),
                    field_label="hand-written closed-form acceleration",
                    label="CVT gearbox (Celledoni et al. (2016), eps = 0.2), CVTGearbox.initial()")
    if name == "chaotic":
        system = vj.systems.ChaoticNonholonomic()
        q0, v0 = system.sample_energy_sheet(jax.random.PRNGKey(0), 1, energy=E_SHEET)
        return dict(system=system, q0=q0[0], v0=v0[0], field=library_acceleration(system),
                    field_label="vj.constraints.nonholonomic_acceleration (autodiff)",
                    label=f"chaotic nonholonomic system (McLachlan & Perlmutter (2006), m = 3),"
                          f" one member of the energy sheet E0 = {E_SHEET}")
    if name == "quartic":
        system = vj.systems.QuarticNonholonomic()
        q0, v0 = system.initial()
        return dict(system=system, q0=q0, v0=v0, field=library_acceleration(system),
                    field_label="vj.constraints.nonholonomic_acceleration (autodiff)",
                    label="quartic nonholonomic system (Celledoni et al. (2016), §4.1), "
                          "QuarticNonholonomic.initial()")
    raise KeyError(name)


def invariants(system):
    """jit(q, v) -> (E(t) - E(0), max_i |Φ_i(t)|) over the saved points."""

    @jax.jit
    def f(q, v):
        e = jax.vmap(system.energy)(q, v)
        phi = jax.vmap(system.nonholonomic)(q, v)
        return e - e[0], jnp.max(jnp.abs(phi), axis=-1)

    return f


def steps_for(T, h, n_save):
    n = max(int(round(T / h)), n_save)
    return n - n % n_save


def fixed_step_run(pb, key, h, T, n_save, inv, cfg):
    """One vijax method at step ``h`` over ``[0, T]`` (``n_save`` saves), compiled ahead of
    time and timed (``cfg``: repeats, time_budget); the row with max |dE| and max |Φ| over the
    saved points and the two series."""
    n = steps_for(T, h, n_save)
    run = vijax_runner(pb["system"], METHODS[key][1](), n, n // n_save)
    (t, q, v, it, ok), med, times, comp = timed(run, pb["q0"], pb["v0"], T / n,
                                                repeats=cfg["repeats"], warm="aot",
                                                budget=cfg["time_budget"])
    de, phi = (np.asarray(x) for x in inv(q, v))
    row = dict(method=key, h=T / n, n_steps=n, time=med, times=times, compile_s=comp,
               max_abs_dE=float(np.max(np.abs(de))), max_phi=float(np.max(phi)),
               mean_iterations=float(it), converged=bool(ok), load1=loadavg()[0],
               max_abs_q=float(np.max(np.abs(np.asarray(q)))))
    log(f"  {label(key):30s} h={T / n:<8.3g} max|dE|={row['max_abs_dE']:9.2e} "
        f"max|phi|={row['max_phi']:8.1e} time={med:8.4f} s (cpu {times['cpu_median']:.4f}) "
        f"it/step={float(it):.2f} compile={comp:.1f} s" + ("" if bool(ok) else "  NOT CONVERGED"))
    return row, de, phi


# --------------------------------------------------------------------------------------------
# Part 1: energy and constraint error vs cost, ratios at equal wall time
# --------------------------------------------------------------------------------------------


def sweep_peer(evaluate, n_knobs, start, lo, hi, overshoot):
    """Evaluate a peer's tolerances (index 0 = loosest) from ``start``: tighter until a run
    fails, takes more than ``overshoot * hi`` or the list ends, then looser until a run takes
    at most ``lo`` or fails.  Returns the evaluated rows by index."""
    rows = {}
    i = start
    while i < n_knobs:
        r = rows[i] = evaluate(i)
        if not r["success"] or r["time"] > overshoot * hi:
            break
        i += 1
    i = start
    while i > 0 and rows[i]["success"] and rows[i]["time"] > lo:
        i -= 1
        rows[i] = evaluate(i)
    return rows


def equal_time(vr, rows):
    """The peer run compared with a vijax run: the most accurate successful run whose wall
    time is at most vijax's (benchmarks/run.py part b); none fits: ratio inf."""
    fits = [r for r in rows if r["success"] and r["time"] <= vr["time"]]
    out = dict(vijax_time=vr["time"], vijax_max_abs_dE=vr["max_abs_dE"],
               vijax_max_phi=vr["max_phi"])
    if not fits:
        cheapest = min((r for r in rows if r["success"]), key=lambda r: r["time"], default=None)
        out.update(ratio=math.inf, note="no peer run as cheap as vijax" + (
            f"; cheapest took {cheapest['time']:.3g} s (tol {cheapest['tol']:.1e})"
            if cheapest else ""))
        return out
    best = min(fits, key=lambda r: r["max_abs_dE"])
    out.update(ratio=best["max_abs_dE"] / max(vr["max_abs_dE"], 1e-300), peer_tol=best["tol"],
               peer_time=best["time"], peer_max_abs_dE=best["max_abs_dE"],
               peer_max_phi=best["max_phi"], peer_steps=best["num_steps"])
    return out


def part_1(cfg):
    T, n_save = cfg["T"], cfg["n_save"]
    ts = np.linspace(0.0, T, n_save + 1)
    out = {}
    for name in cfg["problems"]:
        pb = problem(name)
        system, q0, v0 = pb["system"], pb["q0"], pb["v0"]
        inv = invariants(system)
        E0 = float(system.energy(q0, v0))
        log(f"\n[1] energy/constraint vs cost: {pb['label']}; T = {T:g}, {n_save} saves, "
            f"E0 = {E0:.15g}; peers' field: {pb['field_label']}")
        res = dict(problem=pb["label"], T=T, n_save=n_save, E0=E0, peer_field=pb["field_label"],
                   vijax={}, peers={}, ratios={}, series_t=series(ts))
        if name == "cvt":
            res["hand_written_vs_library_acceleration"] = check_cvt_field(system)
        for key, hs in cfg["h"][name].items():
            for h in hs:
                row, de, phi = fixed_step_run(pb, key, h, T, n_save, inv, cfg)
                res["vijax"][f"{key}@h={h:g}"] = dict(row, dE=series(de), phi=series(phi))
        vtimes = [r["time"] for r in res["vijax"].values()]
        y0 = jnp.concatenate([q0, v0])
        tols = sorted(cfg["tols"], reverse=True)
        start = int(np.argmin(np.abs(np.log(tols) - np.log(cfg["start_tol"]))))
        for pkey in cfg["peers"]:
            t0 = time.perf_counter()
            run = diffrax_runner(pb["field"], PEERS[pkey][1](), T, saveat_ts=ts, step_ts=True,
                                 max_steps=cfg["max_steps"]).lower(y0, 1e-6, 0.0).compile()
            comp = time.perf_counter() - t0

            def evaluate(i, run=run, pkey=pkey):
                (ys, nsteps, _, ok), med, times, _ = timed(
                    run, y0, tols[i], 0.0, repeats=cfg["repeats"], warm=False,
                    budget=cfg["time_budget"])
                ys = np.asarray(ys)
                de, phi = (np.asarray(x) for x in inv(ys[:, :q0.shape[0]], ys[:, q0.shape[0]:]))
                row = dict(tol=tols[i], time=med, times=times, num_steps=int(nsteps),
                           success=bool(ok), load1=loadavg()[0],
                           max_abs_dE=float(np.max(np.abs(de))) if bool(ok) else math.nan,
                           max_phi=float(np.max(phi)) if bool(ok) else math.nan,
                           final_phi=float(phi[-1]), dE=series(de), phi=series(phi))
                log(f"  {PEERS[pkey][0]:30s} tol={tols[i]:<8.1e} max|dE|={row['max_abs_dE']:9.2e}"
                    f" max|phi|={row['max_phi']:8.1e} time={med:7.3f} s (cpu "
                    f"{times['cpu_median']:.3f}) steps={int(nsteps)}" + ("" if ok else "  FAILED"))
                return row

            rows = sweep_peer(evaluate, len(tols), start, min(vtimes), max(vtimes),
                              cfg["overshoot"])
            res["peers"][pkey] = dict(compile_s=comp, rows=[rows[k] for k in sorted(rows)])
        for vkey, vr in res["vijax"].items():
            for pkey, pr in res["peers"].items():
                res["ratios"][f"{pkey}/{vkey}"] = equal_time(vr, pr["rows"])
        out[name] = res
        plot_part_1(res, RESULTS / f"nonholonomic_energy_{name}{TAG}.png")
    return out


def plot_part_1(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(18, 5.2))
    for j, (err, ylabel) in enumerate((("max_abs_dE", "max |E(t) - E(0)|"),
                                       ("max_phi", "max |Φ(q(t), v(t))|"))):
        ax = axes[j]
        methods = {}
        for vr in res["vijax"].values():
            methods.setdefault(vr["method"], []).append(vr)
        for key, rs in methods.items():
            color, marker = STYLE[key]
            rs = sorted(rs, key=lambda r: r["time"])
            ax.loglog([r["time"] for r in rs], [max(r[err], 1e-17) for r in rs], marker=marker,
                      color=color, ls="-", label=label(key))
        for pkey, pr in res["peers"].items():
            rs = sorted((r for r in pr["rows"] if r["success"]), key=lambda r: r["time"])
            ax.loglog([r["time"] for r in rs], [max(r[err], 1e-17) for r in rs],
                      color=STYLE[pkey][0], marker=".", ls="--", label=f"{PEERS[pkey][0]} (tol sweep)")
        ax.set_xlabel("wall time [s] (median, compile excluded)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if j == 0:
            ax.legend(fontsize=7)
    ax = axes[2]
    ts = np.asarray(res["series_t"])
    shown = {}
    for vkey, vr in res["vijax"].items():   # the cheapest run of each method
        if vr["method"] not in shown or vr["time"] < res["vijax"][shown[vr["method"]]]["time"]:
            shown[vr["method"]] = vkey
    for key, vkey in shown.items():
        vr = res["vijax"][vkey]
        ax.semilogy(ts[1:], np.abs(vr["dE"][1:]) + 1e-18, color=STYLE[key][0], lw=1,
                    label=f"{label(key)} h={vr['h']:.3g} ({vr['time']:.2f} s)")
    ref = shown.get("dg_gonzalez") or next(iter(shown.values()))
    for pkey, pr in res["peers"].items():
        r = res["ratios"].get(f"{pkey}/{ref}", {})
        row = next((x for x in pr["rows"] if x["tol"] == r.get("peer_tol")), None)
        if row is not None:
            ax.semilogy(ts[1:], np.abs(row["dE"][1:]) + 1e-18, color=STYLE[pkey][0], ls="--",
                        lw=1, label=f"{PEERS[pkey][0]} tol={row['tol']:.0e} ({row['time']:.2f} s,"
                                    f" equal time as {ref})")
    ax.set_xlabel("t")
    ax.set_ylabel("|E(t) - E(0)|")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    fig.suptitle(f"{res['problem']}, T = {res['T']:g}; peers: {res['peer_field']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Part 2: per-step cost of a discrete-gradient step against an SI-DLA step
# --------------------------------------------------------------------------------------------


class FixedUpdates(vj.solvers.AbstractRootSolver):
    """Profiling only: exactly ``max_steps`` updates of ``inner`` per solve, each scaled by
    1e-30 so that the iterate stays where the predictor put it and no update is skipped
    (``rtol = 0``, ``atol = 1e-300``: the increments, about 1e265 tolerances and all equal,
    never pass the stopping test, and the method's ``stall_level``, which would take them for
    round-off, is dropped; with ``atol = 0`` they were infinite, which the solver reports as
    a failed solve after one update).  The cost of a step with ``1 + k`` updates minus that
    with one is ``k`` times the cost of one update (:func:`part_2` checks the counts; a solver
    takes at least one update, ``max_steps >= 1``)."""

    inner: vj.solvers.AbstractRootSolver = vj.solvers.Newton()

    def solve(self, fn, x0, precond=None, *, has_aux=False, stall_level=None):
        return super().solve(fn, x0, precond, has_aux=has_aux)

    def _make_update(self, f, x0, precond):
        update = self.inner._make_update(f, x0, precond)

        def scaled(x):
            dx, r, aux = update(x)
            return 1e-30 * dx, r, aux

        return scaled


def with_solver(factory, solver):
    """The integrator ``factory()`` with its root solver replaced."""
    import equinox as eqx

    integ = factory()
    return eqx.tree_at(lambda m: m.solver, integ, solver, is_leaf=lambda x: x is None)


def interleaved(entries, rounds):
    """Compile and warm every entry (``key -> (fn, args)``), then time ``rounds`` rounds of all
    entries in turn, so that background load falls on all of them alike.  Returns
    ``key -> (output, median wall, times, first call)``."""
    out, wall, cpu = {}, {k: [] for k in entries}, {k: [] for k in entries}
    for k, (fn, args) in entries.items():
        out[k], first, _ = _once(fn, *args)
        out[k] = (out[k], first)
    for _ in range(rounds):
        for k, (fn, args) in entries.items():
            _, w, c = _once(fn, *args)
            wall[k].append(w)
            cpu[k].append(c)
    return {k: (out[k][0], float(np.median(wall[k])), _stats(wall[k], cpu[k]), out[k][1])
            for k in entries}


def part_2(cfg):
    h, se = cfg["h"], cfg["save_every"]
    configs = cfg.get("configs", list(STEP_CONFIGS))
    profiled = cfg.get("profile", list(PROFILE))
    res = dict(h=h, rounds=cfg["rounds"], systems={})
    for name in cfg["problems"]:
        pb = problem(name)
        system, q0, v0 = pb["system"], pb["q0"], pb["v0"]
        inv = invariants(system)
        log(f"\n[2] per-step cost: {pb['label']}, h = {h}")
        entries, steps = {}, {}
        for key in configs:
            n = cfg["n_steps_slow"] if key in SLOW_CONFIGS else cfg["n_steps"]
            steps[key] = n
            entries[key] = (vijax_runner(system, STEP_CONFIGS[key][1](), n, min(se, n)),
                            (q0, v0, h))
        k_up, n_prof = cfg["profile_updates"], cfg["profile_steps"]
        for key in profiled:
            base, make_solver = PROFILE[key]
            for k in (1, 1 + k_up):
                solver = FixedUpdates(inner=make_solver(), rtol=0.0, atol=1e-300,
                                      max_steps=k, min_steps=0)
                entries[f"profile:{key}:{k}"] = (
                    vijax_runner(system, with_solver(STEP_CONFIGS[base][1], solver), n_prof,
                                 n_prof), (q0, v0, h))
        timings = interleaved(entries, cfg["rounds"])
        rows, profile = {}, {}
        for key in configs:
            (t, q, v, it, ok), med, times, first = timings[key]
            de, phi = (np.asarray(x) for x in inv(q, v))
            n = steps[key]
            E0 = float(system.energy(q0, v0))
            rows[key] = dict(label=STEP_CONFIGS[key][0], n_steps=n, time=med, times=times,
                             first_call_s=first, us_per_step=med / n * 1e6,
                             us_per_step_cpu=times["cpu_median"] / n * 1e6,
                             mean_iterations=float(it), converged=bool(ok),
                             max_rel_dE=float(np.max(np.abs(de)) / abs(E0)),
                             max_phi=float(np.max(phi)))
            r = rows[key]
            log(f"  {r['label']:50s} {r['us_per_step']:8.2f} us/step (cpu "
                f"{r['us_per_step_cpu']:7.2f}) it/step={r['mean_iterations']:.2f} "
                f"max|dE|/E0={r['max_rel_dE']:.1e} max|phi|={r['max_phi']:.1e}"
                + ("" if r["converged"] else "  NOT CONVERGED"))
        for key in profiled:
            # wall-time medians of the interleaved rounds (XLA:CPU may run independent ops
            # of one step on both cores, so the CPU time can exceed the wall time)
            t1, tk = (timings[f"profile:{key}:{k}"][1] for k in (1, 1 + k_up))
            for k in (1, 1 + k_up):
                done = float(timings[f"profile:{key}:{k}"][0][3])
                if done != k:
                    raise AssertionError(f"profile {key}: {done} updates per step, not {k}")
            per_update = (tk - t1) / n_prof / k_up * 1e6
            outside = t1 / n_prof * 1e6 - per_update
            it = rows[key]["mean_iterations"] if key in rows else None
            profile[key] = dict(
                solver=type(PROFILE[key][1]()).__name__, us_outside_solve=outside,
                us_per_update=per_update, updates_per_step=it,
                predicted_us_per_step=(outside + it * per_update) if it else None,
                measured_us_per_step=rows[key]["us_per_step"] if key in rows else None,
                residual_evaluations_per_step=_evaluations(PROFILE[key][1](), it, q0.shape[0],
                                                           system, key))
            p = profile[key]
            log(f"  profile {key:16s} ({p['solver']}): outside the solve {outside:7.2f} us, "
                f"per update {per_update:7.2f} us x {fmt(it, '.2f')} updates -> "
                f"{fmt(p['predicted_us_per_step'], '.1f')} us predicted, "
                f"{fmt(p['measured_us_per_step'], '.1f')} measured (wall); "
                f"{p['residual_evaluations_per_step']}")
        ok = [k for k, r in rows.items() if k.startswith("dg_") and r["converged"]
              and r["max_rel_dE"] <= ROUND_OFF_DE and r["max_phi"] <= ROUND_OFF_PHI]
        fastest = min(ok, key=lambda k: rows[k]["us_per_step"]) if ok else None
        ratios = {}
        if "si_dla" in rows:
            base = rows["si_dla"]
            for key, r in rows.items():
                if key.startswith("dg_"):
                    ratios[key] = dict(ratio=r["us_per_step"] / base["us_per_step"],
                                       ratio_cpu=r["us_per_step_cpu"] / base["us_per_step_cpu"],
                                       target=3.0)
        res["systems"][name] = dict(problem=pb["label"], rows=rows, profile=profile,
                                    ratios_over_si_dla=ratios, fastest_correct_dg=fastest,
                                    load1=loadavg()[0])
    plot_part_2(res, RESULTS / f"nonholonomic_step_cost{TAG}.png")
    return res


def _evaluations(solver, it, n, system, key):
    """Residual evaluations per step as ``F`` values and Jacobians (``jax.jacfwd``: one value
    plus one tangent per unknown) from the mean update count."""
    if it is None:
        return None
    unknowns = (2 * n - system.nonholonomic(jnp.zeros(n), jnp.zeros(n)).shape[0]
                if key.startswith("dg_") else n + system.nonholonomic(jnp.zeros(n),
                                                                      jnp.zeros(n)).shape[0])
    if isinstance(solver, vj.solvers.SimplifiedNewton):
        return f"{it:.2f} F + 1 Jacobian ({unknowns} tangents) per step"
    if isinstance(solver, vj.solvers.Newton):
        return f"{it:.2f} Jacobians (F with {unknowns} tangents) per step"
    return f"{it:.2f} F per step"


def plot_part_2(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["systems"])
    fig, axes = plt.subplots(1, len(names), figsize=(8 * len(names), 5), squeeze=False)
    for ax, name in zip(axes[0], names):
        rows = res["systems"][name]["rows"]
        keys = list(rows)
        vals = [rows[k]["us_per_step_cpu"] for k in keys]
        bars = ax.bar(range(len(keys)), vals,
                      color=["C0" if "dla" in k else "C2" if "lob" in k else "C3" for k in keys])
        for b, k in zip(bars, keys):
            ax.text(b.get_x() + b.get_width() / 2, b.get_height(),
                    f"{b.get_height():.1f}\n{rows[k]['mean_iterations']:.1f} it",
                    ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([rows[k]["label"] for k in keys], rotation=40, ha="right", fontsize=7)
        ax.set_ylabel("CPU time per step [us] (median)")
        ax.set_title(f"{name}: per-step cost, h = {res['h']} (DLA blue, discrete gradients red, "
                     f"NonholonomicVPRK green)",
                     fontsize=9)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Part 3: NonholonomicVPRK s = 3 against DLA, energy error vs cost
# --------------------------------------------------------------------------------------------


def part_3(cfg):
    T, n_save = cfg["T"], cfg["n_save"]
    out = {}
    for name in cfg["problems"]:
        pb = problem(name)
        inv = invariants(pb["system"])
        log(f"\n[3] energy error vs cost: {pb['label']}; T = {T:g}, {n_save} saves")
        res = dict(problem=pb["label"], T=T, n_save=n_save, methods={}, at_error={})
        for key, hs in cfg["h"].items():
            res["methods"][key] = [fixed_step_run(pb, key, h, T, n_save, inv, cfg)[0] for h in hs]
        for tgt in cfg["targets"]:
            entry = {}
            for key, rows in res["methods"].items():
                good = [r for r in rows if r["converged"]]
                for clock in ("time", "cpu"):
                    tt = [r["time"] if clock == "time" else r["times"]["cpu_median"] for r in good]
                    ee = [r["max_abs_dE"] for r in good]
                    t_hit = time_at_error(tt, ee, tgt)
                    lower, extra = (None, None) if t_hit is not None else \
                        extrapolated_time(tt, ee, tgt)
                    entry.setdefault(key, {})[clock] = dict(
                        reached=t_hit is not None, time=t_hit, lower_bound=lower,
                        extrapolated=extra)
            ratios = {}
            if "lob3" in entry:
                for key in entry:
                    if key == "lob3":
                        continue
                    ratios[key] = {c: _cost_ratio(entry[key][c], entry["lob3"][c])
                                   for c in ("time", "cpu")}
            res["at_error"][f"{tgt:.0e}"] = dict(times=entry, ratio_over_lob3=ratios)
        out[name] = res
    plot_part_3(out, RESULTS / f"nonholonomic_pareto{TAG}.png")
    return out


def _cost_ratio(other, lob3):
    """``other's time / lobatto(3)'s time`` at a target error; a bound where one of them
    never reaches it (``kind``: "exact", "lower bound" (other never reached it), "upper bound"
    (lobatto(3) never did) or None)."""
    if lob3["reached"] and other["reached"]:
        return dict(ratio=other["time"] / lob3["time"], kind="exact")
    if lob3["reached"] and other["lower_bound"] is not None:
        return dict(ratio=other["lower_bound"] / lob3["time"], kind="lower bound",
                    extrapolated=(other["extrapolated"] / lob3["time"]
                                  if other["extrapolated"] else None))
    if other["reached"] and lob3["lower_bound"] is not None:
        return dict(ratio=other["time"] / lob3["lower_bound"], kind="upper bound")
    return dict(ratio=None, kind=None)


def plot_part_3(out, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(out), figsize=(7 * len(out), 5), squeeze=False)
    for ax, (name, res) in zip(axes[0], out.items()):
        for key, rows in res["methods"].items():
            rows = [r for r in rows if r["converged"]]
            color, marker = STYLE[key]
            ax.loglog([r["time"] for r in rows], [max(r["max_abs_dE"], 1e-17) for r in rows],
                      color=color, marker=marker, label=label(key))
            for r in rows:
                ax.annotate(f"h={r['h']:.3g}", (r["time"], max(r["max_abs_dE"], 1e-17)),
                            fontsize=6, textcoords="offset points", xytext=(3, 3))
        for tgt in res["at_error"]:
            ax.axhline(float(tgt), color="k", lw=0.6, ls=":")
        ax.set_xlabel("wall time [s] (median, compile excluded)")
        ax.set_ylabel(f"max |E(t) - E(0)|, t <= {res['T']:g}")
        ax.set_title(res["problem"], fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Part 4: ensemble throughput of the chaotic energy-sheet study
# --------------------------------------------------------------------------------------------


def ensemble_vijax(system, key, h, T, saves):
    """jit(q0, v0) -> μ(E, k) (vj.diagnostics.energy_variance) of vj.simulate_ensemble,
    compiled with vj.compiler_options() as docs/concepts.md tells users to (the peer keeps
    the default options, as its users run it)."""
    n = steps_for(T, h, saves)
    integ = METHODS[key][1]()

    @functools.partial(jax.jit, compiler_options=vj.compiler_options() or None)
    def run(q0, v0):
        sol = vj.simulate_ensemble(system, integ, q0=q0, v0=v0, dt=T / n, n_steps=n,
                                   save_every=n // saves, throw=False)
        return vj.diagnostics.energy_variance(system, sol), jnp.all(sol.stats.converged)

    return run, n


def ensemble_peer(system, field, T, saves, max_steps):
    """jit(q0, v0, dt) -> μ(E, k): diffrax Tsit5 with a constant step under jax.vmap."""
    term = dfx.ODETerm(field)
    ts = jnp.linspace(0.0, T, saves + 1)

    def one(y0, dt):
        sol = dfx.diffeqsolve(term, dfx.Tsit5(), 0.0, T, dt, y0, saveat=dfx.SaveAt(ts=ts),
                              stepsize_controller=dfx.ConstantStepSize(), max_steps=max_steps,
                              throw=False)
        return sol.ys, sol.result == dfx.RESULTS.successful

    @jax.jit
    def run(q0, v0, dt):
        ys, ok = jax.vmap(one, in_axes=(0, None))(jnp.concatenate([q0, v0], axis=1), dt)
        n = q0.shape[1]
        e = jax.vmap(jax.vmap(lambda y: system.energy(y[:n], y[n:])))(ys)
        return jnp.mean((e - e[:, :1]) ** 2, axis=0), jnp.all(ok)

    return run


def part_4(cfg):
    pb = problem("chaotic")
    system, T, saves = pb["system"], cfg["T"], cfg["saves"]
    log(f"\n[4] ensemble throughput: chaotic system, energy sheet E0 = {E_SHEET}, window "
        f"T = {T:g}, {saves} saves; device {jax.devices()[0]}; Tsit5 field: {pb['field_label']}")
    res = dict(problem=pb["label"], T=T, saves=saves, devices=[str(d) for d in jax.devices()],
               peer_field=pb["field_label"], accuracy={}, throughput={}, ratios={})
    dts = sorted(cfg["peer_dts"], reverse=True)
    peer = ensemble_peer(system, pb["field"], T, saves, int(round(T / min(dts))) + 10)
    # accuracy on a sub-ensemble: RMS energy error at the worst saved time
    qa, va = system.sample_energy_sheet(jax.random.PRNGKey(1), cfg["accuracy_members"],
                                        energy=E_SHEET)
    runners = {key: ensemble_vijax(system, key, h, T, saves) for key, h in cfg["vijax"].items()}
    for key, (run, n) in runners.items():
        mu, ok = run(qa, va)
        res["accuracy"][key] = dict(h=T / n, n_steps=n, rms_dE=float(np.sqrt(np.max(mu))),
                                    converged=bool(ok))
        log(f"  accuracy {label(key):28s} h={T / n:<7.3g} rms energy error "
            f"{res['accuracy'][key]['rms_dE']:.2e}")
    for dt in dts:
        mu, ok = peer(qa, va, dt)
        res["accuracy"][f"tsit5@dt={dt:g}"] = dict(h=dt, n_steps=int(round(T / dt)),
                                                   rms_dE=float(np.sqrt(np.max(mu))),
                                                   success=bool(ok))
        log(f"  accuracy {'diffrax Tsit5':28s} dt={dt:<6.3g} rms energy error "
            f"{float(np.sqrt(np.max(mu))):.2e}")
    for b in cfg["batches"]:
        q0, v0 = system.sample_energy_sheet(jax.random.PRNGKey(2), b, energy=E_SHEET)
        row = {}
        for key, (run, n) in runners.items():
            _, med, times, first = timed(run, q0, v0, repeats=cfg["repeats"])
            row[key] = dict(h=T / n, n_steps=n, time=med, times=times, first_call_s=first,
                            traj_steps_per_s=b * n / med,
                            traj_steps_per_s_cpu=b * n / times["cpu_median"],
                            traj_time_per_s=b * T / med)
        dt = cfg["peer_dt"]
        n = int(round(T / dt))
        _, med, times, first = timed(peer, q0, v0, dt, repeats=cfg["repeats"])
        row["tsit5"] = dict(h=dt, n_steps=n, time=med, times=times, first_call_s=first,
                            traj_steps_per_s=b * n / med,
                            traj_steps_per_s_cpu=b * n / times["cpu_median"],
                            traj_time_per_s=b * T / med)
        for key, r in row.items():
            log(f"  batch {b:5d} {label(key) if key != 'tsit5' else 'diffrax Tsit5':28s} "
                f"h={r['h']:<6.3g} {r['traj_steps_per_s']:10.4g} traj-steps/s (cpu "
                f"{r['traj_steps_per_s_cpu']:.4g}) {r['traj_time_per_s']:9.4g} traj-time/s")
        res["throughput"][str(b)] = row
        for key in runners:
            acc = res["accuracy"][key]["rms_dE"]
            matched = [d for d in dts if res["accuracy"][f"tsit5@dt={d:g}"]["success"]
                       and np.isfinite(res["accuracy"][f"tsit5@dt={d:g}"]["rms_dE"])
                       and res["accuracy"][f"tsit5@dt={d:g}"]["rms_dE"] <= acc]
            entry = dict(constant_step=row[key]["traj_steps_per_s"] / row["tsit5"]["traj_steps_per_s"],
                         constant_step_cpu=(row[key]["traj_steps_per_s_cpu"]
                                            / row["tsit5"]["traj_steps_per_s_cpu"]),
                         vijax_rms_dE=acc, target=1.0)
            if matched:
                # a constant-step Tsit5 step costs the same at any dt: its time-units/s at the
                # matched dt is its measured traj-steps/s times that dt
                d = max(matched)
                peer_tt = row["tsit5"]["traj_steps_per_s"] * d
                entry.update(equal_accuracy=row[key]["traj_time_per_s"] / peer_tt,
                             peer_dt=d, peer_rms_dE=res["accuracy"][f"tsit5@dt={d:g}"]["rms_dE"])
            else:
                # no Tsit5 step is as accurate: the ratio against its most accurate one (the
                # smallest steps end at its round-off floor, where the error grows again)
                ok = [d for d in dts if res["accuracy"][f"tsit5@dt={d:g}"]["success"]]
                d = min(ok, key=lambda d: res["accuracy"][f"tsit5@dt={d:g}"]["rms_dE"])
                best = res["accuracy"][f"tsit5@dt={d:g}"]["rms_dE"]
                vs_best = row[key]["traj_time_per_s"] / (row["tsit5"]["traj_steps_per_s"] * d)
                entry.update(equal_accuracy=None, vs_most_accurate_peer=vs_best, peer_dt=d,
                             peer_rms_dE=best,
                             note=f"no Tsit5 step in {dts} is as accurate; against its most "
                                  f"accurate (dt = {d:g}, rms {best:.2g}): {vs_best:.3g}")
            res["ratios"][f"{key}/tsit5@batch={b}"] = entry
    plot_part_4(res, RESULTS / f"nonholonomic_ensemble{TAG}.png")
    return res


def plot_part_4(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted(res["throughput"], key=int)
    fig, ax = plt.subplots(figsize=(7, 5))
    for key in res["throughput"][batches[0]]:
        vals = [res["throughput"][b][key]["traj_steps_per_s"] for b in batches]
        color, marker = STYLE[key]
        ax.loglog([int(b) for b in batches], vals, marker=marker, color=color,
                  label=(label(key) if key != "tsit5" else "diffrax Tsit5 (constant step)"))
    ax.set_xlabel("batch size (members under jax.vmap)")
    ax.set_ylabel("trajectory-steps per second")
    ax.set_title(f"Chaotic ensemble throughput, {res['devices'][0]}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def _met(ok):
    return "MET " if ok else "MISS"


def _row_text(name, time_, cpu, it, errors, converged=True):
    """One table row: a name, a time and its CPU time, iterations per step, errors (numbers
    or, in the header, strings)."""
    cell = lambda x, spec: format(x, spec) if isinstance(x, (int, float)) else x  # noqa: E731
    return (f"      {name:50s} {cell(time_, '9.4g'):>9s} {cell(cpu, '9.4g'):>9s} "
            f"{cell(it, '7.2f'):>7s}  " + "  ".join(f"{cell(e, '9.2e'):>10s}" for e in errors)
            + ("" if converged else "  NOT CONVERGED"))


def summary_1(r):
    lines = [f"--- (1) {r['problem']}, T = {r['T']:g}; peers' field: {r['peer_field']}"]
    if "hand_written_vs_library_acceleration" in r:
        lines.append(f"    hand-written acceleration vs nonholonomic_acceleration: max diff "
                     f"{r['hand_written_vs_library_acceleration']:.1e}")
    lines.append(_row_text("vijax run", "time [s]", "(cpu)", "it/step", ["max|dE|", "max|phi|"]))
    lines += [_row_text(f"{label(v['method'])} h={v['h']:.3g}", v["time"], v["times"]["cpu_median"],
                        v["mean_iterations"], [v["max_abs_dE"], v["max_phi"]], v["converged"])
              for v in r["vijax"].values()]
    lines.append("    ratio peer max|dE| / vijax max|dE| at equal wall time (peer: most accurate "
                 "run within vijax's time); target >= 100 and vijax max|phi| <= 1e-14 for DG "
                 "and lobatto(s >= 3):")
    for k, e in r["ratios"].items():
        pkey, vkey = k.split("/", 1)
        method = vkey.split("@")[0]
        tag = ""
        if method in TARGETED:
            tag = (f"[{_met(e['ratio'] >= 100)}] " +
                   f"[phi {_met(e['vijax_max_phi'] <= ROUND_OFF_PHI)}] ")
        else:
            tag = " " * 18
        peer = (f"peer tol={e['peer_tol']:.1e} {e['peer_time']:.3f} s dE={e['peer_max_abs_dE']:.2e} "
                f"phi={e['peer_max_phi']:.1e}" if "peer_tol" in e else e.get("note", ""))
        ok = [row for row in r["peers"][pkey]["rows"] if row["success"]]
        e_at = error_at_time([row["time"] for row in ok], [row["max_abs_dE"] for row in ok],
                             e["vijax_time"], floor=0.0)   # none beyond the slowest run
        interp = (f"interpolated {e_at / max(e['vijax_max_abs_dE'], 1e-300):.3g}; "
                  if e_at is not None else "")
        lines.append(f"      {tag}{label(method):30s} h={vkey.split('=')[1]:<6s} vs "
                     f"{PEERS[pkey][0]:14s}: {fmt(e['ratio'], '9.3g')}  ({interp}vijax "
                     f"{e['vijax_time']:.3f} s dE={e['vijax_max_abs_dE']:.2e}; {peer})")
    return lines


def summary_2(r):
    lines = [f"--- (2) per-step cost, h = {r['h']}"]
    for name, s in r["systems"].items():
        lines.append(f"  {s['problem']}")
        lines.append(_row_text("configuration", "us/step", "(cpu)", "it/step",
                               ["max|dE|/E0", "max|phi|"]))
        lines += [_row_text(row["label"], row["us_per_step"], row["us_per_step_cpu"],
                            row["mean_iterations"], [row["max_rel_dE"], row["max_phi"]],
                            row["converged"]) for row in s["rows"].values()]
        for k, e in s["ratios_over_si_dla"].items():
            lines.append(f"      [{_met(e['ratio'] <= e['target'])}] {s['rows'][k]['label']:50s}"
                         f" / SI-DLA = {e['ratio']:7.2f} (cpu {e['ratio_cpu']:.2f}; target <= 3)")
        fc = s["fastest_correct_dg"]
        if fc:
            lines.append(f"    fastest correct discrete-gradient configuration: "
                         f"{s['rows'][fc]['label']}, {s['rows'][fc]['us_per_step']:.2f} us/step "
                         f"= {s['ratios_over_si_dla'][fc]['ratio']:.2f} x SI-DLA")
        for k, p in s["profile"].items():
            lines.append(f"    profile {k:16s} ({p['solver']:16s}): outside solve "
                         f"{p['us_outside_solve']:7.2f} us + {fmt(p['updates_per_step'], '.2f')}"
                         f" x {p['us_per_update']:7.2f} us/update = "
                         f"{fmt(p['predicted_us_per_step'], '.1f')} us (measured "
                         f"{fmt(p['measured_us_per_step'], '.1f')}; wall); "
                         f"{p['residual_evaluations_per_step']}")
    return lines


def summary_3(out):
    lines = ["--- (3) energy error vs cost: time to reach max|dE| <= target on each Pareto "
             "front; ratio = other method's time / lobatto(3)'s (target > 1 below 1e-6)"]
    for name, r in out.items():
        lines.append(f"  {r['problem']}, T = {r['T']:g}")
        for tgt, a in r["at_error"].items():
            parts = []
            for key, c in a["times"].items():
                t = c["time"]
                parts.append(f"{key}={fmt(t['time'], '.3g') if t['reached'] else '>' + fmt(t['lower_bound'], '.3g')}"
                             + (f"(~{t['extrapolated']:.3g})" if t.get("extrapolated") else "") + " s")
            lines.append(f"    err<={tgt}: " + "  ".join(parts))
            for key, rr in a["ratio_over_lob3"].items():
                e = rr["time"]
                if e["ratio"] is None:
                    lines.append(f"      {label(key)} / lobatto(3): n/a")
                    continue
                check = (f"[{_met(e['ratio'] > 1)}] " if key == "si_dla" and float(tgt) <= 1e-6
                         else "       ")
                lines.append(f"      {check}{label(key):10s} / lobatto(3) = {e['ratio']:.3g} "
                             f"({e['kind']}; cpu {fmt(rr['cpu']['ratio'], '.3g')})"
                             + (f", extrapolated ~{e['extrapolated']:.3g}"
                                if e.get("extrapolated") else ""))
    return lines


def summary_4(r):
    lines = [f"--- (4) ensemble throughput, chaotic system, window T = {r['T']:g}, device "
             f"{r['devices'][0]}; Tsit5 field: {r['peer_field']}"]
    for key, a in r["accuracy"].items():
        lines.append(f"    accuracy (RMS energy error, worst saved time) {key:18s} "
                     f"{a['rms_dE']:.2e}")
    for b, row in r["throughput"].items():
        lines.append(f"    batch {b:>5}: " + "  ".join(
            f"{k}@h={v['h']:g} {v['traj_steps_per_s']:.3g}/s" for k, v in row.items()))
    lines.append("    vijax / Tsit5 throughput (target >= 1): constant step (same h, traj-steps/s)"
                 " | equal accuracy (traj-time/s)")
    for k, e in r["ratios"].items():
        eq = (f"{e['equal_accuracy']:.3g} (Tsit5 dt={e['peer_dt']:g})"
              if e.get("equal_accuracy") is not None else e.get("note"))
        equal = e.get("equal_accuracy") or e.get("vs_most_accurate_peer") or 0
        lines.append(f"      [{_met(e['constant_step'] >= 1)}|{_met(equal >= 1)}] {k:24s} "
                     f"{e['constant_step']:.3g} (cpu {e['constant_step_cpu']:.3g}) | {eq}")
    return lines


def summary(parts):
    lines = ["", "=" * 100, "NONHOLONOMIC BENCHMARKS: SUMMARY", "=" * 100]
    if "1" in parts:
        for r in parts["1"]["results"].values():
            lines += summary_1(r)
    if "2" in parts:
        lines += summary_2(parts["2"]["results"])
    if "3" in parts:
        lines += summary_3(parts["3"]["results"])
    if "4" in parts:
        lines += summary_4(parts["4"]["results"])
    for p, d in parts.items():
        lines.append(f"    part {p}: {d['seconds']:.0f} s, load average {d['loadavg_start']} -> "
                     f"{d['loadavg_end']}")
    return lines


def replot(parts):
    if "1" in parts:
        for name, r in parts["1"]["results"].items():
            plot_part_1(r, RESULTS / f"nonholonomic_energy_{name}{TAG}.png")
    if "2" in parts:
        plot_part_2(parts["2"]["results"], RESULTS / f"nonholonomic_step_cost{TAG}.png")
    if "3" in parts:
        plot_part_3(parts["3"]["results"], RESULTS / f"nonholonomic_pareto{TAG}.png")
    if "4" in parts:
        plot_part_4(parts["4"]["results"], RESULTS / f"nonholonomic_ensemble{TAG}.png")


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main(argv=None):
    global RESULTS, TAG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="1,2,3,4", help="comma-separated subset of 1,2,3,4")
    ap.add_argument("--quick", action="store_true", help="small sizes (< 2 min): smoke test")
    ap.add_argument("--out", default=str(RESULTS), help="output folder")
    ap.add_argument("--summary-only", action="store_true",
                    help="rebuild the summary and the plots from the JSON file and exit")
    ap.add_argument("--batches", default=None,
                    help="part 4's batch sizes, comma-separated (default 64,256,1024,4096; on "
                         "a GPU e.g. 64,...,262144)")
    ap.add_argument("--tag", default=None,
                    help="suffix of the output files (default '' or '_quick'; e.g. '_gpu_h200')")
    ap.add_argument("--problems", default=None,
                    help="part 1's problems, comma-separated (default cvt,chaotic)")
    ap.add_argument("--methods", default=None,
                    help="part 4's vijax methods and steps, e.g. lob2=0.1,lob3=0.2,lob4=0.4")
    args = ap.parse_args(argv)
    TAG, cfg = ("_quick", QUICK) if args.quick else ("", FULL)
    if args.tag is not None:
        TAG = args.tag
    if args.batches:
        cfg = {**cfg, "4": {**cfg["4"], "batches": [int(b) for b in args.batches.split(",")]}}
    if args.problems:
        cfg = {**cfg, "1": {**cfg["1"], "problems": args.problems.split(",")}}
    if args.methods:
        methods = dict(m.split("=") for m in args.methods.split(","))
        cfg = {**cfg, "4": {**cfg["4"], "vijax": {k: float(h) for k, h in methods.items()}}}
    RESULTS = Path(args.out)
    RESULTS.mkdir(parents=True, exist_ok=True)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = set(parts) - set(cfg)
    if bad:
        ap.error(f"unknown parts {sorted(bad)}; choose from 1, 2, 3, 4")
    path = RESULTS / f"nonholonomic{TAG}.json"
    doc = unjson(json.loads(path.read_text())) if path.exists() else {"parts": {}}
    if args.summary_only:
        replot(doc["parts"])
        write_summary(summary(doc["parts"]), RESULTS / f"nonholonomic_summary{TAG}.txt")
        return
    info = machine_info()
    log(f"machine: {info['platform']} | {info['cpu']} x {info['cpu_count']} | jax "
        f"{info['jax']} | diffrax {info['diffrax']} | devices {info['devices']} | "
        f"{'QUICK' if args.quick else 'FULL'} | parts {','.join(parts)} | load {loadavg()}")
    t_start = time.perf_counter()
    fns = {"1": part_1, "2": part_2, "3": part_3, "4": part_4}
    for p in sorted(parts):
        t0, load0 = time.perf_counter(), loadavg()
        r = fns[p](cfg[p])
        dt = time.perf_counter() - t0
        log(f"[{p}] done in {dt:.1f} s (load average {load0} -> {loadavg()})")
        doc["parts"][p] = unjson(jsonable(dict(
            part=p, machine=info, config=cfg[p], seconds=dt, loadavg_start=load0,
            loadavg_end=loadavg(), command=command_line("nonholonomic.py", argv), results=r)))
        path.write_text(json.dumps(jsonable(doc), indent=1))
    write_summary(summary({p: doc["parts"][p] for p in sorted(doc["parts"])}),
                  RESULTS / f"nonholonomic_summary{TAG}.txt", t_start,
                  command_line("nonholonomic.py", argv))


if __name__ == "__main__":
    main()
