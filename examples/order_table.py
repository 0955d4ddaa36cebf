"""Measured convergence orders of every VPRK preset (`make orders`).

For each preset (implicit midpoint, Störmer–Verlet, Gauss s = 1..4, Lobatto IIIA–IIIB
s = 2..5) and two nonlinear problems -- the pendulum released at rest from 1.5 rad, up to
T = 4, and the Kepler orbit of eccentricity 0.5 over one period T = 2 pi -- the global errors
in q and p at T are measured against exact solutions (Jacobi elliptic functions; Kepler's
equation) for a geometric sequence of step counts, and the order is the least-squares slope
of log(error) against log(h) (:func:`vijax.diagnostics.estimate_order`).  The step counts are
those of ``tests/test_vprk_numerics.py``: every error is in the asymptotic regime and above
round-off.

Prints a Markdown table and writes it to out/order_table.md.  Exit status 1 if any measured
order is more than 0.3 away from theory.  Runs in well under a minute on 2 CPU cores.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from scipy.special import ellipj, ellipk  # noqa: E402

import vijax as vj  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[1] / "out"
TOL = 0.3

# (label, constructor, theoretical order)
PRESETS = [
    ("VPRK.midpoint()", vj.VPRK.midpoint, 2),
    ("VPRK.stormer_verlet()", vj.VPRK.stormer_verlet, 2),
    ("VPRK.gauss(1)", lambda: vj.VPRK.gauss(1), 2),
    ("VPRK.gauss(2)", lambda: vj.VPRK.gauss(2), 4),
    ("VPRK.gauss(3)", lambda: vj.VPRK.gauss(3), 6),
    ("VPRK.gauss(4)", lambda: vj.VPRK.gauss(4), 8),
    ("VPRK.lobatto(2)", lambda: vj.VPRK.lobatto(2), 2),
    ("VPRK.lobatto(3)", lambda: vj.VPRK.lobatto(3), 4),
    ("VPRK.lobatto(4)", lambda: vj.VPRK.lobatto(4), 6),
    ("VPRK.lobatto(5)", lambda: vj.VPRK.lobatto(5), 8),
]

# Step counts per (problem, order): the study design of the test suite, loaded from it so that
# this table and the asserted orders can never drift apart.
_spec = importlib.util.spec_from_file_location(
    "_vprk_numerics", pathlib.Path(__file__).resolve().parents[1] / "tests" / "test_vprk_numerics.py")
_numerics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_numerics)
STEP_COUNTS = _numerics.STEP_COUNTS


def pendulum_problem(theta0=1.5, t_final=4.0):
    """Pendulum released at rest from ``theta0``; exact solution by Jacobi elliptic functions:
    ``theta = 2 arcsin(k sn(K(m) - w t | m))``, ``k = sin(theta0 / 2)``, ``m = k^2``."""
    system = vj.systems.Pendulum()
    k = np.sin(theta0 / 2.0)
    w = np.sqrt(system.g / system.l)
    sn, cn, _, _ = ellipj(ellipk(k * k) - w * t_final, k * k)
    q_ref = np.array([2.0 * np.arcsin(k * sn)])
    p_ref = np.array([system.m * system.l**2 * (-2.0 * k * w * cn)])
    return system, jnp.array([theta0]), jnp.array([0.0]), t_final, q_ref, p_ref


def kepler_problem(e=0.5, t_final=2.0 * np.pi):
    """Kepler orbit from pericentre (a = 1, mu = 1, period 2 pi); exact solution by Newton on
    Kepler's equation ``E - e sin E = t``."""
    system = vj.systems.Kepler()
    q0, v0 = system.initial_conditions(e)
    mean_anomaly = t_final % (2.0 * np.pi)
    ecc = mean_anomaly
    for _ in range(60):
        ecc -= (ecc - e * np.sin(ecc) - mean_anomaly) / (1.0 - e * np.cos(ecc))
    rate = 1.0 / (1.0 - e * np.cos(ecc))
    q_ref = np.array([np.cos(ecc) - e, np.sqrt(1.0 - e * e) * np.sin(ecc)])
    p_ref = system.m * np.array([-np.sin(ecc) * rate, np.sqrt(1.0 - e * e) * np.cos(ecc) * rate])
    return system, q0, v0, t_final, q_ref, p_ref


