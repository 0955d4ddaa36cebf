"""Energy behaviour of the nonholonomic Lobatto IIIA-IIIB methods on the pendulum-driven CVT of
Martín de Diego & Sato Martín de Almagro (2022), §7.2 (`vj.systems.PendulumDrivenCVT`, after
Modin & Verdier (2014)), and the random walk of the energy on the chaotic system of their §7.3.

Independent sources: the closed-form multiplier and accelerations of the CVT (worked by hand
from ``L`` and ``Φ``) against :mod:`vijax.constraints` (autodiff); the initial energies of the
paper's two regimes; a table measured by an independent prototype of the experiment
(``s = 2``, ``T = 1000``, max |ΔE_d| / |ΔE_p| / |ΔE_T|); the h^2 (Lobatto-2) and h^4
(Lobatto-3) scaling of the errors.

Measured here (``T = 1000``; the prototype's values in brackets):

=====  ===  ======  =============================  ==================================
regime  ε   h       this file                      prototype
=====  ===  ======  =============================  ==================================
low    1/2  0.1     4.27e-3 / 1.26e-2 / 1.32e-2    4.3e-3 / 1.3e-2 / 1.3e-2
low    1/2  π/10    4.31e-2 / 0.528 / 0.499        4.3e-2 / 0.53 / 0.50
high   1/2  0.1     1.26e-2 / 2.46e-2 / 2.58e-2    1.3e-2 / 2.5e-2 / 2.6e-2
high   1/2  π/10    0.128 / 0.487 / 0.495          0.13 / 0.49 / 0.50
low    0    0.1     3.64e-3 / 7.15e-3 / 7.15e-3    3.6e-3 / 7.2e-3 / 7.1e-3
high   0    0.1     1.00e-2 / 2.47e-2 / 2.47e-2    1.0e-2 / 2.5e-2 / 2.5e-2
=====  ===  ======  =============================  ==================================

|Φ| ≤ 3e-16 at every node.  Lobatto-3, low, ε = 1/2: max |ΔE_T| = 1.44e-5 (h = 0.1) and
8.97e-7 (h = 0.05), ratio 16.05 (h^4: 16).  In the high regime with ε = 1/2 Lobatto-3 drifts:
``E_T`` falls linearly, 3.2e-7 per unit time at h = 0.1 (4.2e-4 at t = 1000, 8.6e-4 at
t = 2000), 5.9e-6 at h = 0.2; with ε = 0 (or in the low regime) it does not.  A rotating
pendulum's orbit is not mapped onto itself by the reversing symmetry ``v -> -v``; with ε = 0
the reflection ``(x, y) -> (-x, -y)`` composed with it is a reversing symmetry that does, and
ε ≠ 0 breaks it, so a symmetric but not symplectic method need not keep the energy bounded.

The random walk of the energy (§7.3): see :func:`test_chaotic_energy_error_is_a_random_walk`.

Runtime on the shared 2-core machine (load 3-4.5): 46 s with a warm compilation cache, 72 s
cold; the ensemble of the random-walk test takes 25-28 s of it.  The ensemble runs the optimised program: with XLA's optimisations off
(``fast_compile``) it is three times slower, so only the compile-bound tests carry that mark.
"""

from __future__ import annotations

import importlib.util
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj

CVT = vj.systems.PendulumDrivenCVT
T = 1000.0
# The independent prototype (Lobatto-2, T = 1000): max |ΔE_d|, |ΔE_p|, |ΔE_T|.
PROTOTYPE = {
    ("low", 0.5, 0.1): (4.3e-3, 1.3e-2, 1.3e-2),
    ("low", 0.5, np.pi / 10): (4.3e-2, 0.53, 0.50),
    ("high", 0.5, 0.1): (1.3e-2, 2.5e-2, 2.6e-2),
    ("high", 0.5, np.pi / 10): (0.13, 0.49, 0.50),
    ("low", 0.0, 0.1): (3.6e-3, 7.2e-3, 7.1e-3),
    ("high", 0.0, 0.1): (1.0e-2, 2.5e-2, 2.5e-2),
}


