"""Muehlebach, Heimsch & Glocker (2016), §6: the three pendulum experiments, reproduced.

* 6.1 -- polar pendulum, continuous-time DG scheme (q̃ left-, p̃ right-continuous, quadratics);
* 6.2 -- the same with the Marsden--West Galerkin VI (continuous q̃, App. B variant);
* 6.3 -- Cartesian pendulum with the holonomic constraint |q|² = l² (constrained DG).

Table I data: m = 1 kg, l = 2 m, g = 9.81 m/s², q0 = 120°, p0 = 0, T = 0.3 s, 15 s.  The
paper's rule (§6.1; the paper does not say which point of each rectangle, and the left point
reproduces Table II): kinetic integrals exact, potential by left rectangles of width 1e-4 s.
The reference is scipy's DOP853 (rtol 1e-13) in the angle.

Prints the paper-vs-measured table and the measured convergence orders (q and p, error at
t = 3 s, T = 0.3 halving) of every DG scheme, writes out/continuous_time_summary.md and, with
matplotlib, out/continuous_time_*.png.  Runs in about a minute on 2 cores.
"""

from __future__ import annotations

import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from scipy.integrate import solve_ivp

jax.config.update("jax_enable_x64", True)

import vijax as vj  # noqa: E402
from vijax.integrators.galerkin import CGVI, DGVI  # noqa: E402
from vijax.quadrature import Quadrature  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[1] / "out"
M, L, G = 1.0, 2.0, 9.81
PHI0, T, HORIZON = 2 * np.pi / 3, 0.3, 15.0
PEND = vj.systems.Pendulum(m=M, l=L, g=G)
CART = vj.systems.CartesianPendulum(m=M, l=L, gravity=G)  # g = (|q|² - l²)/2
Q0, P0 = jnp.array([PHI0]), jnp.array([0.0])
CQ0, CP0 = jnp.array([np.sqrt(3.0), 1.0]), jnp.zeros(2)
RECT = {rule: Quadrature.rectangle(rule, width=1e-4, h=T) for rule in ("left", "mid", "right")}


def angle_reference(ts):
    r = solve_ivp(lambda t, y: [y[1], -G / L * np.sin(y[0])], (0.0, float(ts[-1])), [PHI0, 0.0],
                  method="DOP853", rtol=1e-13, atol=1e-14, t_eval=np.asarray(ts))
    return r.y


def polar_reference(ts):
    phi, om = angle_reference(ts)
    return phi[:, None], M * L * L * om[:, None]


def cartesian_reference(ts):
    phi, om = angle_reference(ts)
    q = L * np.stack([np.sin(phi), -np.cos(phi)], axis=1)
    p = M * L * om[:, None] * np.stack([np.cos(phi), np.sin(phi)], axis=1)
    return q, p


def rms(e):
    e = np.asarray(e, np.float64).reshape(len(e), -1)
    return float(np.sqrt(np.mean(np.sum(e**2, axis=1))))


def experiment(system, integ, q0, p0, reference, dt_grid=1e-3):
    sol = vj.simulate(system, integ, q0=q0, p0=p0, dt=T, n_steps=int(round(HORIZON / T)),
                      throw=True, dense=True)
    ts = np.linspace(0.0, HORIZON, int(round(HORIZON / dt_grid)) + 1)
    d = sol.evaluate(jnp.asarray(ts))
    q_ref, p_ref = reference(ts)
    qn_ref, pn_ref = reference(np.asarray(sol.t))
    return dict(sol=sol, ts=ts, dense=d, q_ref=q_ref, p_ref=p_ref,
                dense_q=rms(np.asarray(d.q) - q_ref), dense_p=rms(np.asarray(d.p) - p_ref),
                nodal_q=rms(np.asarray(sol.q) - qn_ref), nodal_p=rms(np.asarray(sol.p) - pn_ref))


