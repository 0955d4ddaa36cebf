"""Numerical verification of the VPRK integrators (Martín de Diego & Sato Martín de Almagro
(2022), §4.2, Thm 4.2, eq. (9)).

What is proved here, in float64, for every preset (implicit midpoint, Störmer–Verlet,
Gauss s = 1..4, Lobatto IIIA–IIIB s = 2..5):

* **Convergence order** in both ``q`` and ``p`` on two nonlinear problems -- the pendulum at
  large amplitude and the Kepler problem with eccentricity 0.5 -- within ±0.3 of theory
  (``2s`` for Gauss, ``2s - 2`` for Lobatto IIIA–IIIB, 2 for midpoint / Störmer–Verlet).
  The references are *exact* solutions (Jacobi elliptic functions for the pendulum, Kepler's
  equation for the orbit), checked here against scipy's DOP853; a DOP853 reference alone is
  only good to a few 1e-12 on Kepler, which would hide the order-8 convergence.
* **Symplecticity**: ``max |J^T Ω J - Ω|`` of the one-step map ≤ 1e-12 at random states, on
  Kepler and on the double pendulum (non-constant mass matrix).
* **Energy**: over 10⁵ steps the energy error is bounded and its fitted drift is
  statistically zero; the same criterion flags the drift of a non-symplectic RK4 and a
  synthetic linear trend added to a VPRK signal (negative controls).
* **Time reversibility** (all presets are symmetric): ``n`` steps with ``h`` then ``n``
  steps with ``-h`` return to the start to round-off (double pendulum); RK4 does not.
* **Consistency** with independent hand-written methods: Gauss(1) is the implicit midpoint
  rule; Lobatto IIIA–IIIB(2) is the explicit Störmer–Verlet (velocity Verlet) scheme when the
  mass matrix is constant.

The claims are about the presets as users get them, default stage solver included, and at
the 1e-12 level they need the stage equations solved essentially to round-off (as recommended
for long-time symplectic integration, Hairer–Lubich–Wanner, GNI §VIII.6): a stage-solver
stopping test that leaves errors of order its tolerance (eps**0.8 ~ 3e-13) per step shows up
here as energy drift, lost reversibility and contaminated order-8 fits.

The whole file needs about 100 s of CPU, i.e. about a minute on 2 idle cores
(``pytest -n 2``); it is dominated by compilation.  Every step loop is one compiled
``lax.fori_loop`` with a *dynamic* trip count, so each (system, method) pair compiles once
whatever the number of steps (``vijax.diagnostics.convergence_study`` recompiles for every step
count, which would multiply the cost of the order tests).
"""

from __future__ import annotations

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import ellipj, ellipk

import vijax as vj
from vijax.solvers import SolverStats

# --------------------------------------------------------------------------------------------
# Presets and their theoretical orders (written out, not read from the integrators' traits).
# --------------------------------------------------------------------------------------------

PRESETS = {
    "midpoint": (vj.VPRK.midpoint, 2),
    "stormer_verlet": (vj.VPRK.stormer_verlet, 2),
    "gauss1": (lambda: vj.VPRK.gauss(1), 2),
    "gauss2": (lambda: vj.VPRK.gauss(2), 4),
    "gauss3": (lambda: vj.VPRK.gauss(3), 6),
    "gauss4": (lambda: vj.VPRK.gauss(4), 8),
    "lobatto2": (lambda: vj.VPRK.lobatto(2), 2),
    "lobatto3": (lambda: vj.VPRK.lobatto(3), 4),
    "lobatto4": (lambda: vj.VPRK.lobatto(4), 6),
    "lobatto5": (lambda: vj.VPRK.lobatto(5), 8),
}
PRESET_NAMES = list(PRESETS)


def make(name):
    return PRESETS[name][0]()


def expected_order(name) -> int:
    return PRESETS[name][1]


# --------------------------------------------------------------------------------------------
# Exact solutions (independent references).
# --------------------------------------------------------------------------------------------


def pendulum_exact(system, theta0: float, t: float):
    """``(q, p)`` at time ``t`` of the pendulum released at rest from angle ``theta0``.

    ``theta(t) = 2 arcsin(k sn(K(m) - w t | m))`` with ``k = sin(theta0 / 2)``, ``m = k^2``,
    ``w = sqrt(g / l)``; then ``theta' = -2 k w cn(.)`` and ``p = m l^2 theta'``.
    """
    k = np.sin(theta0 / 2.0)
    w = np.sqrt(system.g / system.l)
    sn, cn, _, _ = ellipj(ellipk(k * k) - w * t, k * k)
    theta = 2.0 * np.arcsin(k * sn)
    return np.array([theta]), np.array([system.m * system.l**2 * (-2.0 * k * w * cn)])


