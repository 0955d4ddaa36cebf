"""Lie-group benchmarks: rigid bodies on SO(3), vijax's Lie-group integrators against diffrax
on the quaternion and rotation-matrix ODEs.

    python benchmarks/lie_groups.py                 # full run (~10-15 min on 2 CPU cores)
    python benchmarks/lie_groups.py --quick         # smoke test (< 3 min), *_quick files
    python benchmarks/lie_groups.py --parts 2       # a subset of the parts 1, 2
    python benchmarks/lie_groups.py --summary-only  # re-print the summary / re-plot from JSON
    python benchmarks/lie_groups.py --parts 2 --xla-small-loop-threshold 1048576
                                                    # sensitivity check, *_xlaloop1048576 files

Parts (see benchmarks/README.md, "Lie-group benchmarks"):
  1  long-time accuracy at equal wall time, T = 1000 (quick: 100), on the free rigid body
     (``FreeRigidBody``, inertia (1, 2, 3)) and the heavy top (``HeavyTop``, inertia (1, 2, 3)
     about the fixed point, m = 1, gravity 1, com (0, 0, 1)), both from the same generic
     tilted rotation and Ω0 = (0.3, -0.8, 1.0): ``GroupVPRK.gauss(2)``, ``.gauss(3)``,
     ``.lobatto(3, retraction=Cayley())``, ``.midpoint(retraction=Cayley())`` and
     ``VRKMK.gauss(2)`` (Bogfjellmo & Marthinsen (2016)) at a few step sizes; diffrax Tsit5 and
     Dopri8 (PIDController, tolerance sweep) on the quaternion ODE and on the rotation-matrix
     ODE with hand-written fields (checked against vijax's autodiff Euler-Poincaré equations).
     Max energy error, group drift and spatial-momentum drift per run; the peers' energy error
     and drift interpolated (log-log) at vijax's wall times, ratio peer / vijax.
  2  per-step cost on SO(3) against R^3: a ``GroupVPRK.gauss(2)`` step on the heavy top (Exp,
     Cayley; ``VRKMK.gauss(2)`` beside them) against ``VPRK.gauss(2)`` on a 3-dof
     ``MechanicalSystem`` (mass diag(1, 2, 3), trigonometric potential) and
     ``GroupVPRK.gauss(2)`` on ``vj.lie.Rn(3)`` with the same Lagrangian (and, as a diagnostic,
     ``VPRK.gauss(2)`` on the R^3 system plus a magnetic field: gyroscopic coupling like the
     rigid body's); µs per step over 2e4 steps, fixed-point iterations per step, compile
     time.
  (3) the plots: written by parts 1 and 2 and by --summary-only.

Timing rules are those of benchmarks/run.py, whose helpers are imported: float64, every solver
inside its own jax.jit, compilation excluded (its time recorded separately), median of blocked
calls, process CPU time next to every wall time, machine info, vijax source hash and load
average in the JSON.  Output: results/lie_groups{_quick}.json, lie_groups_*{_quick}.png and
lie_groups_summary{_quick}.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (  # noqa: E402  (run.py also switches on float64, before any array exists)
    XLA_SMALL_LOOP_THRESHOLD,
    _once,
    _stats,
    command_line,
    diffrax_runner,
    fmt,
    jsonable,
    log,
    machine_info,
    timed,
    unjson,
    vijax_runner,
    write_summary,
)
from constrained import loadavg  # noqa: E402

import diffrax as dfx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import vijax as vj  # noqa: E402

jax.config.update("jax_enable_x64", True)

# VRKMK (Bogfjellmo & Marthinsen (2016)) lives in vijax.integrators.tstar, which another
# engineer was finishing when this script was written.  HOOK: when the import fails, the
# "vrkmk" entries are skipped (and the summary says so); nothing else changes.
try:
    from vijax.integrators.tstar import VRKMK
except Exception as _err:  # noqa: BLE001
    VRKMK = None
    VRKMK_MISSING = f"{type(_err).__name__}: {_err}"
else:
    VRKMK_MISSING = None

RESULTS = Path(__file__).resolve().parent / "results"
TAG = ""
ROUND_OFF_DRIFT = 1e-12  # max ||g^T g - I||_F at or below this counts as round-off
SERIES_POINTS = 200      # time series stored in the JSON (block maxima of |.|)

INERTIA = (1.0, 2.0, 3.0)
Q0 = (0.9, 0.3, 0.2, 0.1)          # generic initial rotation (normalised), tilt ~43 deg
OMEGA0 = (0.3, -0.8, 1.0)          # body angular velocity
TOP = dict(mass=1.0, gravity=1.0, com=(0.0, 0.0, 1.0))

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

FULL = {
    "1": dict(
        problems=["free", "top"], T=1000.0, n_save=1000, repeats=3, time_budget=4.0,
        h={"g2": [0.1, 0.05, 0.025], "g3": [0.2, 0.1], "l3c": [0.1, 0.05],
           "mpc": [0.05, 0.01], "vrkmk": [0.1, 0.05]},
        peers=["q_tsit5", "q_dopri8", "m_tsit5", "m_dopri8"],
        tols=[10.0 ** (-k / 2) for k in range(6, 29)], start_tol=1e-8, overshoot=1.3,
        max_steps=2_000_000,
    ),
    "2": dict(n_steps=20_000, h=0.05, save_every=1000, rounds=3,
              configs=["so3_exp", "so3_cay", "r3_vprk", "rn_group", "r3_gyro", "so3_vrkmk"]),
}

QUICK = {
    "1": dict(
        problems=["free", "top"], T=100.0, n_save=100, repeats=2, time_budget=1.0,
        h={"g2": [0.05], "l3c": [0.05]},
        peers=["q_dopri8", "m_tsit5"], tols=[10.0 ** -k for k in range(3, 14)],
        start_tol=1e-8, overshoot=1.5, max_steps=500_000,
    ),
    "2": dict(n_steps=2000, h=0.05, save_every=1000, rounds=2,
              configs=["so3_exp", "so3_cay", "r3_vprk", "rn_group", "r3_gyro"]),
}

C = vj.lie.Cayley
METHODS = {  # key -> (label, factory)
    "g2": ("GroupVPRK.gauss(2), Exp", lambda: vj.GroupVPRK.gauss(2)),
    "g3": ("GroupVPRK.gauss(3), Exp", lambda: vj.GroupVPRK.gauss(3)),
    "l3c": ("GroupVPRK.lobatto(3), Cayley", lambda: vj.GroupVPRK.lobatto(3, retraction=C())),
    "mpc": ("GroupVPRK.midpoint(), Cayley", lambda: vj.GroupVPRK.midpoint(retraction=C())),
    "vrkmk": ("VRKMK.gauss(2) (r = 2)", lambda: VRKMK.gauss(2)),
}
PEERS = {  # key -> (label, representation, solver)
    "q_tsit5": ("Tsit5, quaternion", "quat", dfx.Tsit5),
    "q_dopri8": ("Dopri8, quaternion", "quat", dfx.Dopri8),
    "m_tsit5": ("Tsit5, rotation matrix", "mat", dfx.Tsit5),
    "m_dopri8": ("Dopri8, rotation matrix", "mat", dfx.Dopri8),
}
STYLE = {"g2": ("C0", "o"), "g3": ("C1", "s"), "l3c": ("C2", "^"), "mpc": ("C3", "v"),
         "vrkmk": ("C6", "D"), "q_tsit5": ("C4", "--"), "q_dopri8": ("C7", "--"),
         "m_tsit5": ("C5", ":"), "m_dopri8": ("C8", ":")}


def label(key):
    return (METHODS.get(key) or PEERS.get(key) or (key,))[0]


def available(key):
    return key != "vrkmk" or VRKMK is not None


# --------------------------------------------------------------------------------------------
# Problems and the peers' hand-written vector fields
# --------------------------------------------------------------------------------------------


def quaternion_field(inertia, mgchi):
    """``y = (q, Ω)``, ``q = (w, x, y, z)`` (scalar first, Hamilton product, the convention of
    ``vj.lie.SO3.from_quaternion``), written by hand:

        q' = ½ q ⊗ (0, Ω) = ½ (−v·Ω, w Ω + v × Ω),         v = (x, y, z),
        I Ω' = IΩ × Ω + Γ × (m γ χ),                        Γ = Rᵀ e3,

    with ``Γ`` the third row of ``R(q)``, ``(2(xz − wy), 2(yz + wx), 1 − 2(x² + y²))``
    (unit-quaternion form, no normalisation, as a user writes it).  The torque: with
    ``V(R) = m γ e3ᵀ R χ``, ``L*_R D1ℓ = ∂_ζ [−m γ e3ᵀ R (I + ζ̂) χ]_{ζ=0}``, and
    ``e3ᵀ R (ζ × χ) = Γ·(ζ × χ) = ζ·(χ × Γ)``, so ``τ = −m γ χ × Γ = m γ Γ × χ`` (the moment
    about the fixed point of the weight ``−m γ Γ`` at ``χ``)."""
    I = jnp.asarray(inertia)
    c = jnp.asarray(mgchi)

    def vf(t, y, args):
        w, x, yy, z = y[0], y[1], y[2], y[3]
        v, om = y[1:4], y[4:7]
        dq = 0.5 * jnp.concatenate([-jnp.dot(v, om)[None], w * om + jnp.cross(v, om)])
        gam = jnp.stack([2.0 * (x * z - w * yy), 2.0 * (yy * z + w * x),
                         1.0 - 2.0 * (x * x + yy * yy)])
        dom = (jnp.cross(I * om, om) + jnp.cross(gam, c)) / I
        return jnp.concatenate([dq, dom])

    return vf


def matrix_field(inertia, mgchi):
    """``y = (vec R, Ω)`` (row-major, 9 + 3 unconstrained components): ``R' = R Ω̂`` (row ``i``:
    ``r_i × Ω``) and ``I Ω' = IΩ × Ω + Γ × (m γ χ)`` with ``Γ = Rᵀ e3`` the third row of
    ``R``."""
    I = jnp.asarray(inertia)
    c = jnp.asarray(mgchi)

    def vf(t, y, args):
        R, om = y[:9].reshape(3, 3), y[9:12]
        dR = jnp.cross(R, om[None, :])
        dom = (jnp.cross(I * om, om) + jnp.cross(R[2], c)) / I
        return jnp.concatenate([dR.reshape(9), dom])

    return vf


def rotation_raw(q):
    """The rotation a user builds from an un-normalised quaternion (the unit-quaternion
    formula of ``from_quaternion`` without its normalisation)."""
    w, x, y, z = q[0], q[1], q[2], q[3]
    return jnp.stack([
        jnp.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)]),
        jnp.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)]),
        jnp.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]),
    ])


def problem(name):
    """``dict(system, g0, q0 (quaternion), v0, mgchi, label)``."""
    quat = jnp.asarray(Q0, jnp.float64)
    quat = quat / jnp.linalg.norm(quat)
    g0 = vj.lie.SO3.from_quaternion(quat)
    v0 = jnp.asarray(OMEGA0, jnp.float64)
    if name == "free":
        system = vj.systems.FreeRigidBody(inertia=INERTIA)
        mgchi = (0.0, 0.0, 0.0)
        lab = (f"free rigid body, inertia {INERTIA}, g0 = from_quaternion({Q0}), "
               f"Omega0 = {OMEGA0}")
    elif name == "top":
        system = vj.systems.HeavyTop(inertia=INERTIA, **TOP)
        mgchi = tuple(TOP["mass"] * TOP["gravity"] * c for c in TOP["com"])
        lab = (f"heavy top, inertia {INERTIA}, m = {TOP['mass']:g}, gravity "
               f"{TOP['gravity']:g}, com {TOP['com']}, g0 = from_quaternion({Q0}) (tilt "
               f"{math.degrees(math.acos(float(g0[2, 2]))):.0f} deg), Omega0 = {OMEGA0}")
    else:
        raise KeyError(name)
    return dict(system=system, g0=g0, quat0=quat, v0=v0, mgchi=mgchi, label=lab,
                fields={"quat": quaternion_field(INERTIA, mgchi),
                        "mat": matrix_field(INERTIA, mgchi)},
                y0={"quat": jnp.concatenate([quat, v0]),
                    "mat": jnp.concatenate([g0.reshape(9), v0])})


def check_fields(pb, samples=64, seed=0):
    """Largest differences between the hand-written fields and vijax at random states (unit
    quaternion, Ω ~ N(0, 1)): ``Ω'`` against ``vj.integrators.lie.euler_poincare`` (autodiff
    Euler-Poincaré), the quaternion kinematics against ``d/dt from_quaternion(q) = R Ω̂`` (a
    ``jax.jvp``), the matrix kinematics against ``R Ω̂``.  Raises above 1e-12."""
    rng = np.random.default_rng(seed)
    qs = rng.normal(size=(samples, 4))
    qs = jnp.asarray(qs / np.linalg.norm(qs, axis=1, keepdims=True))
    oms = jnp.asarray(rng.normal(size=(samples, 3)))
    system, G = pb["system"], vj.lie.SO3()
    fq, fm = pb["fields"]["quat"], pb["fields"]["mat"]

    def one(q, om):
        R = vj.lie.SO3.from_quaternion(q)
        ref = vj.integrators.lie.euler_poincare(system, 0.0, R, om)
        yq = fq(0.0, jnp.concatenate([q, om]), None)
        ym = fm(0.0, jnp.concatenate([R.reshape(9), om]), None)
        dR = jax.jvp(vj.lie.SO3.from_quaternion, (q,), (yq[:4],))[1]
        RO = R @ G.hat(om)
        return jnp.stack([jnp.max(jnp.abs(yq[4:] - ref)), jnp.max(jnp.abs(ym[9:] - ref)),
                          jnp.max(jnp.abs(dR - RO)), jnp.max(jnp.abs(ym[:9].reshape(3, 3) - RO))])

    gaps = np.max(np.asarray(jax.jit(jax.vmap(one))(qs, oms)), axis=0)
    out = dict(quat_omega_dot=float(gaps[0]), mat_omega_dot=float(gaps[1]),
               quat_kinematics=float(gaps[2]), mat_kinematics=float(gaps[3]), samples=samples)
    if not max(gaps) <= 1e-12:
        raise AssertionError(f"hand-written fields differ from vijax's Euler-Poincaré "
                             f"equations: {out}")
    return out


# --------------------------------------------------------------------------------------------
# Invariants
# --------------------------------------------------------------------------------------------


def _drift(R):
    return jnp.linalg.norm(R.T @ R - jnp.eye(3, dtype=R.dtype))


def _momentum_error(system, name, R, om, m0):
    m = system.spatial_momentum(R, om)
    if name == "free":
        return jnp.max(jnp.abs(m - m0))
    return jnp.abs(m[2] - m0[2])


def invariants(system, name, kind):
    """jit(states) -> dict of time series over the saved points: ``dE`` (energy of the state
    as stored), ``dE_proj`` (energy after projecting the rotation onto SO(3): normalised
    quaternion, polar factor of R), ``drift`` (||RᵀR - I||_F of the stored rotation; for
    quaternions the rotation built from the un-normalised q), ``qnorm`` (| |q| - 1 |,
    quaternions only) and ``dmom`` (spatial angular momentum g I Ω: all components for the free
    body, the vertical one for the top)."""
    G = vj.lie.SO3()

    def rotations(state):
        if kind == "group":
            R, om = state
            return R, G.project(R), om, None
        if kind == "quat":
            q, om = state[:4], state[4:7]
            return rotation_raw(q), vj.lie.SO3.from_quaternion(q), om, q
        R, om = state[:9].reshape(3, 3), state[9:12]
        return R, G.project(R), om, None

    @jax.jit
    def f(states):
        R, Rp, om, q = jax.vmap(rotations)(states)
        e = jax.vmap(system.energy)(R, om)
        ep = jax.vmap(system.energy)(Rp, om)
        m0 = system.spatial_momentum(R[0], om[0])
        out = dict(dE=e - e[0], dE_proj=ep - ep[0], drift=jax.vmap(_drift)(R),
                   dmom=jax.vmap(lambda r, o: _momentum_error(system, name, r, o, m0))(R, om))
        if q is not None:
            out["qnorm"] = jnp.abs(jnp.linalg.norm(q, axis=-1) - 1.0)
        return out

    return f


def series_max(a):
    """``|a|`` thinned to at most SERIES_POINTS block maxima (4 digits), for the JSON."""
    a = np.abs(np.asarray(a, dtype=float))
    k = max(1, -(-(a.shape[0] - 1) // SERIES_POINTS))
    body = a[1:]
    pad = (-body.shape[0]) % k
    body = np.concatenate([body, np.full(pad, np.nan)]).reshape(-1, k)
    vals = np.concatenate([[a[0]], np.nanmax(body, axis=1)])
    return [float(f"{x:.4g}") for x in vals], k


def summarise(inv_out):
    """Maxima over the run and the thinned series."""
    d = {k: np.asarray(v) for k, v in inv_out.items()}
    row = dict(max_abs_dE=float(np.max(np.abs(d["dE"]))),
               max_abs_dE_proj=float(np.max(np.abs(d["dE_proj"]))),
               max_drift=float(np.max(d["drift"])), final_drift=float(d["drift"][-1]),
               max_dmom=float(np.max(d["dmom"])))
    if "qnorm" in d:
        row["max_qnorm"] = float(np.max(d["qnorm"]))
    ser = {}
    for k in ("dE", "drift", "dmom", "qnorm"):
        if k in d:
            ser[k], every = series_max(d[k])
    ser["every"] = every
    return row, ser


# --------------------------------------------------------------------------------------------
# Part 1: long-time accuracy at equal wall time
# --------------------------------------------------------------------------------------------


def steps_for(T, h, n_save):
    n = max(int(round(T / h)), n_save)
    return n - n % n_save


def vijax_run(pb, name, key, h, T, n_save, inv, cfg):
    n = steps_for(T, h, n_save)
    run = vijax_runner(pb["system"], METHODS[key][1](), n, n // n_save)
    (t, q, v, it, ok), med, times, comp = timed(run, pb["g0"], pb["v0"], T / n,
                                                repeats=cfg["repeats"], warm="aot",
                                                budget=cfg["time_budget"])
    row, ser = summarise(inv((q, v)))
    row.update(method=key, h=T / n, n_steps=n, time=med, times=times, compile_s=comp,
               mean_iterations=float(it), converged=bool(ok), load1=loadavg()[0],
               series=ser)
    log(f"  {label(key):32s} h={T / n:<7.3g} max|dE|={row['max_abs_dE']:9.2e} "
        f"drift={row['max_drift']:8.1e} dmom={row['max_dmom']:8.1e} time={med:7.3f} s (cpu "
        f"{times['cpu_median']:.3f}) it/step={float(it):.2f} compile={comp:.1f} s"
        + ("" if bool(ok) else "  NOT CONVERGED"))
    return row


def sweep_peer(evaluate, n_knobs, start, lo, hi, overshoot):
    """Evaluate a peer's tolerances (index 0 = loosest) from ``start``: tighter until a run
    fails, takes more than ``overshoot * hi`` or the list ends, then looser until a run takes
    at most ``lo / overshoot`` or fails (so that the vijax times are bracketed)."""
    rows = {}
    i = start
    while i < n_knobs:
        r = rows[i] = evaluate(i)
        if not r["success"] or r["time"] > overshoot * hi:
            break
        i += 1
    i = start
    while i > 0 and rows[i]["success"] and rows[i]["time"] > lo / overshoot:
        i -= 1
        rows[i] = evaluate(i)
    return rows


def _loglog(x, x0, x1, y0, y1):
    if x1 == x0 or y0 <= 0 or y1 <= 0:
        return y1
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))


def at_time(points, t):
    """``points`` = [(time, value)], sorted by time: the value at wall time ``t`` by log-log
    interpolation; ``kind`` "interpolated", or "cheapest" / "slowest" when ``t`` lies outside
    the measured times (the end value is returned)."""
    pts = [(a, b) for a, b in points if np.isfinite(b) and b > 0]
    if not pts:
        return None, None
    if t <= pts[0][0]:
        return pts[0][1], ("interpolated" if t == pts[0][0] else "cheapest")
    if t >= pts[-1][0]:
        return pts[-1][1], ("interpolated" if t == pts[-1][0] else "slowest")
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return _loglog(t, t0, t1, v0, v1), "interpolated"
    return None, None


def pareto(points):
    front, best = [], math.inf
    for t, e in sorted(points):
        if np.isfinite(e) and e < best:
            front.append((t, e))
            best = e
    return front


def equal_time(vr, rows, err="max_abs_dE"):
    """Peer's energy error at vijax's wall time, interpolated on its Pareto front (log-log),
    and the ratio peer / vijax; when vijax is cheaper than the cheapest peer run the ratio is a
    lower bound (bound ">="), when it is slower than the slowest one an upper bound ("<=").
    The peer's drifts at that time are interpolated over its runs sorted by time."""
    ok = [r for r in rows if r["success"]]
    front = pareto([(r["time"], r[err]) for r in ok])
    pe, kind = at_time(front, vr["time"])
    out = dict(vijax_time=vr["time"], vijax_err=vr[err], vijax_drift=vr["max_drift"],
               vijax_dmom=vr["max_dmom"])
    if pe is None:
        out.update(ratio=None, bound=None, note="no successful peer run")
        return out
    out.update(peer_err=pe, kind=kind, ratio=pe / max(vr[err], 1e-300),
               bound={"interpolated": "=", "cheapest": ">=", "slowest": "<="}[kind])
    by_time = sorted(ok, key=lambda r: r["time"])
    for k in ("max_drift", "max_dmom", "max_qnorm"):
        if by_time and k in by_time[0]:
            out[f"peer_{k}"] = at_time([(r["time"], r[k]) for r in by_time], vr["time"])[0]
    return out