# --------------------------------------------------------------------------------------------
# Helpers: every case of one method in one compiled, vmapped loop
# --------------------------------------------------------------------------------------------
@eqx.filter_jit
def _runs(integ, eps, q0, v0, h, n, n_max: int):
    """Nodes ``(q, v)`` of ``n`` steps of size ``h`` for each row (rows past ``n`` repeat the
    last node) and whether every solve converged."""
    def one(eps, q0, v0, h, n):
        system = CVT(eps=eps)
        state = integ.init(system, jnp.zeros((), q0.dtype), q0, v0)

        def body(st, i):
            new, stats = integ.step(system, st, h)
            live = i < n
            new = jax.tree_util.tree_map(lambda a, b: jnp.where(live, a, b), new, st)
            return new, (new.q, new.v, stats.converged | ~live)

        _, (q, v, ok) = jax.lax.scan(body, state, jnp.arange(n_max))
        return (jnp.concatenate([q0[None, :], q]), jnp.concatenate([v0[None, :], v]),
                jnp.all(ok))

    return jax.vmap(one)(eps, q0, v0, h, n)


def run_cases(integ, cases, t_final=T):
    """``{(regime, ε, h): metrics}`` of ``integ`` on the CVT to ``t_final``."""
    ns = [int(round(t_final / h)) for _, _, h in cases]
    starts = [CVT.initial(regime) for regime, _, _ in cases]
    q, v, ok = _runs(integ, jnp.asarray([e for _, e, _ in cases]),
                     jnp.stack([s[0] for s in starts]), jnp.stack([s[1] for s in starts]),
                     jnp.asarray([h for _, _, h in cases]), jnp.asarray(ns), max(ns))
    assert bool(jnp.all(ok)), [c for c, o in zip(cases, np.asarray(ok)) if not o]
    out = {}
    for j, (case, n) in enumerate(zip(cases, ns)):
        system = CVT(eps=case[1])
        qj, vj_ = q[j, :n + 1], v[j, :n + 1]
        out[case] = metrics(np.arange(n + 1) * case[2], np.asarray(system.driver_energy(qj, vj_)),
                            np.asarray(system.passenger_energy(qj, vj_)),
                            np.asarray(jax.vmap(system.nonholonomic)(qj, vj_)),
                            np.asarray(qj), np.asarray(vj_))
    return out


def metrics(t, e_d, e_p, phi, q, v):
    """Energy errors, drift and ``max |Φ|`` over the run; ``phi_bound``, the round-off level
    of ``Φ`` at a node: ``1e-13``, or where the pendulum angle has run away, ``2 ε |q| |v|``.
    The stage configurations ``Q^i = q_k + h Σ_j a_ij V^j`` are rounded to ``ε |q|``, so the
    stage equations change in steps of that size as the ``V^j`` vary; an iteration whose
    stopping test reads its increments stalls there, leaving ``Φ`` at about ``ε |q|`` times
    ``|∂Φ/∂q| <= |v|`` (Newton's last, quadratic update may land below it).  (Measured: the
    rotating runs reach ``|q| = 2.4e3``; ``max |Φ|`` 1.1e-13 with the default fixed point,
    1.2e-14 with Newton, against a bound of 3e-12.)"""
    de_t = (e_d + e_p) - (e_d[0] + e_p[0])
    tenth = len(t) // 10
    return dict(Ed=np.max(np.abs(e_d - e_d[0])), Ep=np.max(np.abs(e_p - e_p[0])),
                ET=np.max(np.abs(de_t)),
                # least-squares slope of ΔE_T(t) times the length of the run
                drift=abs(np.polyfit(t, de_t, 1)[0]) * t[-1],
                first=np.max(np.abs(de_t[:tenth])), last=np.max(np.abs(de_t[-tenth:])),
                phi=np.max(np.abs(phi)),
                phi_bound=max(1e-13, 2.0 * np.finfo(float).eps * np.max(np.abs(q))
                              * np.max(np.abs(v))))


def print_table(title, results, prototype=True):
    print(f"\n{title}: max |ΔE_d| / |ΔE_p| / |ΔE_T|, |slope| T, max |Φ|  (prototype)")
    for (regime, eps, h), m in results.items():
        ref = PROTOTYPE.get((regime, eps, h)) if prototype else None
        ref = "" if ref is None else "(" + " / ".join(f"{x:.2g}" for x in ref) + ")"
        print(f"  {regime:<4} ε={eps:<3} h={h:.4f}: {m['Ed']:.3g} / {m['Ep']:.3g} / "
              f"{m['ET']:.3g}, {m['drift']:.2e}, {m['phi']:.1e}  {ref}")


@pytest.fixture(scope="module")
def lobatto2():
    results = run_cases(vj.NonholonomicVPRK.lobatto(2), list(PROTOTYPE))
    print_table("Lobatto-2", results)
    return results


