"""The Lie-group experiments of the two papers behind vijax's group integrators, with figures.

Bogfjellmo & Marthinsen (2016), "High-order symplectic partitioned Lie group methods", §6, on
their dipole on a stick (``vj.systems.DipoleOnStick``, the data of §6.1, physical gravity sign):

* **Fig. 2** -- order of convergence at t = 0.5: the error ``‖Δμ‖₂ + ‖Δg‖₂`` (spatial momentum
  ``μ = g μ̄``, spectral norm of the rotation) against ``VRKMK.gauss(3)`` at h = 1e-3, for
  h = 0.5/N.  Panel (a) VRKMK midpoint, Kutta3, Gauss2, Gauss3 (orders 2, 3, 4, 6); panel (b)
  VCG midpoint, triple jump, Yoshida6 (orders 2, 4, 6).  Slopes are least-squares fits over
  the step counts of the test suite (Kutta3 only from N = 80: irregular before; the
  sixth-order methods before round-off).
* **Fig. 3** -- energy error ``H − H0`` over t ∈ (0, 1000) at h = 0.01 for VRKMK midpoint,
  VRKMK Gauss2, VCG midpoint and VCG triple jump (the paper's values: about 1e-3, 1e-7, 1e-3,
  1e-5), with the maxima per tenth of the run (no drift).

Martín de Diego & Sato Martín de Almagro (2022), "Variational order for forced Lagrangian
systems II: Euler-Lagrange equations with forcing and constraints on Lie groups"
(``vj.GroupVPRK.lobatto(s, retraction=vj.lie.Cayley())``):

* **Fig. 7** -- the unicycle with a spring on SE(2) (§7.4, ``vj.systems.Unicycle``): errors at
  T = 2 against the exact solution in ``g`` (Frobenius), the body momentum ``μ`` and the
  multiplier ``λ`` for s = 2, 3, 4; expected orders (2, 2, 2), (4, 4, 2), (6, 6, 4).
* **Fig. 8** -- the ball on a turntable (§7.5, ``vj.systems.BallOnTurntable``, SO(3) × R²,
  affine constraints): the errors of its four first integrals ``I1, I2, I3, E_mov`` over
  t ∈ (0, 100) with Lobatto-3 at h = 0.1 (the paper's prototype: ``E_mov`` to about 2e-9).

Every number is also checked: a slope more than 0.3 off its order, an energy maximum more than
a factor 3 off the paper's value, a drifting energy or a first integral ``I1..I3`` above 1e-10
fails the run with an AssertionError (after the figures and the summary are written), so the
script doubles as a verification script.

    python examples/lie_group_figures.py            # full run, writes out/lie_groups/
    python examples/lie_group_figures.py --quick    # Fig. 3 to T = 100 only (smoke test)
    python examples/lie_group_figures.py --out DIR

Writes ``fig2_dipole_orders.png``, ``fig3_dipole_energy.png``, ``fig7_unicycle_orders.png``,
``fig8_turntable_integrals.png`` (with matplotlib) and ``summary.txt``.  Stage-solve failures
abort the run.  Measured on a shared 2-core CPU: the full run 2 min 1 s wall (Fig. 3 54 s, of
which VCG triple jump 25 s; 1.1 GB peak memory), ``--quick`` 1 min 8 s to 1 min 28 s; both mostly
compilation (one per method).  The full run prints (abridged)

    Fig. 2   method            order  slope   (fit)
             VRKMK midpoint        2   2.00   N = 10..80
             VRKMK Kutta3          3   2.92   N = 80..640
             VRKMK Gauss2          4   4.00   N = 5..40
             VRKMK Gauss3          6   6.04   N = 5..20
             VCG midpoint          2   2.00   N = 10..80
             VCG triple jump       4   3.95   N = 5..40
             VCG Yoshida6          6   5.94   N = 5..40
    Fig. 3   method            max|H - H0|  paper  (maxima per 100 time units: flat)
             VRKMK midpoint       1.03e-03   1e-3   9.8e-4 .. 1.03e-3
             VRKMK Gauss2         1.42e-07   1e-7   1.23e-7 .. 1.42e-7
             VCG midpoint         1.03e-03   1e-3   9.9e-4 .. 1.03e-3
             VCG triple jump      1.14e-05   1e-5   1.01e-5 .. 1.14e-5
    Fig. 7   s   slopes g / mu / lambda   expected
             2   2.00 / 2.01 / 2.00       2 / 2 / 2
             3   4.00 / 3.99 / 2.00       4 / 4 / 2
             4   6.00 / 6.00 / 4.00       6 / 6 / 4
    Fig. 8   max error I1 7.7e-15, I2 2.8e-15, I3 3.6e-15, E_mov 1.91e-09 (no drift)

With ``--quick`` (Fig. 3 to T = 100) the energy maxima are 1.03e-3, 1.30e-7, 1.03e-3, 1.14e-5.
The midpoint VRKMK and the midpoint VCG are the same method (Bogfjellmo & Marthinsen (2016),
Example 3.3): their errors agree, and their energy traces up to round-off growth.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import vijax as vj  # noqa: E402

SLOPE_TOL = 0.3      # allowed |measured slope - expected order|
ENERGY_FACTOR = 3.0  # allowed ratio between a measured energy maximum and the paper's value
LINES: list[str] = []
FAILURES: list[str] = []


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def say(text=""):
    print(text, flush=True)
    LINES.append(text)


def check(ok, what):
    if not ok:
        FAILURES.append(what)
        say(f"  !! CHECK FAILED: {what}")


@eqx.filter_jit
def _advance(integ, system, g0, xi0, h, n):
    def body(_, carry):
        st, ok = carry
        st, stats = integ.step(system, st, h)
        return st, ok & stats.converged

    return jax.lax.fori_loop(0, n, body, (integ.init(system, 0.0, g0, xi0), jnp.asarray(True)))


def final_state(integ, system, g0, xi0, h, n):
    """The state after ``n`` steps of size ``h`` (``h`` and ``n`` are traced: one compilation
    per method and system for a whole convergence study)."""
    st, ok = _advance(integ, system, g0, xi0, jnp.asarray(h), jnp.asarray(n))
    assert bool(ok), f"{type(integ).__name__}: a stage solve did not converge (h = {h})"
    return st


def slope(hs, errs):
    return float(np.polyfit(np.log(hs), np.log(errs), 1)[0])


def check_slope(name, got, want):
    check(abs(got - want) <= SLOPE_TOL, f"{name}: slope {got:.2f}, expected {want}")


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def loglog_panel(ax, title, series, xlabel="h"):
    """``series``: (label, hs, errs, fit hs, expected order): markers, and a dashed reference
    slope ``C h^p`` through the finest fitted point."""
    for k, (label, hs, errs, fit_hs, order) in enumerate(series):
        color = f"C{k}"
        ax.loglog(hs, errs, "o-", color=color, label=label, ms=4)
        h1 = min(fit_hs)
        e1 = errs[list(hs).index(h1)]
        hh = np.array([h1, max(fit_hs)])
        ax.loglog(hh, e1 * (hh / h1) ** order, "--", color=color, lw=0.8, alpha=0.7)
    ax.set(title=title, xlabel=xlabel, ylabel="error")
    ax.xaxis.set_minor_formatter("")  # label the decades only
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


# --------------------------------------------------------------------------------------------
# Bogfjellmo & Marthinsen (2016), Fig. 2: orders on the dipole on a stick
# --------------------------------------------------------------------------------------------

NS = [5, 10, 20, 40, 80, 160]
# (label, method, expected order, step counts N of the fit, extra N)
FIG2 = {
    "(a) VRKMK": [
        ("midpoint", vj.VRKMK.midpoint(), 2, [10, 20, 40, 80], []),
        ("Kutta3", vj.VRKMK.kutta3(), 3, [80, 160, 320, 640], [320, 640]),
        ("Gauss2", vj.VRKMK.gauss(2), 4, [5, 10, 20, 40], []),
        ("Gauss3", vj.VRKMK.gauss(3), 6, [5, 10, 20], []),
    ],
    "(b) VCG": [
        ("midpoint", vj.VCG.midpoint(), 2, [10, 20, 40, 80], []),
        ("triple jump", vj.VCG.triple_jump(), 4, [5, 10, 20, 40], []),
        ("Yoshida6", vj.VCG.yoshida6(), 6, [5, 10, 20, 40], []),
    ],
}


def dipole_error(st, ref):
    """``‖Δμ‖₂ + ‖Δg‖₂`` with the spatial momentum ``μ = g μ̄`` and the spectral norm."""
    dmu = np.linalg.norm(np.asarray(st.q @ st.p - ref.q @ ref.p))
    return float(dmu + np.linalg.norm(np.asarray(st.q - ref.q), 2))


def fig2(out, plt):
    say("## Bogfjellmo & Marthinsen (2016), Fig. 2: dipole on a stick, error at t = 0.5")
    system = vj.systems.DipoleOnStick()
    g0, w0 = system.initial()
    ref = final_state(vj.VRKMK.gauss(3), system, g0, w0, 1e-3, 500)
    say("reference VRKMK Gauss3 h = 1e-3: spatial μ(0.5) = "
        + np.array2string(np.asarray(ref.q @ ref.p), precision=9))
    panels = {}
    for panel, methods in FIG2.items():
        series = []
        for label, integ, order, fit_ns, extra in methods:
            ns = NS + extra
            errs = [dipole_error(final_state(integ, system, g0, w0, 0.5 / n, n), ref)
                    for n in ns]
            hs = [0.5 / n for n in ns]
            fit = [ns.index(n) for n in fit_ns]
            p = slope(np.array(hs)[fit], np.array(errs)[fit])
            name = f"{panel[4:]} {label}"
            say(f"  {name:<20} order {order}  slope {p:5.2f} (N = {fit_ns[0]}..{fit_ns[-1]})  "
                "errors " + " ".join(f"{e:.2e}" for e in errs))
            check_slope(name, p, order)
            series.append((f"{label} (slope {p:.2f})", hs, errs, [hs[i] for i in fit], order))
        panels[panel] = series
    if plt:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, (panel, series) in zip(axes, panels.items()):
            loglog_panel(ax, f"{panel}: error at t = 0.5", series)
        fig.tight_layout()
        fig.savefig(out / "fig2_dipole_orders.png", dpi=130)
        plt.close(fig)


# --------------------------------------------------------------------------------------------
# Bogfjellmo & Marthinsen (2016), Fig. 3: long-time energy error
# --------------------------------------------------------------------------------------------

# (label, method, the paper's max |H - H0| at h = 0.01)
FIG3 = [
    ("VRKMK midpoint", vj.VRKMK.midpoint(), 1e-3),
    ("VRKMK Gauss2", vj.VRKMK.gauss(2), 1e-7),
    ("VCG midpoint", vj.VCG.midpoint(), 1e-3),
    ("VCG triple jump", vj.VCG.triple_jump(), 1e-5),
]


def fig3(out, plt, T):
    h = 0.01
    n = int(round(T / h))
    say(f"## Bogfjellmo & Marthinsen (2016), Fig. 3: energy error, h = {h}, t in (0, {T:g})")
    system = vj.systems.DipoleOnStick()
    g0, w0 = system.initial()
    energy = jax.jit(jax.vmap(system.energy))
    mu3 = jax.jit(jax.vmap(system.vertical_momentum))
    say(f"  {'method':<16} {'max|dH|':>9} {'paper':>7} {'ratio':>6}  max|dH| per tenth of "
        f"the run ({T / 10:g} time units)   max|d mu3|   s")
    traces = []
    for label, integ, paper in FIG3:
        t0 = time.time()
        sol = vj.simulate(system, integ, q0=g0, v0=w0, dt=h, n_steps=n)
        de = np.asarray(energy(sol.q, sol.v))
        de = de - de[0]
        m3 = np.asarray(mu3(sol.q, sol.v))
        dm3 = float(np.max(np.abs(m3 - m3[0])))
        blocks = np.max(np.abs(de[1:]).reshape(10, -1), axis=1)
        top = float(np.max(np.abs(de)))
        say(f"  {label:<16} {top:9.2e} {paper:7.0e} {top / paper:6.2f}  "
            + " ".join(f"{b:.2e}" for b in blocks) + f"   {dm3:.1e}  {time.time() - t0:5.1f}")
        check(paper / ENERGY_FACTOR <= top <= paper * ENERGY_FACTOR,
              f"{label}: max|dH| = {top:.2e}, paper {paper:.0e}")
        check(blocks[-1] <= 2 * blocks[1], f"{label}: energy error drifts ({blocks})")
        check(dm3 < 1e-11, f"{label}: mu3 not conserved ({dm3:.1e})")
        traces.append((label, np.asarray(sol.t), de))
    if plt:
        fig, axes = plt.subplots(2, 2, figsize=(11, 6.5))
        for ax, (label, t, de) in zip(axes.T.ravel(), traces):
            ax.plot(t, de, lw=0.3, color="C0", rasterized=True)
            ax.set(title=f"{label}, h = {h}", xlabel="t", ylabel="H - H0")
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
            ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "fig3_dipole_energy.png", dpi=130)
        plt.close(fig)


# --------------------------------------------------------------------------------------------
# Martín de Diego & Sato Martín de Almagro (2022), Fig. 7: the unicycle
# --------------------------------------------------------------------------------------------

UNICYCLE_H = [0.1, 0.05, 0.025, 0.0125]
ROUNDOFF = 1e-12  # errors below this are round-off and left out of the fits


def fig7(out, plt):
    T = 2.0
    say(f"## Martín de Diego & Sato Martín de Almagro (2022), Fig. 7: unicycle, errors at "
        f"T = {T:g} (Lobatto IIIA-IIIB, Cayley)")
    system = vj.systems.Unicycle()
    g0, xi0 = system.initial()
    gT, xiT, lamT = system.exact(T, g0, xi0)
    muT = system.momentum(gT, xiT)
    names = ("g", "mu", "lambda")
    hs = np.array(UNICYCLE_H)
    results = {}
    say(f"  (fits leave out errors below {ROUNDOFF:.0e}: round-off)")
    say(f"  {'s':>2}  {'quantity':<7} {'order':>5} {'slope':>6}  errors at h = "
        + ", ".join(f"{h:g}" for h in UNICYCLE_H))
    for s in (2, 3, 4):
        integ = vj.GroupVPRK.lobatto(s, retraction=vj.lie.Cayley())
        errs = []
        for h in UNICYCLE_H:
            st = final_state(integ, system, g0, xi0, h, int(round(T / h)))
            errs.append([float(jnp.linalg.norm(st.q - gT)), float(jnp.linalg.norm(st.p - muT)),
                         float(jnp.linalg.norm(st.lam - lamT))])
        errs = np.array(errs)
        expected = (2 * s - 2, 2 * s - 2, s if s % 2 == 0 else s - 1)
        for k, name in enumerate(names):
            keep = errs[:, k] > ROUNDOFF
            p = slope(hs[keep], errs[keep, k])
            say(f"  {s:>2}  {name:<7} {expected[k]:>5} {p:6.2f}  "
                + " ".join(f"{e:.3e}" for e in errs[:, k]))
            check_slope(f"unicycle Lobatto-{s} {name}", p, expected[k])
            results.setdefault(name, []).append(
                (f"Lobatto-{s} (slope {p:.2f})", list(hs), list(errs[:, k]), list(hs[keep]),
                 expected[k]))
    if plt:
        fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
        for ax, name in zip(axes, names):
            loglog_panel(ax, f"error in {name} at T = {T:g}", results[name])
            ax.set_xticks(hs, [f"{h:g}" for h in hs])
        fig.tight_layout()
        fig.savefig(out / "fig7_unicycle_orders.png", dpi=130)
        plt.close(fig)


# --------------------------------------------------------------------------------------------
# Martín de Diego & Sato Martín de Almagro (2022), Fig. 8: the ball on a turntable
# --------------------------------------------------------------------------------------------


def fig8(out, plt):
    h, T, paper_emov = 0.1, 100.0, 2e-9
    n = int(round(T / h))
    say(f"## Martín de Diego & Sato Martín de Almagro (2022), Fig. 8: ball on a turntable, "
        f"Lobatto-3 (Cayley), h = {h}, t in (0, {T:g})")
    system = vj.systems.BallOnTurntable()
    g0, xi0 = system.initial()
    sol = vj.simulate(system, vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley()), q0=g0,
                      v0=xi0, dt=h, n_steps=n)
    ints = np.asarray(jax.vmap(system.integrals)(sol.q, sol.v))
    err = np.abs(ints - ints[0])
    names = ("I1", "I2", "I3", "E_mov")
    tenth = n // 10
    for k, name in enumerate(names):
        say(f"  {name:<6} max error {np.max(err[:, k]):.2e}   (first tenth "
            f"{np.max(err[:tenth + 1, k]):.2e}, last tenth {np.max(err[-tenth:, k]):.2e})")
    check(np.max(err[:, :3]) < 1e-10, f"turntable: I1..I3 errors {np.max(err[:, :3]):.1e}")
    top = float(np.max(err[:, 3]))
    check(paper_emov / ENERGY_FACTOR <= top <= paper_emov * ENERGY_FACTOR,
          f"turntable: max |dE_mov| = {top:.2e}, paper {paper_emov:.0e}")
    check(np.max(err[-tenth:, 3]) <= 2 * np.max(err[:tenth + 1, 3]) + 1e-12,
          "turntable: E_mov drifts")
    phi = float(np.max(np.abs(jax.vmap(system.nonholonomic)(sol.q, sol.v))))
    say(f"  constraint max |phi| {phi:.1e}   (paper's prototype: E_mov to about "
        f"{paper_emov:.0e})")
    if plt:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        t = np.asarray(sol.t)
        for k, name in enumerate(names):
            ax.semilogy(t[1:], np.maximum(err[1:, k], 1e-17), lw=0.7, label=name)
        ax.set(title=f"ball on a turntable: |I(t) - I(0)|, Lobatto-3, h = {h}", xlabel="t",
               ylabel="error")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, ncol=4)
        fig.tight_layout()
        fig.savefig(out / "fig8_turntable_integrals.png", dpi=130)
        plt.close(fig)


# --------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Fig. 3 to T = 100 (smoke test)")
    parser.add_argument("--out", default="out/lie_groups", help="output folder")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    if plt is None:
        print("matplotlib not installed: skipping figures (pip install 'vijax[bench]')")
    start = time.time()
    for name, run in (("fig2", lambda: fig2(out, plt)),
                      ("fig3", lambda: fig3(out, plt, 100.0 if args.quick else 1000.0)),
                      ("fig7", lambda: fig7(out, plt)), ("fig8", lambda: fig8(out, plt))):
        t0 = time.time()
        run()
        say(f"  ({name}: {time.time() - t0:.0f} s)")
        say()
    say(f"Total {time.time() - start:.0f} s; {len(FAILURES)} failed checks.")
    (out / "summary.txt").write_text("\n".join(LINES) + "\n")
    print(f"wrote {out}/summary.txt" + (" and the figures" if plt else ""))
    assert not FAILURES, "failed checks:\n" + "\n".join(FAILURES)


if __name__ == "__main__":
    main()