def order_study(system, integ, t_final=3.0, counts=(10, 20, 40, 80, 160)):
    if system is PEND:
        q0, v0 = Q0, P0 / (M * L * L)
        qr, pr = (x[-1] for x in polar_reference([0.0, t_final]))
    else:
        q0, v0 = CQ0, CP0
        qr, pr = (x[-1] for x in cartesian_reference([0.0, t_final]))
    hs, eq, ep = [], [], []
    for n in counts:
        state, ok = vj.diagnostics.advance(system, integ, q0, v0, jnp.asarray(t_final / n),
                                           jnp.asarray(n))
        if not bool(ok):
            raise RuntimeError(f"{integ.name}: a step did not converge (n = {n})")
        hs.append(t_final / n)
        eq.append(float(np.linalg.norm(np.asarray(state.q) - qr)))
        ep.append(float(np.linalg.norm(np.asarray(state.p) - pr)))
    return (vj.diagnostics.estimate_order(hs, eq).order, vj.diagnostics.estimate_order(hs, ep).order,
            hs, eq, ep)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    t_start = time.time()
    lines = ["# Continuous-time VIs of Muehlebach et al. (2016): pendulum experiments", ""]

    # -- the three experiments ---------------------------------------------------------------
    runs = {
        "6.1 DG s=3, left rectangles": experiment(
            PEND, DGVI(3, RECT["left"], kinetic_quadrature=3), Q0, P0, polar_reference),
        "6.1 DG s=3, exact integrals": experiment(PEND, DGVI(3, 20), Q0, P0, polar_reference),
        "6.2 MW r=2, left rectangles": experiment(
            PEND, CGVI(2, RECT["left"], kinetic_quadrature=2), Q0, P0, polar_reference),
        "6.2 MW r=2, exact integrals": experiment(PEND, CGVI(2, 20), Q0, P0, polar_reference),
        "6.3 constrained DG s=3": experiment(CART, DGVI(3), CQ0, CP0, cartesian_reference),
    }
    dg61, mw62, c63 = (runs["6.1 DG s=3, left rectangles"], runs["6.2 MW r=2, left rectangles"],
                       runs["6.3 constrained DG s=3"])
    # the 1e-2 s grid reproduces the paper's 6.1 momentum value (the paper does not define it)
    coarse = experiment(PEND, DGVI(3, RECT["left"], kinetic_quadrature=3), Q0, P0,
                        polar_reference, dt_grid=1e-2)

    def energy(sol):
        q, p = np.asarray(sol.q)[:, 0], np.asarray(sol.p)[:, 0]
        return 0.5 * p**2 / (M * L * L) - M * G * L * np.cos(q)

    e61 = energy(dg61["sol"])
    e61x = energy(runs["6.1 DG s=3, exact integrals"]["sol"])
    st63 = c63["sol"].states
    gap_dense = np.sum(np.asarray(c63["dense"].q) ** 2, axis=1) - L * L  # paper's g
    integ63 = DGVI(3)
    taus = jnp.linspace(0.0, 1.0, 21)
    inner = jax.tree_util.tree_map(lambda x: x[1:], st63)
    dpg = jax.vmap(lambda s: integ63.interval(s, taus, derivative=True).pg[:, 0])(inner)
    qq = jax.vmap(lambda s: integ63.interval(s, taus).q)(inner)
    force = np.asarray(jnp.linalg.norm(qq, axis=-1) * dpg)

    rows = [
        ("6.1 RMS q (dense, grid 1e-3 s)", "1.24e-4 (nodal?)", dg61["dense_q"]),
        ("6.1 RMS q (nodal)", "1.24e-4", dg61["nodal_q"]),
        ("6.1 RMS p (dense, grid 1e-3 s)", "1.40e-2", dg61["dense_p"]),
        ("6.1 RMS p (dense, grid 1e-2 s)", "1.40e-2", coarse["dense_p"]),
        ("6.1 RMS p (nodal)", "-", dg61["nodal_p"]),
        ("6.1 nodal energy min (left rule)", "osc. around 9.81", e61.min()),
        ("6.1 nodal energy max (left rule)", "osc. around 9.81", e61.max()),
        ("6.1 nodal energy min/max (exact integrals)", "-", f"{e61x.min():.5f} / {e61x.max():.5f}"),
        ("6.1 max balance (24) residual, left rule", "-",
         float(np.max(np.abs(np.asarray(dg61["sol"].states.balance))))),
        ("6.1 max balance (24) residual, exact", "exact",
         float(np.max(np.abs(np.asarray(runs["6.1 DG s=3, exact integrals"]["sol"].states.balance))))),
        ("6.1 max jump q(t_i+) - q_i", "-", float(np.max(np.abs(dg61["sol"].states.jump_q)))),
        ("6.1 max jump p(t_i-) - p_i", "-", float(np.max(np.abs(dg61["sol"].states.jump_p)))),
        ("6.2 RMS q (dense, grid 1e-3 s)", "1.48e-3", mw62["dense_q"]),
        ("6.2 RMS m l² dq/dt (dense, grid 1e-3 s)", "1.14e-1", mw62["dense_p"]),
        ("6.2 RMS q / p (nodal)", "-", f"{mw62['nodal_q']:.3e} / {mw62['nodal_p']:.3e}"),
        ("6.3 RMS position (dense, grid 1e-3 s)", "< 2.26e-2", c63["dense_q"]),
        ("6.3 RMS momentum (dense, grid 1e-3 s)", "< 1.51e-1", c63["dense_p"]),
        ("6.3 RMS position / tangential p (nodal)", "-",
         f"{c63['nodal_q']:.3e} / {c63['nodal_p']:.3e}"),
        ("6.3 max |g(q_i)| at the nodes", "0", float(np.max(np.abs(np.asarray(st63.gap))))),
        ("6.3 |q|² - l² inside the intervals", "≠ 0", f"{gap_dense.min():.3f} .. {gap_dense.max():.3f}"),
        ("6.3 rod force |W| dp_g/dt range [N]", "exact -39.24 .. 4.905",
         f"{force.min():.2f} .. {force.max():.2f}"),
        ("6.3 max balance (40) residual", "exact", float(np.max(np.abs(np.asarray(st63.balance))))),
        ("6.3 Newton iterations per step (max)", "< 15",
         int(np.max(np.asarray(c63["sol"].stats.max_iterations)))),
    ]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    table = ["| quantity | paper | measured |", "|---|---|---|"]
    table += [f"| {name} | {paper} | {fmt(val)} |" for name, paper, val in rows]
    lines += ["## Paper numbers (Table II, §6.3)", ""] + table + [""]

    # -- convergence orders ------------------------------------------------------------------
    default = (10, 20, 40, 80, 160)  # T = 0.3 ... 0.01875
    cases = [
        ("DG s=1 (symplectic Euler)", PEND, DGVI(1), 1, default),
        ("DG s=2", PEND, DGVI(2), 3, default),
        ("DG s=2, Gauss-2 (the PRK of Sect. 5)", PEND, DGVI(2, 2), 3, default),
        ("DG s=3 (the 6.1 scheme, exact)", PEND, DGVI(3), 5, default),
        ("DG s=3, Gauss-3", PEND, DGVI(3, 3), 5, default),
        ("DG s=4 (round-off below T = 0.075)", PEND, DGVI(4), 7, (14, 20, 28, 40)),
        ("MW r=1", PEND, CGVI(1), 2, default),
        ("MW r=2", PEND, CGVI(2), 4, default),
        ("MW r=3", PEND, CGVI(3), 6, default),
        ("constrained DG s=1 (no solution for T > 2l/v_max; pre-asymptotic)", CART, DGVI(1), 1,
         (80, 160, 320, 640, 1280)),
        ("constrained DG s=2 (pre-asymptotic up to T ~ 0.01)", CART, DGVI(2), 3,
         (40, 80, 160, 320, 640)),
        ("constrained DG s=3 (6.3)", CART, DGVI(3), 5, default),
    ]
    otable = ["| scheme | expected | order q | order p | T range | error q (largest T) | "
              "error q (smallest T) |", "|---|---|---|---|---|---|---|"]
    studies = {}
    for name, system, integ, expected, counts in cases:
        oq, op, hs, eq, ep = order_study(system, integ, counts=counts)
        studies[name] = (hs, eq)
        otable.append(f"| {name} | {expected} | {oq:.2f} | {op:.2f} | {hs[0]:.4g} .. "
                      f"{hs[-1]:.4g} | {eq[0]:.2e} | {eq[-1]:.2e} |")
    lines += ["## Measured nodal orders (error at t = 3 s; least-squares slope of log error)", ""]
    lines += otable + [""]
    lines += [f"Total run time: {time.time() - t_start:.0f} s.", ""]

    text = "\n".join(lines)
    print(text)
    (OUT / "continuous_time_summary.md").write_text(text)

    # -- figures -----------------------------------------------------------------------------
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping figures (pip install 'vijax[bench]')")
        return

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    d = dg61["dense"]
    axes[0].plot(dg61["q_ref"][:, 0], dg61["p_ref"][:, 0], "k-", lw=0.8, label="reference")
    axes[0].plot(np.asarray(d.q)[:, 0], np.asarray(d.p)[:, 0], lw=0.8, label="DG s=3 (dense)")
    axes[0].plot(np.asarray(dg61["sol"].q)[:, 0], np.asarray(dg61["sol"].p)[:, 0], "o", ms=3,
                 label="nodes")
    axes[0].set(xlabel="q [rad]", ylabel="p [kg m²/s]", title="6.1 phase portrait")
    axes[0].legend(fontsize=8)
    t_nodes = np.asarray(dg61["sol"].t)
    axes[1].plot(t_nodes, e61, "o-", ms=3, label="left rectangles")
    axes[1].plot(t_nodes, e61x, "s-", ms=3, label="exact integrals")
    axes[1].axhline(9.81, color="k", lw=0.8)
    axes[1].set(xlabel="t [s]", ylabel="H(q_i, p_i) [J]", title="6.1 nodal energy")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "continuous_time_61.png", dpi=130)

    fig, ax = plt.subplots(figsize=(8, 4))
    ts = dg61["ts"]
    ax.semilogy(ts, np.abs(np.asarray(mw62["dense"].p)[:, 0] - mw62["p_ref"][:, 0]) + 1e-12,
                lw=0.6, label="6.2 MW: |m l² dq̃/dt - p|")
    ax.semilogy(ts, np.abs(np.asarray(d.p)[:, 0] - dg61["p_ref"][:, 0]) + 1e-12, lw=0.6,
                label="6.1 DG: |p̃ - p|")
    ax.set(xlabel="t [s]", ylabel="momentum error", title="6.1 vs 6.2 (dense)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "continuous_time_61_vs_62.png", dpi=130)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot(c63["ts"], gap_dense, lw=0.8)
    axes[0].plot(np.asarray(c63["sol"].t), np.sum(np.asarray(c63["sol"].q) ** 2, 1) - L * L,
                 "o", ms=3)
    axes[0].set(xlabel="t [s]", ylabel="|q|² - l² [m²]", title="6.3 gap (zero at the nodes)")
    t_in = (np.asarray(inner.t) - np.asarray(inner.h))[:, None] + np.asarray(taus)[None] * T
    axes[1].plot(t_in.T, force.T, "C1", lw=0.8)
    axes[1].set(xlabel="t [s]", ylabel="|W| dp̃_g/dt [N]", title="6.3 rod force (dp̃_g/dt piecewise linear)")
    fig.tight_layout()
    fig.savefig(OUT / "continuous_time_63.png", dpi=130)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, (hs, eq) in studies.items():
        ax.loglog(hs, eq, "o-", ms=3, label=name)
    ax.set(xlabel="T [s]", ylabel="nodal error at t = 3 s", title="Convergence (DG and MW)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(OUT / "continuous_time_orders.png", dpi=130)
    print(f"figures written to {OUT}/continuous_time_*.png")


if __name__ == "__main__":
    main()