@pytest.fixture(scope="module")
def lobatto3():
    cases = [("low", 0.5, 0.1), ("low", 0.5, 0.05), ("high", 0.5, 0.1), ("high", 0.0, 0.1)]
    results = run_cases(vj.NonholonomicVPRK.lobatto(3), cases)
    print_table("Lobatto-3", results, prototype=False)
    return results


# --------------------------------------------------------------------------------------------
# The system against the closed form
# --------------------------------------------------------------------------------------------
@pytest.mark.fast_compile
@pytest.mark.parametrize("eps", [0.5, 0.0, 0.3])
def test_closed_form_dynamics_match_autodiff(eps):
    """λ = (z + x sin y - v_x v_y cos y)/(1 + sin² y), ẍ = -x + λ sin y,
    ÿ = -sin y - ε cos 2y, z̈ = -z + λ (worked by hand) against
    vj.constraints.nonholonomic_acceleration / nonholonomic_multiplier at random states; the
    frame spans ker A(q) orthonormally and E_d + E_p is the energy."""
    system = CVT(eps=eps)
    rng = np.random.default_rng(3)
    for _ in range(4):
        q, v = (jnp.asarray(2.0 * rng.standard_normal(3)) for _ in range(2))
        x, y, z = np.asarray(q)
        vx, vy, _ = np.asarray(v)
        lam = (z + x * np.sin(y) - vx * vy * np.cos(y)) / (1.0 + np.sin(y) ** 2)
        acc = [-x + lam * np.sin(y), -np.sin(y) - eps * np.cos(2.0 * y), -z + lam]
        a, lam_ad = vj.constraints.nonholonomic_acceleration(system, q, v)
        np.testing.assert_allclose(lam_ad, [lam], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(vj.constraints.nonholonomic_multiplier(system, q, v), [lam],
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a, acc, rtol=1e-12, atol=1e-12)
        X = system.distribution_frame(q)
        A = jax.jacobian(system.nonholonomic, argnums=1)(q, v)
        np.testing.assert_allclose(A @ X, np.zeros((1, 2)), atol=1e-15)
        np.testing.assert_allclose(X.T @ X, np.eye(2), atol=1e-15)
        np.testing.assert_allclose(system.driver_energy(q, v) + system.passenger_energy(q, v),
                                   system.energy(q, v), rtol=1e-14)


@pytest.mark.fast_compile
def test_initial_data_of_the_two_regimes():
    """q0 = (1, 0, 1); low: E_d = 4/5, E_p = 1, E_T = 9/5; high: E_d = 3, E_p = 1, E_T = 4;
    λ0 = 1 and Φ = 0 in both, for ε = 1/2 and ε = 0; energies vectorised over rows."""
    for eps in (0.5, 0.0):
        system = CVT(eps=eps)
        for regime, (e_d, e_p) in (("low", (0.8, 1.0)), ("high", (3.0, 1.0))):
            q0, v0 = CVT.initial(regime)
            np.testing.assert_array_equal(q0, [1.0, 0.0, 1.0])
            np.testing.assert_allclose(system.driver_energy(q0, v0), e_d, rtol=1e-15)
            np.testing.assert_allclose(system.passenger_energy(q0, v0), e_p, rtol=1e-15)
            np.testing.assert_allclose(system.energy(q0, v0), e_d + e_p, rtol=1e-15)
            np.testing.assert_allclose(vj.constraints.nonholonomic_multiplier(system, q0, v0),
                                       [1.0], rtol=1e-14)
            assert float(jnp.abs(system.nonholonomic(q0, v0)[0])) == 0.0
            rows = system.driver_energy(jnp.stack([q0, q0]), jnp.stack([v0, v0]))
            np.testing.assert_allclose(rows, [e_d, e_d], rtol=1e-15)
    with pytest.raises(ValueError, match="'low'.*'high'"):
        CVT.initial("medium")


# --------------------------------------------------------------------------------------------
# Lobatto-2 (§7.2): the paper's experiment
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [c for c in PROTOTYPE if c[2] == 0.1])
def test_lobatto2_energy_errors_match_the_prototype(lobatto2, case):
    """h = 0.1: max |ΔE_d|, |ΔE_p|, |ΔE_T| within 10 % of the prototype's (two digits)."""
    m = lobatto2[case]
    got = np.array([m["Ed"], m["Ep"], m["ET"]])
    np.testing.assert_allclose(got, PROTOTYPE[case], rtol=0.1)