def kepler_exact(system, e: float, t: float):
    """``(q, p)`` at time ``t`` on the orbit of :meth:`Kepler.initial_conditions` (``a = 1``,
    ``mu = 1``, pericentre on the +x axis at ``t = 0``, period ``2 pi``), by Newton on
    Kepler's equation ``E - e sin E = t``."""
    assert system.mu == 1.0, "the closed form below assumes mu = 1 (period 2 pi)"
    mean_anomaly = t % (2.0 * np.pi)
    ecc = mean_anomaly
    for _ in range(60):
        ecc -= (ecc - e * np.sin(ecc) - mean_anomaly) / (1.0 - e * np.cos(ecc))
    rate = 1.0 / (1.0 - e * np.cos(ecc))  # dE/dt
    q = np.array([np.cos(ecc) - e, np.sqrt(1.0 - e * e) * np.sin(ecc)])
    v = np.array([-np.sin(ecc) * rate, np.sqrt(1.0 - e * e) * np.cos(ecc) * rate])
    return q, system.m * v


class Problem(NamedTuple):
    system: object
    q0: jax.Array
    v0: jax.Array
    t_final: float
    q_ref: np.ndarray
    p_ref: np.ndarray


PENDULUM_THETA0 = 1.5   # 86 degrees: strongly nonlinear
PENDULUM_T = 4.0        # about 1.7 periods
KEPLER_E = 0.5
KEPLER_T = 2.0 * np.pi  # one full orbit, pericentre to pericentre


@pytest.fixture(scope="module")
def problems() -> dict[str, Problem]:
    """The two nonlinear test problems with their exact solutions at ``t_final``, computed
    once per module (per xdist worker)."""
    pend = vj.systems.Pendulum()
    kep = vj.systems.Kepler()
    qk, vk = kep.initial_conditions(KEPLER_E)
    return {
        "pendulum": Problem(pend, jnp.array([PENDULUM_THETA0]), jnp.array([0.0]), PENDULUM_T,
                            *pendulum_exact(pend, PENDULUM_THETA0, PENDULUM_T)),
        "kepler": Problem(kep, qk, vk, KEPLER_T, *kepler_exact(kep, KEPLER_E, KEPLER_T)),
    }


# --------------------------------------------------------------------------------------------
# Drivers.
# --------------------------------------------------------------------------------------------


_advance = vj.diagnostics.advance


@eqx.filter_jit
def _round_trip(system, integrator, q0, v0, h, n):
    """``n`` steps with ``h`` followed by ``n`` steps with ``-h`` (one loop, one compilation).
    Returns the start and end states, whether every stage solve converged, and the largest
    excursion ``max |q - q0|`` on the way."""

    def body(i, carry):
        state, ok, far = carry
        state, stats = integrator.step(system, state, jnp.where(i < n, h, -h))
        return state, ok & stats.converged, jnp.maximum(far, jnp.max(jnp.abs(state.q - q0)))

    start = integrator.init(system, jnp.zeros((), q0.dtype), q0, v0)
    end, ok, far = jax.lax.fori_loop(0, 2 * n, body,
                                     (start, jnp.asarray(True), jnp.zeros((), q0.dtype)))
    return start, end, ok, far


def global_errors(problem: Problem, integrator, n_steps_list):
    """Max-norm global errors in ``q`` and ``p`` at ``t_final`` for each step count."""
    hs, err_q, err_p = [], [], []
    for n in n_steps_list:
        h = problem.t_final / n
        state, ok = _advance(problem.system, integrator, problem.q0, problem.v0,
                             jnp.asarray(h), jnp.asarray(n))
        assert bool(ok), f"{integrator.name}: a stage solve did not converge (n = {n})"
        hs.append(h)
        err_q.append(np.max(np.abs(np.asarray(state.q) - problem.q_ref)))
        err_p.append(np.max(np.abs(np.asarray(state.p) - problem.p_ref)))
    return np.array(hs), np.array(err_q), np.array(err_p)


# --------------------------------------------------------------------------------------------
# A non-symplectic, non-symmetric contrast method: classical RK4 on Hamilton's equations.
# --------------------------------------------------------------------------------------------