def part_1(cfg):
    T, n_save = cfg["T"], cfg["n_save"]
    ts = np.linspace(0.0, T, n_save + 1)
    out = {}
    for name in cfg["problems"]:
        pb = problem(name)
        system = pb["system"]
        E0 = float(system.energy(pb["g0"], pb["v0"]))
        log(f"\n[1] {pb['label']}; T = {T:g}, {n_save} saves, E0 = {E0:.15g}")
        check = check_fields(pb)
        log(f"  hand-written fields vs vj.integrators.lie.euler_poincare / R Omega^: {check}")
        res = dict(problem=pb["label"], T=T, n_save=n_save, E0=E0, field_check=check,
                   vijax={}, peers={}, ratios={}, skipped=[])
        inv = invariants(system, name, "group")
        for key, hs in cfg["h"].items():
            if not available(key):
                res["skipped"].append(f"{key}: {VRKMK_MISSING}")
                log(f"  {label(key)} skipped (HOOK: {VRKMK_MISSING})")
                continue
            for h in hs:
                res["vijax"][f"{key}@h={h:g}"] = vijax_run(pb, name, key, h, T, n_save, inv, cfg)
        vtimes = [r["time"] for r in res["vijax"].values()]
        tols = sorted(cfg["tols"], reverse=True)
        start = int(np.argmin(np.abs(np.log(tols) - np.log(cfg["start_tol"]))))
        for pkey in cfg["peers"]:
            plabel, rep, solver = PEERS[pkey]
            y0 = pb["y0"][rep]
            pinv = invariants(system, name, rep)
            t0 = time.perf_counter()
            run = diffrax_runner(pb["fields"][rep], solver(), T, saveat_ts=ts, step_ts=True,
                                 max_steps=cfg["max_steps"]).lower(y0, 1e-6, 0.0).compile()
            comp = time.perf_counter() - t0

            def evaluate(i, run=run, pinv=pinv, plabel=plabel, y0=y0):
                (ys, nsteps, nacc, ok), med, times, _ = timed(
                    run, y0, tols[i], 0.0, repeats=cfg["repeats"], warm=False,
                    budget=cfg["time_budget"])
                row, ser = summarise(pinv(ys))
                if not bool(ok):
                    for k in list(row):
                        row[k] = math.nan
                row.update(tol=tols[i], time=med, times=times, num_steps=int(nsteps),
                           num_accepted=int(nacc), success=bool(ok), load1=loadavg()[0],
                           series=ser)
                log(f"  {plabel:32s} tol={tols[i]:<7.1e} max|dE|={row['max_abs_dE']:9.2e} "
                    f"drift={row['max_drift']:8.1e} dmom={row['max_dmom']:8.1e} time={med:7.3f}"
                    f" s (cpu {times['cpu_median']:.3f}) steps={int(nsteps)}"
                    + ("" if ok else "  FAILED"))
                return row

            rows = sweep_peer(evaluate, len(tols), start, min(vtimes), max(vtimes),
                              cfg["overshoot"])
            res["peers"][pkey] = dict(compile_s=comp, rows=[rows[k] for k in sorted(rows)])
            log(f"  {plabel}: compile {comp:.1f} s")
        for vkey, vr in res["vijax"].items():
            for pkey, pr in res["peers"].items():
                res["ratios"][f"{pkey}/{vkey}"] = equal_time(vr, pr["rows"])
                res["ratios"][f"{pkey}/{vkey}"]["projected"] = equal_time(
                    vr, pr["rows"], "max_abs_dE_proj")["ratio"]
        out[name] = res
        plot_part_1(res, RESULTS / f"lie_groups_{name}{TAG}.png")
    return out