@pytest.mark.parametrize("case", list(PROTOTYPE))
def test_lobatto2_no_drift_and_constraint_at_every_node(lobatto2, case):
    """The least-squares slope of ΔE_T(t) over the run, times T, is below a tenth of the max
    error (a drift of that size would be the max error itself); the max over the last tenth
    of the run is within 1.5x that over the first; |Φ| at round-off at every node."""
    m = lobatto2[case]
    assert m["drift"] <= 0.1 * m["ET"], m
    assert m["last"] <= 1.5 * m["first"], m
    assert m["phi"] <= m["phi_bound"], m


@pytest.mark.parametrize("regime", ["low", "high"])
def test_lobatto2_large_step_is_erratic(lobatto2, regime):
    """h = π/10 (ε = 1/2), the paper's "rather erratic" case: max |ΔE_T| about 0.5 (in
    [0.25, 1], within 20 % of the prototype), at least 10x the h = 0.1 error; the driver
    alone (an autonomous pendulum under a symplectic method) still follows the h^2 law, its
    error ratio is π² within 15 %, while the passenger's is far above it."""
    small, large = lobatto2[(regime, 0.5, 0.1)], lobatto2[(regime, 0.5, np.pi / 10)]
    assert 0.25 <= large["ET"] <= 1.0, large
    np.testing.assert_allclose([large["Ed"], large["Ep"], large["ET"]],
                               PROTOTYPE[(regime, 0.5, np.pi / 10)], rtol=0.2)
    assert large["ET"] >= 10.0 * small["ET"]
    assert abs(large["Ed"] / small["Ed"] / np.pi ** 2 - 1.0) <= 0.15, (large, small)
    assert large["Ep"] / small["Ep"] >= 1.5 * np.pi ** 2, (large, small)


# --------------------------------------------------------------------------------------------
# Lobatto-3
# --------------------------------------------------------------------------------------------
def test_lobatto3_bounded_and_fourth_order(lobatto2, lobatto3):
    """Low regime, ε = 1/2: max |ΔE_T| = 1.44e-5 measured at h = 0.1 (bound 3e-5), a
    thousandth of Lobatto-2's; h = 0.1 against h = 0.05 gives 16 (h^4) within a factor 1.5;
    no drift; |Φ| at round-off (``phi_bound``) at every node."""
    coarse, fine = lobatto3[("low", 0.5, 0.1)], lobatto3[("low", 0.5, 0.05)]
    assert coarse["ET"] <= 3e-5 and coarse["ET"] <= 1e-2 * lobatto2[("low", 0.5, 0.1)]["ET"]
    ratio = coarse["ET"] / fine["ET"]
    assert 16.0 / 1.5 <= ratio <= 16.0 * 1.5, ratio
    assert 16.0 / 1.5 <= coarse["Ep"] / fine["Ep"] <= 16.0 * 1.5
    for m in (coarse, fine, lobatto3[("high", 0.0, 0.1)]):
        assert m["drift"] <= 0.1 * m["ET"] and m["last"] <= 1.5 * m["first"], m
        assert m["phi"] <= m["phi_bound"], m


def test_lobatto3_drifts_when_the_asymmetric_pendulum_rotates(lobatto3):
    """High regime, h = 0.1: with ε = 1/2 ΔE_T(t) is a linear drift (|slope| T >= 0.5 max,
    the last tenth of the run at least 5x the first; measured 4.2e-4 at t = 1000), still 50x
    below Lobatto-2's bounded error; with ε = 0 no drift (checked above)."""
    m = lobatto3[("high", 0.5, 0.1)]
    assert m["drift"] >= 0.5 * m["ET"] and m["last"] >= 5.0 * m["first"], m
    assert m["ET"] <= 1e-3, m
    assert m["phi"] <= m["phi_bound"], m