class RK4State(vj.AbstractState):
    t: jax.Array
    q: jax.Array
    p: jax.Array


class RK4(vj.AbstractIntegrator):
    """Explicit classical Runge--Kutta 4 in ``(q, p)`` (negative control only)."""

    @property
    def order(self) -> int:
        return 4

    @property
    def stages(self) -> int:
        return 4

    def init(self, system, t0, q0, v0):
        return RK4State(t=jnp.asarray(t0, q0.dtype), q=q0, p=system.momentum(q0, v0))

    def force_nodes(self):
        return np.array([0.0, 0.5, 0.5, 1.0])  # (takes no vijax.ForcedSystem)

    def step(self, system, state, h, u=None):
        def f(z):
            q, p = jnp.split(z, 2)
            dh_dq, dh_dp = jax.grad(system.hamiltonian, argnums=(0, 1))(q, p)
            return jnp.concatenate([dh_dp, -dh_dq])

        z = jnp.concatenate([state.q, state.p])
        k1 = f(z)
        k2 = f(z + 0.5 * h * k1)
        k3 = f(z + 0.5 * h * k2)
        k4 = f(z + h * k3)
        q, p = jnp.split(z + h / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4), 2)
        stats = SolverStats(iterations=jnp.asarray(0, jnp.int32),
                            residual=jnp.zeros((), z.dtype), converged=jnp.asarray(True))
        return RK4State(t=state.t + h, q=q, p=p), stats

    def velocity(self, system, state):
        return system.velocity(state.q, state.p)


# ============================================================================================
# 1. Convergence orders
# ============================================================================================

# Step counts per (problem, order).  Chosen so that every error lies in the asymptotic regime
# (local slopes within ~0.1 of the theoretical order over the whole list) and well above the
# round-off floor (~2e-13, :func:`vijax.diagnostics.estimate_order`): errors between about
# 1e-3 and 5e-13.  For order 8 the usable window is narrow, hence ratios of 1.25 between
# successive step counts instead of 2.
STEP_COUNTS = {
    ("pendulum", 2): [400, 800, 1600, 3200],
    ("pendulum", 4): [50, 100, 200, 400, 800],
    ("pendulum", 6): [30, 45, 68, 101, 152],
    ("pendulum", 8): [32, 40, 50, 63, 79],
    ("kepler", 2): [4000, 8000, 16000, 32000],
    ("kepler", 4): [200, 400, 800, 1600, 3200],
    ("kepler", 6): [60, 90, 135, 203, 304],
    ("kepler", 8): [75, 94, 117, 146, 183],
}
ORDER_TOL = 0.3


def test_exact_references_agree_with_dop853(problems):
    """The closed-form references agree with an independent high-accuracy integration (and so
    validate each other): scipy DOP853 at rtol 3e-14 on the Euler--Lagrange equations, at the
    final times used below and, for Kepler, also at a generic time mid-orbit (at T = 2 pi the
    exact state is the initial one)."""
    cases = [(pb, pb.t_final, (pb.q_ref, pb.p_ref)) for pb in problems.values()]
    kep = problems["kepler"]
    cases.append((kep, 2.0, kepler_exact(kep.system, KEPLER_E, 2.0)))
    for pb, t, (q_exact, p_exact) in cases:
        q, _, p = vj.diagnostics.reference_solution(pb.system, pb.q0, pb.v0, t,
                                                    rtol=3e-14, atol=1e-16)
        assert np.max(np.abs(q - q_exact)) < 1e-11, (type(pb.system).__name__, t)
        assert np.max(np.abs(p - p_exact)) < 1e-11, (type(pb.system).__name__, t)
    # and they start where the problems start
    for pb, (q_exact, p_exact) in [
        (problems["pendulum"], pendulum_exact(problems["pendulum"].system, PENDULUM_THETA0, 0.0)),
        (kep, kepler_exact(kep.system, KEPLER_E, 0.0)),
    ]:
        np.testing.assert_allclose(q_exact, np.asarray(pb.q0), rtol=0, atol=1e-15)
        np.testing.assert_allclose(p_exact, np.asarray(pb.system.momentum(pb.q0, pb.v0)),
                                   rtol=0, atol=1e-15)