PROBLEMS = {
    "pendulum": ("pendulum, θ0 = 1.5, v0 = 0, T = 4", pendulum_problem()),
    "kepler": ("Kepler, e = 0.5, T = 2π (one orbit)", kepler_problem()),
}


advance = vj.diagnostics.advance


def study(problem, integrator, ns):
    system, q0, v0, t_final, q_ref, p_ref = problem
    hs, err_q, err_p = [], [], []
    for n in ns:
        h = t_final / n
        state, ok = advance(system, integrator, q0, v0, jnp.asarray(h), jnp.asarray(n))
        if not bool(ok):
            raise RuntimeError(f"{integrator.name}: a stage solve did not converge (n = {n})")
        hs.append(h)
        err_q.append(float(np.max(np.abs(np.asarray(state.q) - q_ref))))
        err_p.append(float(np.max(np.abs(np.asarray(state.p) - p_ref))))
    hs, err_q, err_p = np.array(hs), np.array(err_q), np.array(err_p)
    fit_q = vj.diagnostics.estimate_order(hs, err_q)
    fit_p = vj.diagnostics.estimate_order(hs, err_p)
    return dict(ns=list(ns), hs=hs, err_q=err_q, err_p=err_p, fit_q=fit_q, fit_p=fit_p)


def main() -> int:
    start = time.perf_counter()
    results = {}
    for label, make, order in PRESETS:
        integrator = make()
        for key, (_, problem) in PROBLEMS.items():
            results[label, key] = study(problem, integrator, STEP_COUNTS[key, order])

    def order_cell(fit, expected):
        mark = "" if abs(fit.order - expected) <= TOL else " ✗"
        return f"{fit.order:.2f}{mark}"

    def err_cell(errs):
        return f"{errs[0]:.1e} → {errs[-1]:.1e}"

    lines = [
        "# Measured convergence orders of the VPRK presets",
        "",
        "Global max-norm errors at T against exact solutions; order = least-squares slope of "
        "log(error) vs log(h) (`vijax.diagnostics.estimate_order`); errors listed from the "
        f"largest to the smallest step. ✗ marks a deviation > {TOL} from theory.",
        "",
        "* " + PROBLEMS["pendulum"][0],
        "* " + PROBLEMS["kepler"][0],
        "",
        "| preset | method | expected | pendulum q | pendulum p | pendulum err q | pendulum err p "
        "| Kepler q | Kepler p | Kepler err q | Kepler err p |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    failures = 0
    for label, make, order in PRESETS:
        cells = [f"`{label}`", make().name, str(order)]
        for key in PROBLEMS:
            r = results[label, key]
            failures += sum(abs(f.order - order) > TOL for f in (r["fit_q"], r["fit_p"]))
            cells += [order_cell(r["fit_q"], order), order_cell(r["fit_p"], order),
                      err_cell(r["err_q"]), err_cell(r["err_p"])]
        lines.append("| " + " | ".join(cells) + " |")

    lines += ["", "## All errors", ""]
    for key, (title, _) in PROBLEMS.items():
        lines += [f"### {title}", "", "| preset | n | h | err q | err p |", "|---|---|---|---|---|"]
        for label, _, _ in PRESETS:
            r = results[label, key]
            for i, (n, h, eq, ep) in enumerate(zip(r["ns"], r["hs"], r["err_q"], r["err_p"])):
                used = "" if (r["fit_q"].used[i] and r["fit_p"].used[i]) else " (not fitted)"
                lines.append(f"| `{label}` | {n} | {h:.4g} | {eq:.3e} | {ep:.3e}{used} |")
        lines.append("")
    elapsed = time.perf_counter() - start
    lines.append(f"_{len(PRESETS) * len(PROBLEMS)} studies in {elapsed:.1f} s; "
                 f"{failures} order(s) outside ±{TOL}._")

    text = "\n".join(lines) + "\n"
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "order_table.md").write_text(text)
    print(f"written to {OUT / 'order_table.md'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
