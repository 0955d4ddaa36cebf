"""Non-conservative forces and controls (:class:`vijax.ForcedSystem`) in every integrator family.

Each family takes a generalised force ``F(t, q, v, u)`` through the discrete
Lagrange--d'Alembert principle (Marsden & West (2001), §3; Ober-Blöbaum, Junge & Marsden
(2011)), adding the virtual work of ``F`` with its own stage or quadrature nodes.  What is
checked here, in float64:

* **Forced orders, minimal coordinates.**  A damped, driven pendulum
  ``θ'' = -g sin θ - c θ' + A cos(ωt) + u(t)`` (smooth control ``u``, one value per force node)
  and a pendulum with a configuration-dependent mass and configuration-dependent damping
  (a general :class:`~vijax.LagrangianSystem`, no control); references by DOP853 (rtol 1e-13)
  on the hand-written equations.  The max-norm error over ``t = 1/4, 1/2, 3/4, 1`` in ``q`` and
  ``v`` at ``h = 1/8, 1/16, 1/32`` has a log–log slope within ±0.3 of ``integrator.order``.
  Measured slopes (q, v; driven pendulum / variable mass):

  ==========================  =====  ===========================  ===========================
  method                      order  driven pendulum              variable mass
  ==========================  =====  ===========================  ===========================
  VPRK Gauss(1), (2), (3)     2/4/6  2.00 1.99 / 4.00 4.00 /       2.00 2.00 / 4.01 4.00 /
                                     6.02 5.99                    6.14 6.13
  VPRK Lobatto(2), (3), (4)   2/4/6  2.01 2.00 / 4.03 4.01 /       2.01 2.01 / 4.04 4.03 /
                                     6.03 6.04                    6.14 6.12
  GalerkinVI gauss(2)         4      4.00 4.00                    4.01 4.00
  GalerkinVI lobatto(2)       4      4.03 4.01                    3.98 4.00
  DGVI(2), DGVI(3)            3/5    3.01 3.03 / 5.00 5.06        3.02 3.02 / 4.88 5.02
  CGVI(1), CGVI(2)            2/4    2.00 1.99 / 4.00 3.99        2.00 1.99 / 4.02 4.00
  ==========================  =====  ===========================  ===========================

* **Stage controls are needed for full order.**  The same control held over each step (shape
  ``(n_steps, control_dim)``) caps Gauss(2) at order 2 when sampled at the step midpoint
  (measured 2.05 / 2.07) and at order 1 when sampled at the step start (1.00 / 1.05).
  ``simulate`` with stage controls ``(n_steps, k, control_dim)``, with a callable ``u(t)`` and
  with held controls reproduces the hand-driven steps to round-off.
* **Constrained forced orders.**  The Cartesian pendulum (``R^2``, ``l = 1``,
  ``g(q) = (|q|² - 1)/2``) with damping ``-c v``, a horizontal drive and a control; reference
  from the angle ODE with the generalised force ``Q_θ = l (cos θ F_x + sin θ F_y)``.  Slopes in
  ``θ`` and the angular velocity: RATTLE 2.02 / 2.01, HolonomicVPRK Lobatto(3) 4.00 / 4.00,
  Lobatto(4) 6.00 / 5.99, GalerkinVI gauss(2) 4.00 / 4.00, lobatto(3) 6.00 / 5.99, DGVI(2)
  3.02 / 3.16 (at ``h = 1/32 .. 1/128``: its velocity error has a large ``h^4`` part, the
  slope is 3.4 at ``h = 1/8 .. 1/32``).  ``|g(q_k)| ≤ 1e-12`` at every node.
* **Energy balance** ``E(t_N) - E(0) = ∫ F·v dt``: the work integrated from the method's own
  nodes ``(t_k, q_k, v_k)`` by the composite Boole rule (order 6) balances the energy change up
  to an error of the method's order: slopes 4.00 (VPRK Gauss(2), GalerkinVI gauss(2)) and 4.04
  (VPRK Lobatto(3)) at ``h = 1/16 .. 1/64``.  (The work along the dense output would measure
  the dense velocity, whose accuracy is the stage order, 2 for these methods, not the
  method's order.)
* **Zero force**: the driven systems with ``c = A = u = 0`` (``F ≡ 0``) step exactly as the
  unforced catalogue systems, in every family.
* **Gradients** of a function of the final state with respect to the stage controls, the
  initial angular velocity and the damping coefficient, by ``jax.grad`` through ``simulate``,
  match central differences to 1e-6 relative.
* **Bad input**: missing controls, controls for a system without control, a wrong control
  shape and a force of the wrong shape are refused with messages that name the fix.
* **Dissipation**: with ``u = 0`` and ``c > 0`` the discrete energy decreases at every one of
  200 steps (and is conserved, not monotone, without damping).

The order, balance, zero-force and dissipation tests drive ``integrator.step`` in a compiled
``lax.fori_loop`` with a *dynamic* trip count, so each (system, method) pair compiles once for
every step size and count; ``simulate`` is checked against that loop.  The file is
compile-bound: about 75 s of CPU by default (under a minute on 2 cores); the variable-mass
orders of the remaining presets and the GalerkinVI / DGVI gradients add about 35 s with
``-m slow``.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import vijax as vj

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py

GRAVITY = 9.81
DAMPING, DRIVE, FREQUENCY = 0.3, 0.5, 1.3
THETA0 = 1.0
T_FINAL = 1.0
GRID = np.array([0.25, 0.5, 0.75, 1.0])  # times where the errors are measured (max over them)
STEPS = (8, 16, 32)
N_MAX = 200  # node buffer of the stepping loop


def control(t):
    """The smooth control ``u(t)``, shape ``(1,)``."""
    return (0.4 * jnp.sin(2.0 * t) + 0.1)[None]


def control_np(t):
    return 0.4 * np.sin(2.0 * t) + 0.1


# --------------------------------------------------------------------------------------------
# Systems
# --------------------------------------------------------------------------------------------


class DrivenPendulum(vj.ForcedSystem, vj.systems.Pendulum):
    """``L = θ'²/2 + g cos θ`` (m = l = 1) with ``F = -c θ' + A cos(ωt) + u``."""

    c: float = DAMPING
    drive: float = DRIVE
    omega: float = FREQUENCY
    control_dim: ClassVar[int] = 1

    def force(self, t, q, v, u):
        return -self.c * v + self.drive * jnp.cos(self.omega * t) + u


class VariableMassPendulum(vj.ForcedSystem):
    """``L = (1 + 0.3 sin² q) v²/2 + g cos q``, ``F = -c (1 + q²) v + A cos(ωt)``; no control.
    A general Lagrangian: every derivative by autodiff (declared quadratic in ``v``, so that
    the inverse Legendre map is a linear solve)."""

    quadratic_in_velocity: ClassVar[bool] = True
    c: float = DAMPING
    drive: float = DRIVE
    omega: float = FREQUENCY

    def lagrangian(self, q, v):
        return 0.5 * (1.0 + 0.3 * jnp.sin(q[0]) ** 2) * v[0] ** 2 + GRAVITY * jnp.cos(q[0])

    def force(self, t, q, v, u):
        return -self.c * (1.0 + q ** 2) * v + self.drive * jnp.cos(self.omega * t)


class DrivenCartesianPendulum(vj.ForcedSystem, vj.systems.CartesianPendulum):
    """The Cartesian pendulum (m = l = 1, gravity along -y) with ``F = -c v + (A cos(ωt) + u,
    0)``."""

    c: float = DAMPING
    drive: float = DRIVE
    omega: float = FREQUENCY
    control_dim: ClassVar[int] = 1

    def force(self, t, q, v, u):
        push = jnp.stack([self.drive * jnp.cos(self.omega * t) + u[0], jnp.zeros((), q.dtype)])
        return -self.c * v + push


def _as_arrays(system):
    """Float parameters as float64 arrays: traced by ``filter_jit``, so that one compilation
    serves every value."""
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(x, jnp.float64) if isinstance(x, float) else x, system)


def cartesian_state(theta, omega):
    """``(q, v)`` of the Cartesian pendulum at angle ``theta`` and angular velocity ``omega``."""
    return (jnp.stack([jnp.sin(theta), -jnp.cos(theta)]),
            omega * jnp.stack([jnp.cos(theta), jnp.sin(theta)]))


# --------------------------------------------------------------------------------------------
# References (DOP853 on the hand-written equations of motion)
# --------------------------------------------------------------------------------------------


def _dop853(rhs, t_eval):
    sol = solve_ivp(rhs, (0.0, float(t_eval[-1])), [THETA0, 0.0], method="DOP853",
                    t_eval=t_eval, rtol=1e-13, atol=1e-14)
    assert sol.success
    return sol.y.T  # rows (θ, θ') at t_eval


def _driven_rhs(t, y):
    th, w = y
    return [w, -GRAVITY * np.sin(th) - DAMPING * w + DRIVE * np.cos(FREQUENCY * t)
            + control_np(t)]


def _variable_mass_rhs(t, y):
    # d/dt (m(q) v) - m'(q) v²/2 + g sin q = F,  m = 1 + 0.3 sin² q
    q, v = y
    m = 1.0 + 0.3 * np.sin(q) ** 2
    dm = 0.6 * np.sin(q) * np.cos(q)
    f = -DAMPING * (1.0 + q * q) * v + DRIVE * np.cos(FREQUENCY * t)
    return [v, (f - 0.5 * dm * v * v - GRAVITY * np.sin(q)) / m]


def _cartesian_rhs(t, y):
    # θ'' = -g sin θ + Q_θ with Q_θ = cos θ F_x + sin θ F_y, F = -c v + (A cos ωt + u, 0)
    th, w = y
    return [w, -GRAVITY * np.sin(th) - DAMPING * w
            + np.cos(th) * (DRIVE * np.cos(FREQUENCY * t) + control_np(t))]


@functools.lru_cache(maxsize=None)
def reference(name):
    rhs = {"driven": _driven_rhs, "variable_mass": _variable_mass_rhs,
           "cartesian": _cartesian_rhs}[name]
    return _dop853(rhs, GRID)


def test_references_are_converged():
    """The references agree with DOP853 at rtol 1e-11 to 1e-10: far below the smallest errors
    the order fits use (~1e-11 is reached only by order-6 methods at h = 1/32, where the
    reference error is another two orders smaller)."""
    for name, rhs in (("driven", _driven_rhs), ("variable_mass", _variable_mass_rhs),
                      ("cartesian", _cartesian_rhs)):
        loose = solve_ivp(rhs, (0.0, T_FINAL), [THETA0, 0.0], method="DOP853", t_eval=GRID,
                          rtol=1e-11, atol=1e-12).y.T
        assert np.max(np.abs(loose - reference(name))) < 1e-10


# --------------------------------------------------------------------------------------------
# The stepping loop: one compilation per (system, method, control mode), any h and n
# --------------------------------------------------------------------------------------------


@eqx.filter_jit
def _advance(system, integrator, q0, v0, h, n, controls, scale):
    """``n <= N_MAX`` steps of size ``h`` from ``(q0, v0)`` at ``t = 0``.

    ``controls``: ``None`` (no control), ``"stage"`` (``u`` at every force node),
    ``"midpoint"`` / ``"start"`` (``u`` held over the step, sampled at its midpoint / start);
    the control is ``scale * control(t)`` (``scale`` traced: ``0`` reuses the compilation).
    Returns the nodes ``q_k``, ``p_k`` (rows ``0..n``; later rows zero) and whether every
    stage solve converged."""
    nodes = jnp.asarray(integrator.force_nodes(), q0.dtype)

    def body(i, carry):
        state, ok, Q, P = carry
        t = state.t
        if controls == "stage":
            u = scale * jax.vmap(control)(t + h * nodes)   # (k, 1)
        elif controls == "midpoint":
            u = scale * control(t + 0.5 * h)                 # (1,)
        elif controls == "start":
            u = scale * control(t)
        else:
            u = None
        state, stats = integrator.step(system, state, h, u)
        Q = Q.at[i + 1].set(state.q)
        P = P.at[i + 1].set(state.p)
        return state, ok & stats.converged, Q, P

    state0 = integrator.init(system, jnp.zeros((), q0.dtype), q0, v0)
    Q = jnp.zeros((N_MAX + 1,) + q0.shape, q0.dtype).at[0].set(state0.q)
    P = jnp.zeros((N_MAX + 1,) + q0.shape, q0.dtype).at[0].set(state0.p)
    _, ok, Q, P = jax.lax.fori_loop(0, n, body, (state0, jnp.asarray(True), Q, P))
    return Q, P, ok


def advance(system, integrator, q0, v0, n, controls, t_final=T_FINAL, scale=1.0):
    """Nodes ``(q_k, p_k)``, ``k = 0..n``, as NumPy arrays (the velocities follow from the
    Legendre maps written out in the tests, outside the compiled loop)."""
    assert n <= N_MAX
    Q, P, ok = _advance(_as_arrays(system), integrator, jnp.asarray(q0, jnp.float64),
                        jnp.asarray(v0, jnp.float64), jnp.asarray(t_final / n),
                        jnp.asarray(n), controls, jnp.asarray(scale))
    assert bool(ok), f"{integrator.name}: a stage solve did not converge (n = {n})"
    return np.asarray(Q)[:n + 1], np.asarray(P)[:n + 1]


def slope(steps, errors):
    """Least-squares slope of log(error) against log(h), h = T / n."""
    return float(np.polyfit(np.log(T_FINAL / np.asarray(steps, float)), np.log(errors), 1)[0])


def grid_rows(n):
    return np.rint(GRID * n).astype(int)


# --------------------------------------------------------------------------------------------
# 1. Forced orders in minimal coordinates
# --------------------------------------------------------------------------------------------

METHODS = {
    "vprk-gauss1": (lambda: vj.VPRK.gauss(1), 2),
    "vprk-gauss2": (lambda: vj.VPRK.gauss(2), 4),
    "vprk-gauss3": (lambda: vj.VPRK.gauss(3), 6),
    "vprk-lobatto2": (lambda: vj.VPRK.lobatto(2), 2),
    "vprk-lobatto3": (lambda: vj.VPRK.lobatto(3), 4),
    "vprk-lobatto4": (lambda: vj.VPRK.lobatto(4), 6),
    "galerkin-gauss2": (lambda: vj.GalerkinVI.gauss(2), 4),
    "galerkin-lobatto2": (lambda: vj.GalerkinVI.lobatto(2), 4),
    "dgvi2": (lambda: vj.DGVI(2), 3),
    "dgvi3": (lambda: vj.DGVI(3), 5),
    "cgvi1": (lambda: vj.CGVI(1), 2),
    "cgvi2": (lambda: vj.CGVI(2), 4),
}

SYSTEMS = {
    "driven": (DrivenPendulum, "stage"),
    "variable_mass": (VariableMassPendulum, None),
}


def velocity_np(system_name, Q, P):
    """The inverse Legendre maps, written out: ``v = p / m(q)``."""
    if system_name == "variable_mass":
        return P / (1.0 + 0.3 * np.sin(Q) ** 2)
    return P  # unit mass and length


def minimal_errors(system_name, integrator, controls, steps=STEPS):
    """Max-norm errors over the grid in ``q`` and ``v``, one row per step count."""
    ref = reference(system_name)
    system = SYSTEMS[system_name][0]()
    errors = []
    for n in steps:
        Q, P = advance(system, integrator, [THETA0], [0.0], n, controls)
        V = velocity_np(system_name, Q, P)
        rows = grid_rows(n)
        errors.append([np.max(np.abs(Q[rows, 0] - ref[:, 0])),
                       np.max(np.abs(V[rows, 0] - ref[:, 1]))])
    return np.array(errors)


# The variable-mass pendulum (a general Lagrangian) runs on one preset per family by default,
# on all of them with -m slow (compile-bound: ~3 s each).
VARIABLE_MASS_DEFAULT = ("vprk-gauss2", "vprk-lobatto3", "galerkin-gauss2", "dgvi2", "cgvi1")
ORDER_CASES = [pytest.param(m, s, id=f"{m}-{s}",
                            marks=[pytest.mark.slow] if s == "variable_mass"
                            and m not in VARIABLE_MASS_DEFAULT else [])
               for m in METHODS for s in SYSTEMS]


@pytest.mark.parametrize(("method", "system_name"), ORDER_CASES)
def test_forced_order(method, system_name):
    make, order = METHODS[method]
    integrator = make()
    assert integrator.order == order  # the theoretical order, written out above
    errors = minimal_errors(system_name, integrator, SYSTEMS[system_name][1])
    assert np.all(errors[-1] > 1e-12), errors  # above round-off: the fit measures the method
    for column, what in ((0, "q"), (1, "v")):
        p = slope(STEPS, errors[:, column])
        assert abs(p - order) <= 0.3, (
            f"{integrator.name} on {system_name}: slope in {what} {p:.2f}, expected {order} "
            f"(errors {errors[:, column]})")


def test_held_controls_limit_the_order():
    """A control held over each step is a first- (step start) or second-order (midpoint)
    approximation of ``u(t)``, whatever the method: Gauss(2) needs stage controls to reach
    order 4."""
    integrator = vj.VPRK.gauss(2)
    stage = minimal_errors("driven", integrator, "stage")
    midpoint = minimal_errors("driven", integrator, "midpoint")
    start = minimal_errors("driven", integrator, "start")
    for column in (0, 1):
        assert 3.7 <= slope(STEPS, stage[:, column]) <= 4.3
        assert 1.7 <= slope(STEPS, midpoint[:, column]) <= 2.3   # measured 2.05 / 2.07
        assert 0.7 <= slope(STEPS, start[:, column]) <= 1.3      # measured 1.00 / 1.05
    # at h = 1/32 the held control costs two orders of magnitude
    assert np.all(midpoint[-1] > 30 * stage[-1]), (midpoint[-1], stage[-1])


def test_simulate_controls_match_the_step_loop():
    """``simulate`` with stage controls ``(n_steps, k, c)``, with a callable ``u(t)`` (sampled
    at ``t_k + c_i dt``) and with held controls ``(n_steps, c)`` runs the same steps as the
    hand-driven loop."""
    integrator = vj.VPRK.gauss(2)
    n, dt = 8, T_FINAL / 8
    system = DrivenPendulum()
    times = dt * (np.arange(n)[:, None] + integrator.force_nodes()[None, :])   # (n, k)
    stage_u = control_np(times)[:, :, None]                                     # (n, k, 1)
    held_u = control_np(dt * (np.arange(n) + 0.5))[:, None]                     # (n, 1)
    kwargs = dict(q0=jnp.array([THETA0]), v0=jnp.array([0.0]), dt=dt, n_steps=n)
    Q, P = advance(system, integrator, [THETA0], [0.0], n, "stage")
    for controls in (jnp.asarray(stage_u), control):
        sol = vj.simulate(system, integrator, controls=controls, **kwargs)
        assert sol.q.shape == (n + 1, 1)
        np.testing.assert_allclose(np.asarray(sol.q), Q, rtol=0, atol=1e-13)
        np.testing.assert_allclose(np.asarray(sol.p), P, rtol=0, atol=1e-13)
        np.testing.assert_allclose(np.asarray(sol.v), P, rtol=0, atol=1e-13)  # v = p here
    Qm, Pm = advance(system, integrator, [THETA0], [0.0], n, "midpoint")
    sol = vj.simulate(system, integrator, controls=jnp.asarray(held_u), **kwargs)
    np.testing.assert_allclose(np.asarray(sol.q), Qm, rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.asarray(sol.p), Pm, rtol=0, atol=1e-13)
    assert np.max(np.abs(Qm - Q)) > 1e-6  # and held controls do differ from stage controls


# --------------------------------------------------------------------------------------------
# 2. Constrained forced orders (Cartesian pendulum)
# --------------------------------------------------------------------------------------------

CONSTRAINED = {
    "rattle": (vj.HolonomicVPRK.rattle, 2, STEPS),
    "holonomic-lobatto3": (lambda: vj.HolonomicVPRK.lobatto(3), 4, STEPS),
    "holonomic-lobatto4": (lambda: vj.HolonomicVPRK.lobatto(4), 6, STEPS),
    "galerkin-gauss2": (lambda: vj.GalerkinVI.gauss(2), 4, STEPS),
    "galerkin-lobatto3": (lambda: vj.GalerkinVI.lobatto(3), 6, STEPS),
    # the velocity error has a large h^4 part: slope 3.4 at h = 1/8..1/32, 3.16 here
    "dgvi2": (lambda: vj.DGVI(2), 3, (32, 64, 128)),
}


@pytest.mark.parametrize("method", list(CONSTRAINED))
def test_constrained_forced_order(method):
    make, order, steps = CONSTRAINED[method]
    integrator = make()
    assert integrator.order == order
    ref = reference("cartesian")
    # λ of the continuous forced motion from the reference, by hand: dotting
    # m q'' = -∇V - q λ + F with q (|q| = l = m = 1, q·v = 0) gives λ = |v|² + g cos θ + F·q,
    # F·q = (A cos ωt + u) sin θ.
    lam_ref = (ref[:, 1] ** 2 + GRAVITY * np.cos(ref[:, 0])
               + (DRIVE * np.cos(FREQUENCY * GRID) + control_np(GRID)) * np.sin(ref[:, 0]))
    system = DrivenCartesianPendulum()
    lam_of = jax.jit(jax.vmap(lambda t, q, v: vj.constraints.multiplier(
        system, q, v, system.force(t, q, v, control(t)))))
    q0, v0 = cartesian_state(THETA0, 0.0)
    errors, residual = [], 0.0
    for n in steps:
        Q, V = advance(system, integrator, q0, v0, n, "stage")  # v = p
        residual = max(residual, np.max(np.abs(0.5 * (np.sum(Q ** 2, axis=1) - 1.0))))
        rows = grid_rows(n)
        theta = np.arctan2(Q[rows, 0], -Q[rows, 1])
        omega = np.cos(theta) * V[rows, 0] + np.sin(theta) * V[rows, 1]
        lam = np.asarray(lam_of(jnp.asarray(GRID), jnp.asarray(Q[rows]), jnp.asarray(V[rows])))
        errors.append([np.max(np.abs(theta - ref[:, 0])), np.max(np.abs(omega - ref[:, 1])),
                       np.max(np.abs(lam[:, 0] - lam_ref))])
    errors = np.array(errors)
    assert residual <= 1e-12, f"{integrator.name}: constraint residual {residual:.2e}"
    assert np.all(errors[-1] > 1e-12), errors
    for column, what in ((0, "theta"), (1, "angular velocity"), (2, "multiplier (70)")):
        p = slope(steps, errors[:, column])
        assert abs(p - order) <= 0.3, (
            f"{integrator.name}: slope in {what} {p:.2f}, expected {order} "
            f"(errors {errors[:, column]})")


# --------------------------------------------------------------------------------------------
# 3. Energy balance E(t_N) - E(0) = ∫ F·v dt
# --------------------------------------------------------------------------------------------


def boole(values, h):
    """Composite Boole rule (order 6) on ``4m + 1`` equally spaced samples."""
    n = len(values) - 1
    assert n % 4 == 0
    w = np.zeros(n + 1)
    for j in range(0, n, 4):
        w[j:j + 5] += np.array([7.0, 32.0, 12.0, 32.0, 7.0])
    return 2.0 * h / 45.0 * w @ values


def test_boole_rule():
    t = np.linspace(0.0, 1.0, 17)
    assert abs(boole(t ** 5, 1 / 16) - 1 / 6) < 1e-15            # exact on quintics
    errors = [abs(boole(np.cos(3 * np.linspace(0, 1, n + 1)), 1 / n) - np.sin(3) / 3)
              for n in (8, 16, 32)]
    assert abs(slope((8, 16, 32), errors) - 6) < 0.2


BALANCE_STEPS = (16, 32, 64)


@pytest.mark.parametrize("method", ["vprk-gauss2", "vprk-lobatto3", "galerkin-gauss2"])
def test_energy_balance(method):
    """The energy change of the discrete trajectory equals the work of ``F`` on it, up to an
    error of the method's order; the work is integrated from the nodes ``(t_k, q_k, v_k)`` by
    the composite Boole rule (order 6: its own error is of higher order)."""
    make, order = METHODS[method]
    integrator = make()
    system = DrivenPendulum()
    balance, changes = [], []
    for n in BALANCE_STEPS:
        Q, V = advance(system, integrator, [THETA0], [0.0], n, "stage")  # v = p
        t = T_FINAL / n * np.arange(n + 1)
        energy = np.asarray(jax.vmap(system.energy)(jnp.asarray(Q), jnp.asarray(V)))
        # E = v²/2 - g cos q, written out
        np.testing.assert_allclose(energy, 0.5 * V[:, 0] ** 2 - GRAVITY * np.cos(Q[:, 0]),
                                   rtol=0, atol=1e-12)
        power = (-DAMPING * V[:, 0] + DRIVE * np.cos(FREQUENCY * t) + control_np(t)) * V[:, 0]
        work = boole(power, T_FINAL / n)
        changes.append(energy[-1] - energy[0])
        balance.append(abs(energy[-1] - energy[0] - work))
    balance = np.array(balance)
    assert min(abs(c) for c in changes) > 0.1  # the force does O(1) work: not trivially balanced
    p = slope(BALANCE_STEPS, balance)
    assert abs(p - order) <= 0.3, f"{integrator.name}: balance error {balance}, slope {p:.2f}"


# --------------------------------------------------------------------------------------------
# 4. Zero force: the unforced trajectory
# --------------------------------------------------------------------------------------------

ZERO_FORCE = {
    "vprk-gauss2": (lambda: vj.VPRK.gauss(2), False),
    "rattle": (vj.HolonomicVPRK.rattle, True),
    "galerkin-gauss2": (lambda: vj.GalerkinVI.gauss(2), False),
    "dgvi2": (lambda: vj.DGVI(2), False),
    "cgvi2": (lambda: vj.CGVI(2), False),
}


@pytest.mark.parametrize("method", list(ZERO_FORCE))
def test_zero_force_is_the_unforced_system(method):
    """The driven systems with ``c = A = 0`` and ``u = 0`` (so ``F ≡ 0``; the same compiled
    loop as the order tests) step exactly as the catalogue systems they extend."""
    make, constrained = ZERO_FORCE[method]
    integrator = make()
    if constrained:
        forced, plain = (DrivenCartesianPendulum(c=0.0, drive=0.0),
                         vj.systems.CartesianPendulum())
        q0, v0 = cartesian_state(THETA0, 0.5)
    else:
        forced, plain = DrivenPendulum(c=0.0, drive=0.0), vj.systems.Pendulum()
        q0, v0 = jnp.array([THETA0]), jnp.array([0.5])
    assert isinstance(forced, vj.ForcedSystem) and not isinstance(plain, vj.ForcedSystem)
    force = forced.force(jnp.asarray(0.3), q0, v0, 0.0 * control(0.3))
    assert np.all(np.asarray(force) == 0.0)
    Qf, Pf = advance(forced, integrator, q0, v0, 16, "stage", t_final=0.8, scale=0.0)
    Qp, Pp = advance(plain, integrator, q0, v0, 16, None, t_final=0.8)
    assert np.max(np.abs(Qf - Qp)) <= 1e-13, (integrator.name, np.max(np.abs(Qf - Qp)))
    assert np.max(np.abs(Pf - Pp)) <= 1e-13, (integrator.name, np.max(np.abs(Pf - Pp)))
    assert np.max(np.abs(Qf[-1] - Qf[0])) > 0.1  # it moved


# --------------------------------------------------------------------------------------------
# 5. Gradients: controls, initial state, force parameter
# --------------------------------------------------------------------------------------------

GRADIENT_METHODS = {
    "vprk-gauss2": (lambda: vj.VPRK.gauss(2), False),
    "rattle": (vj.HolonomicVPRK.rattle, True),
    "galerkin-gauss2": (lambda: vj.GalerkinVI.gauss(2), False),
    "dgvi2": (lambda: vj.DGVI(2), False),
    "cgvi1": (lambda: vj.CGVI(1), False),
}
GRAD_STEPS, GRAD_DT = 8, 0.1


def _loss(U, omega0, c, integrator, constrained):
    """A scalar of the final state after ``GRAD_STEPS`` steps with stage controls ``U``,
    initial angular velocity ``omega0`` and damping ``c``."""
    if constrained:
        system = DrivenCartesianPendulum(c=c)
        q0, v0 = cartesian_state(jnp.asarray(THETA0), omega0)
    else:
        system = DrivenPendulum(c=c)
        q0, v0 = jnp.array([THETA0]), omega0[None]
    sol = vj.simulate(system, integrator, q0=q0, v0=v0, dt=GRAD_DT, n_steps=GRAD_STEPS,
                      controls=U)
    q, v = sol.q[-1], sol.v[-1]
    return jnp.sin(q[0]) + 0.3 * jnp.sum(v ** 2) + 0.1 * jnp.sum(q * v)


# one compilation serves the gradient and the central differences
_value_and_grad = eqx.filter_jit(jax.value_and_grad(_loss, argnums=(0, 1, 2)))


# compile-bound (4-8 s each: jax.grad through simulate): VPRK, HolonomicVPRK and CGVI by
# default, GalerkinVI and DGVI with -m slow
@pytest.mark.parametrize("method", [
    pytest.param(m, marks=[pytest.mark.slow] if m in ("galerkin-gauss2", "dgvi2") else [])
    for m in GRADIENT_METHODS])
def test_gradients_match_central_differences(method):
    make, constrained = GRADIENT_METHODS[method]
    integrator = make()
    k = len(integrator.force_nodes())
    times = GRAD_DT * (np.arange(GRAD_STEPS)[:, None] + integrator.force_nodes()[None, :])
    U = jnp.asarray(control_np(times)[:, :, None])          # (n_steps, k, 1)
    omega0, c = jnp.asarray(0.5), jnp.asarray(DAMPING)
    _, (gU, gw, gc) = _value_and_grad(U, omega0, c, integrator, constrained)
    assert gU.shape == (GRAD_STEPS, k, 1)

    eps = 1e-4

    def loss(U=U, omega0=omega0, c=c):
        return float(_value_and_grad(U, omega0, c, integrator, constrained)[0])

    fd_U = np.zeros(U.shape)
    for idx in np.ndindex(*U.shape):
        fd_U[idx] = (loss(U=U.at[idx].add(eps)) - loss(U=U.at[idx].add(-eps))) / (2 * eps)
    fd_w = (loss(omega0=omega0 + eps) - loss(omega0=omega0 - eps)) / (2 * eps)
    fd_c = (loss(c=c + eps) - loss(c=c - eps)) / (2 * eps)

    gU = np.asarray(gU)
    assert min(np.max(np.abs(gU)), abs(float(gw)), abs(float(gc))) > 1e-3  # all of them matter
    assert np.max(np.abs(gU - fd_U)) <= 1e-6 * np.max(np.abs(gU)), (gU - fd_U)
    assert abs(float(gw) - fd_w) <= 1e-6 * abs(float(gw)), (float(gw), fd_w)
    assert abs(float(gc) - fd_c) <= 1e-6 * abs(float(gc)), (float(gc), fd_c)


# --------------------------------------------------------------------------------------------
# 6. Bad input
# --------------------------------------------------------------------------------------------


class WrongShapeForce(vj.ForcedSystem, vj.systems.Pendulum):
    def force(self, t, q, v, u):
        return jnp.zeros(2, v.dtype)


_BAD = dict(q0=jnp.array([THETA0]), v0=jnp.array([0.0]), dt=0.1, n_steps=4)


def test_missing_controls():
    with pytest.raises(ValueError, match=r"DrivenPendulum declares control_dim = 1.*controls="):
        vj.simulate(DrivenPendulum(), vj.VPRK.gauss(2), **_BAD)


def test_controls_for_a_system_without_control():
    with pytest.raises(ValueError, match=r"VariableMassPendulum has no control input"):
        vj.simulate(VariableMassPendulum(), vj.VPRK.gauss(2), controls=jnp.zeros((4, 1)),
                    **_BAD)
    with pytest.raises(ValueError, match=r"no control input"):
        vj.simulate(vj.systems.Pendulum(), vj.VPRK.gauss(2), controls=control, **_BAD)


@pytest.mark.parametrize("shape", [(5, 1), (4, 3, 1), (4, 2), (4, 2, 2), (4,)])
def test_wrong_control_shape(shape):
    with pytest.raises(ValueError, match=r"controls has shape") as info:
        vj.simulate(DrivenPendulum(), vj.VPRK.gauss(2), controls=jnp.zeros(shape), **_BAD)
    message = str(info.value)
    for part in ("n_steps = 4", "2 force nodes", "control_dim = 1", str(shape)):
        assert part in message, message


def test_control_function_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"control function returned shape \(2,\).*\(1,\)"):
        vj.simulate(DrivenPendulum(), vj.VPRK.gauss(2), controls=lambda t: jnp.stack([t, t]),
                    **_BAD)


def test_force_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"WrongShapeForce\.force\(t, q, v, u\) returned "
                                         r"\(2,\).*shaped like q, \(1,\)"):
        vj.simulate(WrongShapeForce(), vj.VPRK.gauss(2), **_BAD)


# --------------------------------------------------------------------------------------------
# 7. Damping dissipates
# --------------------------------------------------------------------------------------------


def test_damping_dissipates():
    """``u = 0``, no drive, ``c > 0``: the energy decreases at every one of 200 steps
    (``h = 0.05``); with ``c = 0`` it is conserved to the method's accuracy, so not monotone."""
    n, h = 200, 0.05
    integrator = vj.VPRK.gauss(2)
    energies = {}
    for c in (DAMPING, 0.0):
        system = DrivenPendulum(c=c, drive=0.0)
        Q, P = advance(system, integrator, [THETA0], [0.0], n, "stage", t_final=n * h,
                       scale=0.0)
        energies[c] = np.asarray(jax.vmap(system.energy)(jnp.asarray(Q), jnp.asarray(P)))  # v = p
    damped, free = energies[DAMPING], energies[0.0]
    assert np.all(np.diff(damped) < 0), np.flatnonzero(np.diff(damped) >= 0)
    assert damped[0] - damped[-1] > 1.0  # most of the 9.81 (1 - cos 1) = 4.5 above the bottom
    assert np.max(np.abs(free - free[0])) < 1e-3
    assert np.any(np.diff(free) > 0) and np.any(np.diff(free) < 0)