# --------------------------------------------------------------------------------------------
# §7.3: the random walk of the energy on the chaotic system
# --------------------------------------------------------------------------------------------
def test_chaotic_energy_error_is_a_random_walk():
    """256 members on the energy sheet E0 = 3.06 of the chaotic system (m = 3),
    Lobatto-2, h = 0.1 (as examples/chaotic_energy_variance.py), to t = 300.

    The raw μ(E, k) (vj.diagnostics.energy_variance) is dominated up to t ~ 10³ by the
    bounded O(h²) oscillation of the energy error (μ ≈ 1.2e-5 from t ≈ 1 on; the walk adds
    D t, D ≈ 1e-8): its log-log slope over [T/2, T] is small (measured 0.09 here;
    0.12-0.18 for three ensembles to T = 400; 0.83 only over t in [5000, 10000], 128
    members); asserted in [-0.3, 0.6], which a drift (slope 2) would fail.
    The walk shows in the structure function of the energy error averaged over windows of
    w = 10 time units (the energy is saved at t = 1, 2, ...): S(L) = mean over members and
    windows k of (Ē_{k+L} - Ē_k)².  Its rise S(L) - S(w) grows like L - w for a random walk
    (slope 1), like L² for a drift (slope 2) and not at all for bounded errors (log of
    noise).  Measured slope over L in [T/10, T/2]: 0.92, 0.83, 0.85 (three ensembles;
    0.79-0.93 for their halves); asserted in [0.6, 1.4]."""
    system = vj.systems.ChaoticNonholonomic()
    h, t_final, w = 0.1, 300.0, 10
    q0, v0 = system.sample_energy_sheet(jax.random.PRNGKey(0), 256, energy=3.06)
    n = int(round(t_final / h))
    ens = vj.simulate_ensemble(system, vj.NonholonomicVPRK.lobatto(2), q0=q0, v0=v0, dt=h,
                               n_steps=n, save_every=int(round(1.0 / h)))
    mu = np.asarray(vj.diagnostics.energy_variance(system, ens, reference=3.06))
    t = np.asarray(ens.t[0])
    energy = np.asarray(jax.vmap(jax.vmap(system.energy))(ens.q, ens.v))
    assert mu[0] < 1e-24 and np.all(np.isfinite(mu))
    late = t >= t_final / 2
    raw = np.polyfit(np.log(t[late]), np.log(mu[late]), 1)[0]

    err = energy[:, 1:] - 3.06                                  # t = 1, 2, ..., T
    bars = err.reshape(err.shape[0], -1, w).mean(axis=-1)     # window means Ē_k
    lags = np.arange(1, bars.shape[1]) * w
    S = np.array([np.mean((bars[:, k:] - bars[:, :-k]) ** 2) for k in range(1, bars.shape[1])])
    use = (lags >= t_final / 10) & (lags <= t_final / 2)
    rise = S[use] - S[0]
    print(f"\nraw μ slope {raw:.3f}; S(L) - S(w): {rise}")
    assert np.all(rise > 0), rise                 # bounded errors: no rise above S(w)
    slope = np.polyfit(np.log(lags[use] - w), np.log(rise), 1)[0]
    print(f"random-walk slope {slope:.3f}")
    assert 0.6 <= slope <= 1.4, slope
    assert -0.3 <= raw <= 0.6, raw


# --------------------------------------------------------------------------------------------
# The example
# --------------------------------------------------------------------------------------------
@pytest.mark.fast_compile
def test_cvt_long_run_example_quick(tmp_path):
    """examples/cvt_long_run.py --quick (the gearbox to t = 100): the discrete gradients
    keep the energy, the VPRK and SI-DLA methods the constraint, GONZALEZ-F leaves it."""
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "cvt_long_run.py"
    spec = importlib.util.spec_from_file_location("cvt_long_run", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with jax.numpy_rank_promotion("allow"):   # the example is user code, written loosely
        result = example.main(["--quick", "--out", str(tmp_path)])
    assert (tmp_path / "cvt_long_run_gearbox.png").exists()
    runs = result["results"]["gearbox"]
    assert set(runs) == set(example.METHODS)
    assert all(r["first_failure"] < 0 for r in runs.values())
    for name in ("AVF-R", "GONZALEZ-R", "GONZALEZ-F"):
        assert runs[name]["max_de"] <= 1e-11, (name, runs[name]["max_de"])
    for name in ("Lobatto-2", "Lobatto-3", "AVF-R", "GONZALEZ-R", "SI-DLA"):
        assert runs[name]["max_phi"] <= 1e-13, (name, runs[name]["max_phi"])
    assert runs["GONZALEZ-F"]["max_phi"] >= 1e-4
    assert 1e-4 <= runs["SI-DLA"]["max_de"] and 1e-4 <= runs["Lobatto-2"]["max_de"] <= 1e-1
    assert runs["Lobatto-3"]["max_de"] <= 1e-2 * runs["Lobatto-2"]["max_de"]