def best_runs(res):
    """The runs drawn against t: the most accurate run of each vijax method, and of each peer
    the most accurate successful run no slower than the slowest vijax run."""
    shown = {}
    for vkey, vr in res["vijax"].items():
        m = vr["method"]
        if m not in shown or vr["max_abs_dE"] < shown[m][1]["max_abs_dE"]:
            shown[m] = (vkey, vr)
    tmax = max((vr["time"] for vr in res["vijax"].values()), default=math.inf)
    for pkey, pr in res["peers"].items():
        ok = [r for r in pr["rows"] if r["success"] and r["time"] <= tmax]
        if ok:
            r = min(ok, key=lambda r: r["max_abs_dE"])
            shown[pkey] = (f"tol={r['tol']:.0e}", r)
    return shown


def plot_part_1(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    floor = 1e-17
    for ax, (err, ylabel) in zip(axes[0], (("max_abs_dE", "max |E(t) - E(0)|"),
                                           ("max_drift", "max ||RᵀR - I||_F (group drift)"))):
        methods = {}
        for vr in res["vijax"].values():
            methods.setdefault(vr["method"], []).append(vr)
        for key, rs in methods.items():
            color, marker = STYLE[key]
            rs = sorted(rs, key=lambda r: r["time"])
            ax.loglog([r["time"] for r in rs], [max(r[err], floor) for r in rs], marker=marker,
                      color=color, ls="-", label=label(key))
        for pkey, pr in res["peers"].items():
            rs = sorted((r for r in pr["rows"] if r["success"]), key=lambda r: r["time"])
            color, ls = STYLE[pkey]
            ax.loglog([r["time"] for r in rs], [max(r[err], floor) for r in rs], color=color,
                      marker=".", ls=ls, label=f"diffrax {label(pkey)} (tol sweep)")
        ax.set_xlabel("wall time [s] (median, compile excluded)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    shown = best_runs(res)
    T = res["T"]
    for ax, (k, ylabel) in zip(axes[1], (("dE", "|E(t) - E(0)| (block maxima)"),
                                         ("drift", "||RᵀR - I||_F (block maxima)"))):
        for key, (tag, r) in shown.items():
            ser = np.asarray(r["series"][k], dtype=float)
            tt = np.concatenate([[0.0], np.minimum(np.arange(1, ser.shape[0]) * r["series"]["every"]
                                                   * T / res["n_save"], T)])
            if key in METHODS:
                ax.semilogy(tt[1:], np.maximum(ser[1:], floor), color=STYLE[key][0], lw=1,
                            label=f"{label(key)} h={r['h']:.3g} ({r['time']:.2f} s)")
            else:
                ax.semilogy(tt[1:], np.maximum(ser[1:], floor), color=STYLE[key][0],
                            ls=STYLE[key][1], lw=1,
                            label=f"diffrax {label(key)} {tag} ({r['time']:.2f} s)")
        ax.set_xlabel("t")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    axes[1][0].set_title("most accurate run of each vijax method; of each peer, the most "
                         "accurate one no slower than the slowest vijax run", fontsize=8)
    fig.suptitle(f"{res['problem']}, T = {res['T']:g}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Part 2: per-step cost on SO(3) against R^3
# --------------------------------------------------------------------------------------------

R3_MASS = INERTIA
R3_Q0 = (0.5, -0.3, 0.2)


def r3_potential(q):
    """A trigonometric potential on R^3 of the heavy top's size (|V| <= 1.5, O(1) forces)."""
    return jnp.cos(q[0]) * jnp.cos(q[1]) + 0.5 * jnp.sin(q[1] + q[2])


class R3Body(vj.MechanicalSystem):
    """``L = ½ vᵀ diag(1, 2, 3) v − V(q)`` on R^3 (closed-form inverse mass)."""

    constant_mass = True

    def mass_matrix(self, q):
        return jnp.diag(jnp.asarray(R3_MASS, q.dtype))

    def inverse_mass_matrix(self, q):
        return jnp.diag(1.0 / jnp.asarray(R3_MASS, q.dtype))

    def potential(self, q):
        return r3_potential(q)


class RnBody(vj.LieGroupSystem):
    """The same Lagrangian as :class:`R3Body` as a system on the group ``vj.lie.Rn(3)``, with
    the closed-form inverse Legendre map the rigid bodies declare."""

    quadratic_in_velocity = True

    @property
    def group(self):
        return vj.lie.Rn(3)

    def lagrangian(self, g, xi):
        return 0.5 * jnp.sum(jnp.asarray(R3_MASS, xi.dtype) * xi**2) - r3_potential(g)

    def velocity(self, g, mu, v_guess=None):
        return mu / jnp.asarray(R3_MASS, mu.dtype)

    def inverse_velocity_hessian(self, g, xi):
        return jnp.diag(1.0 / jnp.asarray(R3_MASS, xi.dtype))


R3_B = (1.0, -2.0, 2.0)   # uniform magnetic field of R3Gyro, |B| = 3


class R3Gyro(vj.LagrangianSystem):
    """:class:`R3Body` plus a uniform magnetic field ``B`` (vector potential ``A = ½ B × q``):
    ``L = ½ vᵀ diag(1, 2, 3) v + A(q)·v − V(q)``, a velocity-coupled (gyroscopic) force
    ``v × B`` of the size of the rigid body's ``IΩ × Ω``.  A diagnostic: on R^3, does the
    gyroscopic coupling alone raise the fixed-point iteration count as on SO(3)?"""

    quadratic_in_velocity = True

    def lagrangian(self, q, v):
        A = 0.5 * jnp.cross(jnp.asarray(R3_B, q.dtype), q)
        return (0.5 * jnp.sum(jnp.asarray(R3_MASS, v.dtype) * v**2) + jnp.dot(A, v)
                - r3_potential(q))

    def inverse_velocity_hessian(self, q, v):
        return jnp.diag(1.0 / jnp.asarray(R3_MASS, v.dtype))


def step_configs():
    top = vj.systems.HeavyTop(inertia=INERTIA, **TOP)
    pb = problem("top")
    g0, v0 = pb["g0"], pb["v0"]
    q3 = jnp.asarray(R3_Q0, jnp.float64)
    return {
        "so3_exp": ("SO(3) heavy top, GroupVPRK.gauss(2), Exp", top, vj.GroupVPRK.gauss(2),
                    g0, v0),
        "so3_cay": ("SO(3) heavy top, GroupVPRK.gauss(2), Cayley", top,
                    vj.GroupVPRK.gauss(2, retraction=C()), g0, v0),
        "r3_vprk": ("R^3 MechanicalSystem, VPRK.gauss(2)", R3Body(), vj.VPRK.gauss(2), q3, v0),
        "rn_group": ("Rn(3) LieGroupSystem, GroupVPRK.gauss(2)", RnBody(),
                     vj.GroupVPRK.gauss(2), q3, v0),
        "r3_gyro": ("R^3 + magnetic field (gyroscopic), VPRK.gauss(2)", R3Gyro(),
                    vj.VPRK.gauss(2), q3, v0),
        "so3_vrkmk": ("SO(3) heavy top, VRKMK.gauss(2)", top,
                      VRKMK.gauss(2) if VRKMK is not None else None, g0, v0),
    }


def part_2(cfg):
    h, n, se = cfg["h"], cfg["n_steps"], cfg["save_every"]
    log(f"\n[2] per-step cost, h = {h}, {n} steps, {cfg['rounds']} interleaved rounds")
    allc = step_configs()
    configs = [k for k in cfg["configs"] if allc[k][2] is not None]
    skipped = [f"{k}: {VRKMK_MISSING}" for k in cfg["configs"] if allc[k][2] is None]
    compiled, comp = {}, {}
    for k in configs:
        _, system, integ, q0, v0 = allc[k]
        t0 = time.perf_counter()
        compiled[k] = vijax_runner(system, integ, n, se).lower(q0, v0, h).compile()
        comp[k] = time.perf_counter() - t0
    # every entry once (warm), then the timed rounds interleaved round-robin
    out, wall, cpu = {}, {k: [] for k in configs}, {k: [] for k in configs}
    for k in configs:
        _, system, integ, q0, v0 = allc[k]
        out[k], _, _ = _once(compiled[k], q0, v0, h)
    for _ in range(cfg["rounds"]):
        for k in configs:
            _, system, integ, q0, v0 = allc[k]
            _, w, c = _once(compiled[k], q0, v0, h)
            wall[k].append(w)
            cpu[k].append(c)
    rows = {}
    for k in configs:
        lab, system, integ, q0, v0 = allc[k]
        t, q, v, it, ok = out[k]
        e = np.asarray(jax.vmap(system.energy)(q, v))
        med = float(np.median(wall[k]))
        times = _stats(wall[k], cpu[k])
        rows[k] = dict(label=lab, n_steps=n, time=med, times=times, compile_s=comp[k],
                       us_per_step=med / n * 1e6, us_per_step_cpu=times["cpu_median"] / n * 1e6,
                       mean_iterations=float(it), converged=bool(ok),
                       us_per_iteration=med / n * 1e6 / max(float(it), 1e-300),
                       max_rel_dE=float(np.max(np.abs(e - e[0])) / abs(e[0])))
        r = rows[k]
        log(f"  {lab:44s} {r['us_per_step']:8.2f} us/step (cpu {r['us_per_step_cpu']:7.2f}) "
            f"it/step={r['mean_iterations']:.2f} ({r['us_per_iteration']:.2f} us/it) "
            f"compile={r['compile_s']:.1f} s max|dE|/E0={r['max_rel_dE']:.1e}"
            + ("" if r["converged"] else "  NOT CONVERGED"))
    ratios = {}
    for k in ("so3_exp", "so3_cay", "so3_vrkmk"):
        for base in ("r3_vprk", "rn_group", "r3_gyro"):
            if k in rows and base in rows:
                a, b = rows[k], rows[base]
                ratios[f"{k}/{base}"] = dict(
                    ratio=a["us_per_step"] / b["us_per_step"],
                    ratio_cpu=a["us_per_step_cpu"] / b["us_per_step_cpu"],
                    ratio_per_iteration=a["us_per_iteration"] / b["us_per_iteration"],
                    target=2.0 if base != "r3_gyro" else None)
    res = dict(h=h, n_steps=n, rounds=cfg["rounds"], rows=rows, ratios=ratios, skipped=skipped,
               load1=loadavg()[0])
    plot_part_2(res, RESULTS / f"lie_groups_step_cost{TAG}.png")
    return res


def plot_part_2(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    keys = list(rows)
    fig, ax = plt.subplots(figsize=(9, 5))
    colors = ["C3" if k.startswith("so3") else "C9" if k == "r3_gyro" else "C0"
              for k in keys]
    bars = ax.bar(range(len(keys)), [rows[k]["us_per_step"] for k in keys], color=colors,
                  alpha=0.8, label="wall (median)")
    ax.scatter(range(len(keys)), [rows[k]["us_per_step_cpu"] for k in keys], color="k",
               marker="_", s=300, zorder=3, label="process CPU (median)")
    for b, k in zip(bars, keys):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(),
                f"{b.get_height():.1f} us\n{rows[k]['mean_iterations']:.1f} it",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([rows[k]["label"] for k in keys], rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("time per step [us]")
    ax.set_title(f"Per-step cost, h = {res['h']}, {res['n_steps']} steps (SO(3) red, vector "
                 f"space blue)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------------


def _met(ok):
    return "MET " if ok else "MISS"


def _run_name(v):
    return f"{label(v['method'])} h={v['h']:.3g}"


def _ratio_cell(e, width=11):
    if e.get("ratio") is None:
        return f"{'n/a':>{width}s}"
    b = "" if e["bound"] == "=" else e["bound"]
    return f"{b + fmt(e['ratio'], '.2g'):>{width}s}"


def short_table_1(results):
    """The short table: per vijax run, the ratio peer / vijax max|dE| at equal wall time for
    every peer, vijax's drift and the peers' drift at the same wall time."""
    lines = ["SHORT TABLE (1): ratio peer max|dE| / vijax max|dE| at vijax's wall time "
             "(target >= 100 against every peer); group drift max||R^T R - I||_F, vijax vs "
             "the peers at the same wall time (target: vijax <= 1e-12, at round-off)"]
    for r in results.values():
        peers = list(r["peers"])
        lines.append(f"  {r['problem'].split(',')[0]}, T = {r['T']:g}")
        lines.append(f"    {'':9s} {'vijax run':36s} {'time[s]':>7s} {'max|dE|':>8s} "
                     + " ".join(f"{p:>11s}" for p in peers)
                     + f"  {'drift':>7s} {'peers drift':>17s} {'dmom':>7s} {'peers dmom':>17s}")
        for vkey, v in r["vijax"].items():
            es = [r["ratios"][f"{p}/{vkey}"] for p in peers]
            worst = min((e["ratio"] for e in es if e.get("ratio") is not None), default=None)
            tag = (f"[{_met(worst is not None and worst >= 100)[:4].strip()}|"
                   f"{'ok' if v['max_drift'] <= ROUND_OFF_DRIFT else 'no'}]")
            pd = [e.get("peer_max_drift") for e in es if e.get("peer_max_drift") is not None]
            pm = [e.get("peer_max_dmom") for e in es if e.get("peer_max_dmom") is not None]
            rng = lambda xs: (f"{min(xs):.1e}..{max(xs):.1e}" if xs else "n/a")  # noqa: E731
            lines.append(f"    {tag:9s} {_run_name(v):36s} {v['time']:7.3f} "
                         f"{v['max_abs_dE']:8.1e} " + " ".join(_ratio_cell(e) for e in es)
                         + f"  {v['max_drift']:7.1e} {rng(pd):>17s} {v['max_dmom']:7.1e} "
                         f"{rng(pm):>17s}")
    lines.append("    ('<=': vijax slower than the peer's slowest (tightest-tolerance) run, whose "
                 "error is used: the true ratio is at most this; '>=': vijax cheaper than every "
                 "peer run)")
    return lines


def summary_1(r):
    c = r["field_check"]
    lines = [f"--- (1) raw numbers: {r['problem']}, T = {r['T']:g}, E0 = {r['E0']:.6g}",
             f"    hand-written fields vs vijax (max abs diff over {c['samples']} random "
             f"states): quaternion Omega' {c['quat_omega_dot']:.1e}, q' {c['quat_kinematics']:.1e};"
             f" matrix Omega' {c['mat_omega_dot']:.1e}, R' {c['mat_kinematics']:.1e} "
             f"(limit 1e-12)"]
    for sk in r.get("skipped", []):
        lines.append(f"    skipped (HOOK): {sk}")
    lines.append(f"      {'vijax run':38s} {'time[s]':>8s} {'(cpu)':>7s} {'it/st':>6s} "
                 f"{'compile':>7s} {'max|dE|':>9s} {'drift':>8s} {'dmom':>8s}")
    for v in r["vijax"].values():
        lines.append(f"      {_run_name(v):38s} {v['time']:8.3f} {v['times']['cpu_median']:7.3f} "
                     f"{v['mean_iterations']:6.2f} {v['compile_s']:7.1f} {v['max_abs_dE']:9.2e} "
                     f"{v['max_drift']:8.1e} {v['max_dmom']:8.1e}"
                     + ("" if v["converged"] else "  NOT CONVERGED"))
    lines.append(f"      {'peer (tol sweep)':38s} {'time[s]':>8s} {'(cpu)':>7s} {'steps':>6s} "
                 f"{'compile':>7s} {'max|dE|':>9s} {'drift':>8s} {'dmom':>8s} {'||q|-1|':>8s} "
                 f"{'dE(proj)':>9s}")
    for pkey, pr in r["peers"].items():
        for row in pr["rows"]:
            lines.append(f"      {label(pkey) + ' tol=' + format(row['tol'], '.0e'):38s} "
                         f"{row['time']:8.3f} {row['times']['cpu_median']:7.3f} "
                         f"{row['num_steps']:6d} {pr['compile_s']:7.1f} "
                         f"{row['max_abs_dE']:9.2e} {row['max_drift']:8.1e} "
                         f"{row['max_dmom']:8.1e} "
                         + (f"{row['max_qnorm']:8.1e} " if "max_qnorm" in row else " " * 9)
                         + f"{row['max_abs_dE_proj']:9.2e}"
                         + ("" if row["success"] else "  FAILED"))
    peers = list(r["peers"])
    lines.append("    at vijax's wall time, per peer: energy ratio (with the energy of the "
                 "projected rotation), drift [| |q| - 1 |], momentum drift:")
    for vkey, v in r["vijax"].items():
        lines.append(f"      {_run_name(v)}: vijax {v['time']:.3f} s, max|dE| "
                     f"{v['max_abs_dE']:.2e}, drift {v['max_drift']:.1e}, dmom {v['max_dmom']:.1e}")
        for p in peers:
            e = r["ratios"][f"{p}/{vkey}"]
            q = f" [{fmt(e['peer_max_qnorm'], '.1e')}]" if "peer_max_qnorm" in e else ""
            lines.append(f"        {label(p):24s} ratio {_ratio_cell(e, 9).strip():>9s} "
                         f"(proj {fmt(e.get('projected'), '.2g'):>7s}; {e.get('kind', '')}) "
                         f"peer max|dE| {fmt(e.get('peer_err'), '.2e')}, drift "
                         f"{fmt(e.get('peer_max_drift'), '.1e')}{q}, dmom "
                         f"{fmt(e.get('peer_max_dmom'), '.1e')}")
    return lines


def summary_2(r):
    lines = [f"--- (2) per-step cost, h = {r['h']}, {r['n_steps']} steps, median of "
             f"{r['rounds']} interleaved rounds"]
    for s in r.get("skipped", []):
        lines.append(f"    skipped (HOOK): {s}")
    lines.append(f"      {'configuration':44s} {'us/step':>8s} {'(cpu)':>8s} {'it/step':>7s} "
                 f"{'us/it':>7s} {'compile':>8s} {'max|dE|/E0':>10s}")
    for k, x in r["rows"].items():
        lines.append(f"      {x['label']:44s} {x['us_per_step']:8.2f} {x['us_per_step_cpu']:8.2f} "
                     f"{x['mean_iterations']:7.2f} {x['us_per_iteration']:7.2f} "
                     f"{x['compile_s']:7.1f}s {x['max_rel_dE']:10.1e}"
                     + ("" if x["converged"] else "  NOT CONVERGED"))
    lines.append("    SO(3) step / vector-space step (target <= 2 against r3_vprk and rn_group; "
                 "r3_gyro is a diagnostic): wall (cpu; per fixed-point iteration)")
    for k, e in r["ratios"].items():
        a, b = k.split("/")
        tag = f"[{_met(e['ratio'] <= e['target'])}]" if e.get("target") else "[diag]"
        lines.append(f"      {tag} {a:10s} / {b:9s} = {e['ratio']:6.2f} (cpu "
                     f"{e['ratio_cpu']:.2f}; per iteration {e['ratio_per_iteration']:.2f})")
    lines.append("      (" + "; ".join(f"{k} = {x['label']}" for k, x in r["rows"].items()) + ")")
    return lines


def summary(parts):
    lines = ["", "=" * 100, "LIE-GROUP BENCHMARKS: SUMMARY", "=" * 100]
    if "1" in parts:
        lines += short_table_1(parts["1"]["results"])
    if "2" in parts:
        r = parts["2"]["results"]
        lines.append("SHORT TABLE (2): per-step cost, SO(3) / R^3 (target <= 2): " + ", ".join(
            f"{k} {e['ratio']:.2f}x" for k, e in r["ratios"].items() if e.get("target")))
    lines.append("-" * 100)
    if "1" in parts:
        for r in parts["1"]["results"].values():
            lines += summary_1(r)
    if "2" in parts:
        lines += summary_2(parts["2"]["results"])
    for p, d in parts.items():
        lines.append(f"    part {p}: {d['seconds']:.0f} s, load average {d['loadavg_start']} -> "
                     f"{d['loadavg_end']}")
    return lines


def replot(parts):
    if "1" in parts:
        for name, r in parts["1"]["results"].items():
            plot_part_1(r, RESULTS / f"lie_groups_{name}{TAG}.png")
    if "2" in parts:
        plot_part_2(parts["2"]["results"], RESULTS / f"lie_groups_step_cost{TAG}.png")


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main(argv=None):
    global RESULTS, TAG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="1,2", help="comma-separated subset of 1,2")
    ap.add_argument("--quick", action="store_true", help="small sizes (< 3 min): smoke test")
    ap.add_argument("--out", default=str(RESULTS), help="output folder")
    ap.add_argument("--summary-only", action="store_true",
                    help="rebuild the summary and the plots from the JSON file and exit")
    ap.add_argument("--xla-small-loop-threshold", type=int, default=None, metavar="BYTES",
                    help="sensitivity check: XLA:CPU's xla_cpu_small_while_loop_byte_threshold "
                         "(default 1 kB); results get the suffix _xlaloopBYTES")
    ap.add_argument("--tag", default="", help="output name suffix (e.g. _options)")
    args = ap.parse_args(argv)
    TAG, cfg = ("_quick", QUICK) if args.quick else ("", FULL)
    TAG += args.tag
    if args.xla_small_loop_threshold is not None:
        if XLA_SMALL_LOOP_THRESHOLD != args.xla_small_loop_threshold:
            ap.error("--xla-small-loop-threshold only works from the command line (it must "
                     "reach XLA_FLAGS before JAX starts)")
        TAG += f"_xlaloop{args.xla_small_loop_threshold}"
    RESULTS = Path(args.out)
    RESULTS.mkdir(parents=True, exist_ok=True)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    bad = set(parts) - set(cfg)
    if bad:
        ap.error(f"unknown parts {sorted(bad)}; choose from 1, 2")
    path = RESULTS / f"lie_groups{TAG}.json"
    doc = unjson(json.loads(path.read_text())) if path.exists() else {"parts": {}}
    if args.summary_only:
        replot(doc["parts"])
        write_summary(summary(doc["parts"]), RESULTS / f"lie_groups_summary{TAG}.txt")
        return
    info = machine_info()
    log(f"machine: {info['platform']} | {info['cpu']} x {info['cpu_count']} | jax "
        f"{info['jax']} | diffrax {info['diffrax']} | devices {info['devices']} | "
        f"{'QUICK' if args.quick else 'FULL'} | parts {','.join(parts)} | load {loadavg()}"
        + (f" | VRKMK missing (HOOK): {VRKMK_MISSING}" if VRKMK is None else ""))
    t_start = time.perf_counter()
    fns = {"1": part_1, "2": part_2}
    for p in sorted(parts):
        t0, load0 = time.perf_counter(), loadavg()
        r = fns[p](cfg[p])
        dt = time.perf_counter() - t0
        log(f"[{p}] done in {dt:.1f} s (load average {load0} -> {loadavg()})")
        doc["parts"][p] = unjson(jsonable(dict(
            part=p, machine=info, config=cfg[p], seconds=dt, loadavg_start=load0,
            loadavg_end=loadavg(), command=command_line("lie_groups.py", argv),
            vrkmk_available=VRKMK is not None, results=r)))
        path.write_text(json.dumps(jsonable(doc), indent=1))
    write_summary(summary({p: doc["parts"][p] for p in sorted(doc["parts"])}),
                  RESULTS / f"lie_groups_summary{TAG}.txt", t_start,
                  command_line("lie_groups.py", argv))


if __name__ == "__main__":
    main()