@pytest.mark.parametrize("problem", ["pendulum", "kepler"])
@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_convergence_order(problems, preset, problem):
    integrator = make(preset)
    order = expected_order(preset)
    assert integrator.order == order, "the integrator's declared order disagrees with theory"
    pb = problems[problem]
    ns = STEP_COUNTS[(problem, order)]
    hs, err_q, err_p = global_errors(pb, integrator, ns)
    report = "\n".join(f"  n={n:6d} h={h:.3e} err_q={eq:.3e} err_p={ep:.3e}"
                       for n, h, eq, ep in zip(ns, hs, err_q, err_p))
    # asymptotic regime: no error is large
    assert max(err_q.max(), err_p.max()) < 1e-3, report
    for label, errs in (("q", err_q), ("p", err_p)):
        est = vj.diagnostics.estimate_order(hs, errs)
        assert est.used.sum() >= 3, f"only {est.used.sum()} points in the {label} fit\n{report}"
        assert abs(est.order - order) <= ORDER_TOL, (
            f"{integrator.name} on {problem}: measured order in {label} {est.order:.3f}, "
            f"expected {order}\n{report}")


def test_convergence_study_matches_independent_driver(problems):
    """:func:`vijax.diagnostics.convergence_study` (the library's own driver) reproduces the
    errors and orders measured here."""
    pb = problems["pendulum"]
    integrator = vj.VPRK.gauss(2)
    ns = [50, 100, 200]
    study = vj.diagnostics.convergence_study(pb.system, integrator, pb.q0, pb.v0, pb.t_final,
                                             ns, reference=(pb.q_ref, None, pb.p_ref))
    hs, err_q, err_p = global_errors(pb, integrator, ns)
    np.testing.assert_allclose(study.hs, hs, rtol=1e-15)
    np.testing.assert_allclose(study.err_q, err_q, rtol=1e-6)
    np.testing.assert_allclose(study.err_p, err_p, rtol=1e-6)
    assert abs(study.order_q - 4) <= ORDER_TOL and abs(study.order_p - 4) <= ORDER_TOL


# ============================================================================================
# 2. Symplecticity
# ============================================================================================

N_RANDOM_STATES = 4


def _random_states(system_name: str, seed: int = 20240611):
    rng = np.random.default_rng(seed)
    if system_name == "kepler":
        r = rng.uniform(0.6, 1.5, N_RANDOM_STATES)
        phi = rng.uniform(0.0, 2.0 * np.pi, N_RANDOM_STATES)
        q = np.stack([r * np.cos(phi), r * np.sin(phi)], axis=1)
        v = rng.normal(0.0, 0.8, (N_RANDOM_STATES, 2))
        return vj.systems.Kepler(), jnp.asarray(q), jnp.asarray(v), 0.1
    q = rng.uniform(-np.pi, np.pi, (N_RANDOM_STATES, 2))
    v = rng.normal(0.0, 2.0, (N_RANDOM_STATES, 2))
    return vj.systems.DoublePendulum(), jnp.asarray(q), jnp.asarray(v), 0.05


@eqx.filter_jit
def _defect(system, integrator, q, v, h):
    """Symplecticity defect of one step from ``(q, v)``, and whether its stage solve converged."""
    state = integrator.init(system, jnp.zeros((), q.dtype), q, v)
    _, stats = integrator.step(system, state, h)
    return vj.diagnostics.symplecticity_defect(system, integrator, state, h), stats.converged


def _defects(system, integrator, qs, vs, h):
    out = [_defect(system, integrator, q, v, jnp.asarray(h)) for q, v in zip(qs, vs)]
    return np.array([float(d) for d, _ in out]), np.array([bool(c) for _, c in out])


@pytest.mark.parametrize("system_name", ["kepler", "double_pendulum"])
@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_symplecticity_defect(preset, system_name):
    system, qs, vs, h = _random_states(system_name)
    defect, converged = _defects(system, make(preset), qs, vs, h)
    assert np.all(converged)
    assert np.max(defect) <= 1e-12, defect


def test_symplecticity_defect_detects_non_symplectic_map():
    """Negative control: the same diagnostic on classical RK4 is far above the threshold."""
    system, qs, vs, h = _random_states("kepler")
    defect, _ = _defects(system, RK4(), qs, vs, h)
    assert np.min(defect) > 1e-9, defect


# ============================================================================================
# 3. Long-time energy behaviour
# ============================================================================================

N_LONG = 100_000
SAVE_EVERY = 10
# Step size per order on Kepler (e = 0.5): large enough that the O(h^p) energy oscillation
# (1e-9 .. 1e-4) dominates round-off, small enough for the fixed-point stage solver.
ENERGY_STEP = {2: 0.01, 4: 0.05, 6: 0.1, 8: 0.15}
T_MAX = 3.0              # |slope / stderr| of the block-averaged drift fit
REL_DRIFT_MAX = 0.02     # fitted drift over the whole run / max |energy error|
GROWTH_MAX = 1.1         # max |error| over the run / max |error| over its first 10 %


class EnergyVerdict(NamedTuple):
    t_statistic: float
    rel_drift: float     # |slope| * duration / bound
    growth: float        # max over the run / max over its first 10 %
    bound: float

    @property
    def bounded_without_drift(self) -> bool:
        return (abs(self.t_statistic) < T_MAX and self.rel_drift < REL_DRIFT_MAX
                and self.growth <= GROWTH_MAX)


def energy_verdict(t, err) -> EnergyVerdict:
    """The no-drift criterion.

    A symplectic method conserves a modified energy to exponentially small error, so the true
    energy error is an O(h^p) quasi-periodic oscillation with no secular part.  We require
    (i) the drift fitted to block means (:func:`vijax.diagnostics.drift`: 50 blocks, each
    spanning several periods of the oscillation, which averages it out) to be statistically
    zero, |t| < 3 -- a 2 % trend already gives |t| ≈ 5 on Kepler; (ii) the fitted
    drift accumulated over the run to be < 2 % of the oscillation amplitude (a statistically
    significant but physically negligible slope would still fail); (iii) no growth: the
    maximum over the run within 10 % of the maximum over its first tenth.  The negative
    controls below show that each part rejects a drifting signal (synthetic trends: (i) and
    (ii); RK4: all three).  The step sizes keep the truncation error well above round-off: once
    it falls below ~1e-12 a round-off-level drift from the stage-solver tolerance appears
    (Gauss(4), h = 0.15 on Hénon–Heiles: 8e-15 over 10^5 steps), which is not what is
    tested here.
    """
    t = np.asarray(t)
    err = np.asarray(err)
    fit = vj.diagnostics.drift(t, err)
    early = np.max(np.abs(err[: err.size // 10]))
    return EnergyVerdict(fit.t_statistic, abs(fit.slope) * (t[-1] - t[0]) / fit.bound,
                         fit.bound / early, fit.bound)


def _long_run(system, integrator, q0, v0, h):
    sol = vj.simulate(system, integrator, q0=q0, v0=v0, dt=h, n_steps=N_LONG,
                      save_every=SAVE_EVERY)
    assert bool(sol.stats.all_converged)
    return np.asarray(sol.t), np.asarray(vj.diagnostics.energy_error(system, sol))


@pytest.fixture(scope="module")
def kepler_sv_energy():
    kep = vj.systems.Kepler()
    q0, v0 = kep.initial_conditions(KEPLER_E)
    return _long_run(kep, vj.VPRK.stormer_verlet(), q0, v0, ENERGY_STEP[2])


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_energy_bounded_without_drift_kepler(preset):
    kep = vj.systems.Kepler()
    q0, v0 = kep.initial_conditions(KEPLER_E)
    t, err = _long_run(kep, make(preset), q0, v0, ENERGY_STEP[expected_order(preset)])
    verdict = energy_verdict(t, err)
    # the signal is truncation error, not round-off, and it is small
    assert 1e-10 < verdict.bound < 1e-3, verdict
    assert verdict.bounded_without_drift, verdict


@pytest.mark.parametrize("preset,h", [("stormer_verlet", 0.01), ("gauss2", 0.05)])
def test_energy_bounded_without_drift_henon_heiles(preset, h):
    hh = vj.systems.HenonHeiles()
    q0, v0 = jnp.array([0.1, -0.2]), jnp.array([0.3, 0.25])  # E = 0.102 < 1/6 (bounded)
    t, err = _long_run(hh, make(preset), q0, v0, h)
    verdict = energy_verdict(t, err)
    assert 1e-10 < verdict.bound < 1e-3, verdict
    assert verdict.bounded_without_drift, verdict


def test_energy_criterion_detects_rk4_drift():
    """Negative control: classical RK4 (order 4, not symplectic) through the same pipeline;
    its energy error on Kepler is dominated by a linear drift."""
    kep = vj.systems.Kepler()
    q0, v0 = kep.initial_conditions(KEPLER_E)
    t, err = _long_run(kep, RK4(), q0, v0, 0.05)
    verdict = energy_verdict(t, err)
    assert not verdict.bounded_without_drift
    assert abs(verdict.t_statistic) > 100 and verdict.rel_drift > 0.5 and verdict.growth > 5


@pytest.mark.parametrize("fraction", [0.05, -0.05, 0.02])
def test_energy_criterion_detects_small_synthetic_trend(kepler_sv_energy, fraction):
    """Negative control: add to the Störmer--Verlet energy signal a linear trend whose total
    size over the run is only a few per cent of the oscillation amplitude; the criterion flags
    it (the t-statistic alone catches 2 %; at 5 % the relative drift does too)."""
    t, err = kepler_sv_energy
    clean = energy_verdict(t, err)
    assert clean.bounded_without_drift
    trended = err + fraction * clean.bound * (t - t[0]) / (t[-1] - t[0])
    verdict = energy_verdict(t, trended)
    assert not verdict.bounded_without_drift, verdict
    assert abs(verdict.t_statistic) >= T_MAX, verdict
    if abs(fraction) >= 0.05:
        assert verdict.rel_drift >= REL_DRIFT_MAX, verdict


@pytest.mark.parametrize("preset,h,order", [("stormer_verlet", 0.02, 2), ("gauss2", 0.1, 4)])
def test_energy_error_amplitude_scales_like_h_to_the_order(preset, h, order):
    """The energy oscillation is the O(h^p) difference between H and the modified
    Hamiltonian: halving h divides its amplitude by 2^p."""
    kep = vj.systems.Kepler()
    q0, v0 = kep.initial_conditions(KEPLER_E)
    integrator = make(preset)
    bounds = []
    n = int(round(4 * 2 * np.pi / h))  # four orbits at h, two at h/2; same n: one compilation
    for dt in (h, h / 2):
        sol = vj.simulate(kep, integrator, q0=q0, v0=v0, dt=dt, n_steps=n)
        assert bool(sol.stats.all_converged)
        bounds.append(float(np.max(np.abs(vj.diagnostics.energy_error(kep, sol)))))
    assert abs(np.log2(bounds[0] / bounds[1]) - order) <= ORDER_TOL, bounds


# ============================================================================================
# 4. Time reversibility
# ============================================================================================


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_time_reversible(preset):
    """Every preset is symmetric (Gauss; Lobatto IIIA–IIIB pairs): stepping ``n`` times with
    ``h`` and ``n`` times with ``-h`` returns to the start up to round-off and the stage-solve
    tolerance, although the trajectory moved by O(1) in between.  On the double pendulum: a
    non-constant mass matrix makes every preset, Störmer–Verlet included, implicit."""
    system = vj.systems.DoublePendulum()
    q0, v0 = jnp.array([1.0, -0.5]), jnp.array([0.3, 1.2])
    start, end, ok, far = _round_trip(system, make(preset), q0, v0, jnp.asarray(0.05), 20)
    assert bool(ok)
    assert float(far) > 0.5  # the trajectory really went somewhere
    assert abs(float(end.t)) < 1e-14
    assert np.max(np.abs(np.asarray(end.q - start.q))) < 1e-12
    assert np.max(np.abs(np.asarray(end.p - start.p))) < 1e-12


def test_reversibility_check_detects_non_symmetric_method():
    """Negative control: RK4 is not symmetric, so the same round trip misses by ~n h^5."""
    system = vj.systems.DoublePendulum()
    q0, v0 = jnp.array([1.0, -0.5]), jnp.array([0.3, 1.2])
    start, end, _, _ = _round_trip(system, RK4(), q0, v0, jnp.asarray(0.05), 20)
    assert np.max(np.abs(np.asarray(end.q - start.q))) > 1e-8


# ============================================================================================
# 5. Consistency with independent implementations
# ============================================================================================


def _midpoint_step_pendulum(system, q, p, h):
    """Implicit midpoint rule for ``H = p^2 / (2 m l^2) - m g l cos q`` (scalar Newton)."""
    inertia = system.m * system.l**2
    mgl = system.m * system.g * system.l
    # q1 = q + h/I * (p - h/2 * mgl sin((q + q1)/2)) =: G(q1)
    q1 = q + h * p / inertia
    for _ in range(50):
        g = q1 - q - h / inertia * (p - 0.5 * h * mgl * np.sin(0.5 * (q + q1)))
        dg = 1.0 + h * h * mgl / (4.0 * inertia) * np.cos(0.5 * (q + q1))
        q1 = q1 - g / dg
    p1 = p - h * mgl * np.sin(0.5 * (q + q1))
    return q1, p1


def _velocity_verlet_step(system, grad_v, q, p, h):
    """Explicit Störmer--Verlet (kick-drift-kick) for a constant mass matrix."""
    m_inv = np.linalg.inv(np.asarray(system.mass_matrix(jnp.asarray(q))))
    p_half = p - 0.5 * h * grad_v(q)
    q1 = q + h * m_inv @ p_half
    p1 = p_half - 0.5 * h * grad_v(q1)
    return q1, p1


def _potential_gradient(system):
    """``grad V`` as a numpy function (compiled once)."""
    grad = jax.jit(jax.grad(system.potential))
    return lambda q: np.asarray(grad(jnp.asarray(q)))


@pytest.mark.parametrize("preset", ["gauss1", "midpoint"])
def test_gauss1_is_the_implicit_midpoint_rule(preset):
    system = vj.systems.Pendulum()
    integrator = make(preset)
    q0, v0, h = jnp.array([1.2]), jnp.array([0.7]), 0.1
    p0 = float(system.momentum(q0, v0)[0])
    # one step
    new, ok = _advance(system, integrator, q0, v0, jnp.asarray(h), jnp.asarray(1))
    assert bool(ok)
    q1, p1 = _midpoint_step_pendulum(system, 1.2, p0, h)
    assert abs(float(new.q[0]) - q1) < 1e-14 and abs(float(new.p[0]) - p1) < 1e-14
    # and many steps (the stage predictor carried between steps does not matter)
    end, ok = _advance(system, integrator, q0, v0, jnp.asarray(h), jnp.asarray(50))
    q, p = 1.2, p0
    for _ in range(50):
        q, p = _midpoint_step_pendulum(system, q, p, h)
    assert bool(ok)
    assert abs(float(end.q[0]) - q) < 1e-13 and abs(float(end.p[0]) - p) < 1e-13


@pytest.mark.parametrize("system_name", ["kepler", "henon_heiles"])
@pytest.mark.parametrize("preset", ["lobatto2", "stormer_verlet"])
def test_lobatto2_is_explicit_stormer_verlet_for_constant_mass(preset, system_name):
    if system_name == "kepler":
        system = vj.systems.Kepler()
        q0, v0 = system.initial_conditions(KEPLER_E)
    else:
        system = vj.systems.HenonHeiles()
        q0, v0 = jnp.array([0.1, -0.2]), jnp.array([0.3, 0.25])
    integrator = make(preset)
    h = 0.1
    p0 = np.asarray(system.momentum(q0, v0))
    new, ok = _advance(system, integrator, q0, v0, jnp.asarray(h), jnp.asarray(1))
    assert bool(ok)
    grad_v = _potential_gradient(system)
    q1, p1 = _velocity_verlet_step(system, grad_v, np.asarray(q0), p0, h)
    np.testing.assert_allclose(np.asarray(new.q), q1, rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.asarray(new.p), p1, rtol=0, atol=1e-14)
    end, ok = _advance(system, integrator, q0, v0, jnp.asarray(h), jnp.asarray(50))
    q, p = np.asarray(q0), p0
    for _ in range(50):
        q, p = _velocity_verlet_step(system, grad_v, q, p, h)
    assert bool(ok)
    np.testing.assert_allclose(np.asarray(end.q), q, rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.asarray(end.p), p, rtol=0, atol=1e-13)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("form", ["velocity", "force", "momentum"])
def test_predictor_passes_through_the_node_value(form, stages):
    """The warm start of the stage solve of a :class:`vijax.MechanicalSystem`: the previous
    step's stage values extrapolated through the node value as well -- the node velocity
    ``M(q_k)^{-1} p_k`` (velocity form: the double pendulum, whose mass matrix depends on
    ``q``), the node force ``D1L(q_k, v_k)`` (force form: Kepler, constant mass matrix) or
    the node velocity from one Newton step on the Legendre map (momentum form: a
    relativistic oscillator) -- have error ``O(h^{s+1})`` against the step's root, the stage
    values alone ``O(h^s)`` (measured slopes, h = 0.02 ... 0.005, Gauss(2) and Gauss(3):
    double pendulum at t = 0.4 2.96/2.00 and 3.99/2.96; Kepler at t = 1 3.00/2.00 and
    4.01/3.01; relativistic oscillator at t = 1 3.02/2.00 and 4.00/3.00).  Updates per
    step, Gauss(2) at h = 0.01: 5.2 -> 4.4 on the double pendulum, 2.5 -> 2.2 on Kepler,
    2.47 -> 2.14 on Kepler as a general Lagrangian."""
    if form == "velocity":
        system = vj.systems.DoublePendulum()
        q0, v0, t_end = jnp.array([1.0, 1.5]), jnp.array([0.0, 0.3]), 0.4
    elif form == "force":
        system = vj.systems.Kepler()
        q0, v0 = system.initial_conditions(KEPLER_E)
        t_end = 1.0
    else:   # a Lagrangian with a velocity-dependent Hessian: the node velocity by Newton
        # (imported here: examples/order_table.py loads this module without tests/ on the path)
        from helpers import RelativisticParticle
        system = RelativisticParticle(m=1.0, k=1.0)
        q0, v0, t_end = jnp.array([1.0, -0.5]), jnp.array([0.3, 0.4]), 1.0
    integrator = vj.VPRK.gauss(stages)
    hs = np.array([0.02, 0.01, 0.005])
    with_node, stages_only = [], []
    for h in hs:
        state = integrator.init(system, 0.0, q0, v0)
        step = jax.jit(lambda s, h=h: integrator.step(system, s, h)[0])
        for _ in range(int(round(t_end / h))):
            state = step(state)
        extrap = integrator._extrapolation(state.q.dtype)
        if form == "velocity":
            root = step(state).stages
            predicted = integrator._velocity_predictor(system, state, extrap)
            old = extrap @ state.stages
        elif form == "momentum":
            root = step(state).stages
            old = extrap @ state.stages
            minv = system.inverse_velocity_hessian(state.q, old[-1])
            predicted = integrator._momentum_predictor(system, state, extrap, minv)
        else:
            root = step(state).forces
            minv = system.inverse_mass_matrix(state.q)
            predicted = integrator._force_predictor(system, state, extrap, minv)
            old = extrap @ state.forces
        with_node.append(float(jnp.max(jnp.abs(predicted - root))))
        stages_only.append(float(jnp.max(jnp.abs(old - root))))
    slope = lambda e: np.polyfit(np.log(hs), np.log(e), 1)[0]  # noqa: E731
    assert abs(slope(with_node) - (stages + 1)) < 0.3, with_node
    assert abs(slope(stages_only) - stages) < 0.3, stages_only
    assert with_node[-1] < 0.1 * stages_only[-1]


@pytest.mark.parametrize("stages", [2, 3])
def test_predictor_misses_remove_a_power_of_h_each(stages):
    """The velocity form's warm start corrected by the predictor's misses of the last steps
    (``_prk_core.corrected``): the miss is a smooth function of time to leading order, so the
    last miss removes one power of ``h`` from the predictor's error against the step's root
    and the linear trend of the last two another (measured slopes on the double pendulum at
    t = 0.4, h = 0.02 ... 0.005: Gauss(2) 2.97 / 3.95 / 4.88, Gauss(3) 3.99 / 4.94 / 5.87).
    The corrected start saves updates (Gauss(2), h = 0.01: 4.49 -> 3.83 per step over 20000
    steps) and changes no root beyond the solver's tolerance (here against the uncorrected
    start, stepped by hand)."""
    from helpers import assert_miss_orders

    system = vj.systems.DoublePendulum()
    q0, v0, t_end = jnp.array([1.0, 1.5]), jnp.array([0.0, 0.3]), 0.4
    integrator = vj.VPRK.gauss(stages)
    assert integrator._carries_misses(system)
    assert not integrator._carries_misses(vj.systems.Kepler())   # force form: none carried

    def case(h):
        state = integrator.init(system, 0.0, q0, v0)
        step = jax.jit(lambda s: integrator.step(system, s, h)[0])
        for _ in range(int(round(t_end / h))):
            state = step(state)
        raw = integrator._velocity_predictor(system, state,
                                             integrator._extrapolation(state.q.dtype))
        return raw, state.misses, step(state).stages

    assert_miss_orders(np.array([0.02, 0.01, 0.005]), case, (stages + 1, stages + 2, stages + 3))

    # the same roots as the uncorrected start (warm held at 0: no miss used), fewer updates
    from helpers import with_and_without_misses

    a, b, updates_a, updates_b = with_and_without_misses(integrator, system, q0, v0, 0.01, 400)
    np.testing.assert_allclose(a.q, b.q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.p, b.p, rtol=0, atol=1e-12)
    assert updates_a < 0.95 * updates_b, (updates_a, updates_b)
