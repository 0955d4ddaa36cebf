"""Nonholonomic partitioned Runge--Kutta methods (Martín de Diego & Sato Martín de Almagro
(2022), eq. (14)) and the nonholonomic helpers of :mod:`vijax.constraints`.

Reference solutions: scipy's DOP853 (rtol = atol = 1e-13) on the index-1 ODE
``q' = v, v' = a(t, q, v)`` with the multiplier eliminated
(:func:`vijax.constraints.nonholonomic_acceleration`, every derivative by autodiff); ``λ`` of
the reference is :func:`vijax.constraints.nonholonomic_multiplier` at the reference state.

Measured global orders on the nonholonomic particle of §7.1 (``T = 2``; ``q0 = (0, 1, 0)``,
``v0 = (1, 1/2, 1)`` for s = 2..4, ``q0 = (1, 1/2, 0)``, ``v0 = (1/2, 1, 1/4)`` for s = 5),
slopes of the Euclidean error norms in (q, p, λ), expected (2s-2, 2s-2, s or s-1):

====  ===================  ======================  ==========
 s    h                    measured (q, p, λ)      expected
====  ===================  ======================  ==========
 2    0.1, 0.05, 0.025     2.00, 2.00, 2.01        2, 2, 2
 3    0.2, 0.1, 0.05       4.02, 4.01, 1.93        4, 4, 2
 4    1/8, 1/12, 1/16      6.01, 6.01, 4.21        6, 6, 4
 5    1/4, 1/5, 1/6        7.92, 8.04, 4.10        8, 8, 4
====  ===================  ======================  ==========

The errors (e.g. s = 2, h = 0.1: 2.026e-3, 1.416e-3, 1.832e-3) agree to four digits with an
independent prototype of the paper's experiment.  With λ0 = 0 the q, p slopes fall to 2.02,
2.00 (s = 3) and 4.07, 4.06 (s = 4) and the λ error stays at 0.35 for every h.

Compile-bound: each (system, method) pair compiles one stepping loop with a dynamic trip
count, reused for every step size.  On the shared 2-core machine (load about 4.5): 60 s by
default with a warm compilation cache, 112 s cold (74 s of CPU); ``-m slow`` (the chaotic
ensemble's h^(2 order) scaling, the reversible adjoint, float32, the docs
example and the remaining stage counts) about 55 s.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import vijax as vj

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py

T = 2.0
PARTICLE = vj.systems.NonholonomicParticle
ALT_Q0, ALT_V0 = jnp.array([1.0, 0.5, 0.0]), jnp.array([0.5, 1.0, 0.25])


# --------------------------------------------------------------------------------------------
# Systems and helpers
# --------------------------------------------------------------------------------------------
class DampedParticle(vj.ForcedSystem, vj.systems.NonholonomicParticle):
    """The particle with linear damping ``F = -c v``."""

    c: float = 0.3

    def force(self, t, q, v, u):
        return -self.c * v


class PulsingParticle(vj.TimeDependentSystem, vj.systems.NonholonomicParticle):
    """The particle in a pulsating potential ``k (1 + sin 2t / 2) (x² + y²) / 2``."""

    def potential(self, q):
        return 0.5 * self.k * (1.0 + 0.5 * jnp.sin(2.0 * self.time)) * (q[0] ** 2 + q[1] ** 2)


class QuarticParticle(vj.NonholonomicSystem):
    """A non-quadratic Lagrangian ``|v|²/2 + ε|v|⁴/4 - (x² + y²)/2`` with the nonlinear
    constraint ``v_z - y v_x + 0.3 v_y² = 0``: the inverse Legendre map is not linear, so the
    stage velocities ``v^i`` are unknowns of the step."""

    eps: float = 0.2
    constraint_form = "nonlinear"

    def lagrangian(self, q, v):
        return 0.5 * v @ v + 0.25 * self.eps * (v @ v) ** 2 - 0.5 * (q[0] ** 2 + q[1] ** 2)

    def nonholonomic(self, q, v):
        return jnp.atleast_1d(v[2] - q[1] * v[0] + 0.3 * v[1] ** 2)


QUARTIC_Q0, QUARTIC_V0 = jnp.array([0.0, 1.0, 0.0]), jnp.array([1.0, 0.5, 0.925])


def reference(system, q0, v0, t_final=T):
    """``(q, p, λ)`` at ``t_final`` by DOP853 on the index-1 ODE."""
    acc = jax.jit(lambda t, q, v: vj.constraints.nonholonomic_acceleration(system, q, v, t)[0])

    def rhs(t, y):
        return np.concatenate([y[3:], np.asarray(acc(t, jnp.asarray(y[:3]), jnp.asarray(y[3:])))])

    r = solve_ivp(rhs, (0.0, t_final), np.concatenate([q0, v0]), method="DOP853", rtol=1e-13,
                  atol=1e-13)
    q, v = jnp.asarray(r.y[:3, -1]), jnp.asarray(r.y[3:, -1])
    t = jnp.asarray(t_final)
    p = system.at(t).momentum(q, v)
    lam = vj.constraints.nonholonomic_multiplier(system, q, v, t)
    return np.asarray(q), np.asarray(p), np.asarray(lam)


@eqx.filter_jit
def _run(integ, system, state, h, n):
    """``n`` steps of size ``h`` from ``state`` (dynamic ``n``: one compilation for all)."""
    def body(_, carry):
        st, ok = carry
        st, stats = integ.step(system, st, h)
        return st, ok & stats.converged

    return jax.lax.fori_loop(0, n, body, (state, jnp.asarray(True)))


def errors(integ, system, q0, v0, steps, ref, lam0=None):
    """``(hs, err q, err p, err λ)`` at ``T`` for each step count."""
    state0 = integ.init(system, 0.0, q0, v0, lam0=lam0)
    hs, out = [], []
    for n in steps:
        st, ok = _run(integ, system, state0, jnp.asarray(T / n), jnp.asarray(n))
        assert bool(ok), (integ.name, n)
        hs.append(T / n)
        out.append([np.linalg.norm(np.asarray(x) - r) for x, r in zip((st.q, st.p, st.lam), ref)])
    return np.array(hs), np.array(out).T


def slopes(hs, errs):
    from helpers import fitted_order

    return [fitted_order(hs, e) for e in errs]


def expected_orders(s):
    return (2 * s - 2, 2 * s - 2, s if s % 2 == 0 else s - 1)


@pytest.fixture(scope="module")
def particle_refs():
    system = PARTICLE()
    return {"default": reference(system, *PARTICLE.initial_conditions()),
            "alt": reference(system, ALT_Q0, ALT_V0)}


# --------------------------------------------------------------------------------------------
# The multiplier helper
# --------------------------------------------------------------------------------------------
def test_multiplier_matches_the_particle_closed_form():
    """§7.1: λ = (m v_x v_y - k x y) / (1 + y²) (hand-derived here, autodiff in the helper),
    also with damping (the damping terms cancel on Φ = 0) and for m, k ≠ 1."""
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((4, 3)))
    w = jnp.asarray(rng.standard_normal((4, 3)))

    @eqx.filter_jit
    def both(system, q, w):
        v = system.project_velocity(q, w)
        lam = vj.constraints.nonholonomic_multiplier(system, q, v)[0]
        return lam, (system.m * v[0] * v[1] - system.k * q[0] * q[1]) / (1 + q[1] ** 2)

    for system in (PARTICLE(m=1.0, k=1.0), PARTICLE(m=1.7, k=0.6), DampedParticle(c=0.8)):
        system = jax.tree_util.tree_map(jnp.asarray, system)   # one compilation per class
        lam, want = jax.vmap(lambda a, b: both(system, a, b))(q, w)
        np.testing.assert_allclose(lam, want, rtol=1e-13)
    q0, v0 = PARTICLE.initial_conditions()
    np.testing.assert_allclose(vj.constraints.nonholonomic_multiplier(PARTICLE(), q0, v0), [0.25],
                               rtol=1e-15)


def test_acceleration_keeps_the_constraint():
    """d/dt Φ(q, v) = D1Φ v + D2Φ a = 0 along the index-1 field, for a nonlinear constraint
    and a non-quadratic Lagrangian."""
    system = QuarticParticle()
    q, v = QUARTIC_Q0, QUARTIC_V0
    a, _ = vj.constraints.nonholonomic_acceleration(system, q, v)
    dphi = jax.jvp(system.nonholonomic, (q, v), (v, a))[1]
    assert float(jnp.max(jnp.abs(dphi))) <= 1e-14


# --------------------------------------------------------------------------------------------
# Orders (Corollary 5.2.1), §7.1 / Fig. 3
# --------------------------------------------------------------------------------------------
CASES = {2: ("default", (20, 40, 80)), 3: ("default", (10, 20, 40)),
         4: ("default", (16, 24, 32)), 5: ("alt", (8, 10, 12))}


@pytest.mark.parametrize("s", [2, 3, 4, 5])
def test_particle_orders(s, particle_refs):
    which, steps = CASES[s]
    q0, v0 = PARTICLE.initial_conditions() if which == "default" else (ALT_Q0, ALT_V0)
    hs, errs = errors(vj.NonholonomicVPRK.lobatto(s), PARTICLE(), q0, v0, steps,
                      particle_refs[which])
    got = slopes(hs, errs)
    for g, want in zip(got, expected_orders(s)):
        assert abs(g - want) <= 0.3, (s, got, errs)


def test_particle_errors_match_the_published_regression():
    """Lobatto-2 at h = 0.1 (T = 2): errors in (q, p, λ) against DOP853 are 2.026e-3,
    1.416e-3, 1.832e-3 in the independent prototype of the paper's experiment."""
    _, errs = errors(vj.NonholonomicVPRK.lobatto(2), PARTICLE(), *PARTICLE.initial_conditions(),
                     (20,), reference(PARTICLE(), *PARTICLE.initial_conditions()))
    np.testing.assert_allclose(errs[:, 0], [2.026e-3, 1.416e-3, 1.832e-3], rtol=2e-3)


def test_wrong_initial_multiplier_destroys_the_order():
    """λ0 = 0 instead of 1/4: λ stops converging (its error stays O(1) for every h) and the
    q, p orders fall from 4 to the multiplier's for s = 3 (and from 6 to 4 for s = 4) -- the
    reason init uses nonholonomic_multiplier."""
    system = PARTICLE()
    q0, v0 = PARTICLE.initial_conditions()
    ref = reference(system, q0, v0)
    for s, steps in ((3, (10, 20, 40)), (4, (10, 20, 40))):
        integ = vj.NonholonomicVPRK.lobatto(s)
        with pytest.warns(UserWarning, match="by 2.500e-01"):
            hs, errs = errors(integ, system, q0, v0, steps, ref, lam0=jnp.zeros(1))
        got = slopes(hs, errs[:2])
        assert max(got) <= 2 * s - 2 - 1.5, (s, got, errs)
        assert errs[2, -1] >= 0.5 * errs[2, 0], (s, errs[2])   # λ does not converge
        assert errs[2, -1] >= 1e-2


def test_lobatto2_is_nonholonomic_shake():
    """The s = 2 member equals the explicit form (constant M, affine Φ = A(q) v + a(q)):
    p_{1/2} = p_k + h/2 (-∇U(q_k) + A(q_k)^T λ_k), q_{k+1} = q_k + h M^-1 p_{1/2},
    λ_{k+1} = -2/h C^-1 [A M^-1 (p_{1/2} - h/2 ∇U(q_{k+1})) + a](q_{k+1}),
    p_{k+1} = p_{1/2} + h/2 (-∇U(q_{k+1}) + A(q_{k+1})^T λ_{k+1}), to 1e-14 over 40 steps."""
    system = PARTICLE(m=1.3, k=0.8)
    q0, v0 = PARTICLE.initial_conditions()
    h, n = 0.05, 40
    grad_u = jax.grad(system.potential)
    minv = jnp.eye(3) / system.m
    zero = jnp.zeros(3)

    def shake(carry, _):
        q, p, lam = carry
        A0 = system.constraint_matrix(q, zero)
        ph = p + 0.5 * h * (-grad_u(q) + A0.T @ lam)
        q1 = q + h * minv @ ph
        A1 = system.constraint_matrix(q1, zero)
        a1 = system.nonholonomic(q1, zero)
        C = A1 @ minv @ A1.T
        lam1 = -2.0 / h * jnp.linalg.solve(C, A1 @ minv @ (ph - 0.5 * h * grad_u(q1)) + a1)
        p1 = ph + 0.5 * h * (-grad_u(q1) + A1.T @ lam1)
        return (q1, p1, lam1), (q1, p1, lam1)

    lam0 = vj.constraints.nonholonomic_multiplier(system, q0, v0)
    _, (qs, ps, lams) = jax.lax.scan(shake, (q0, system.m * v0, lam0), None, length=n)
    sol = vj.simulate(system, vj.NonholonomicVPRK.lobatto(2), q0=q0, v0=v0, dt=h, n_steps=n)
    np.testing.assert_allclose(sol.q[1:], qs, rtol=0, atol=1e-14)
    np.testing.assert_allclose(sol.p[1:], ps, rtol=0, atol=1e-14)
    np.testing.assert_allclose(sol.states.lam[1:], lams, rtol=0, atol=1e-13)


# --------------------------------------------------------------------------------------------
# Constraints at every node and every stage; simulate
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s", [pytest.param(2, marks=pytest.mark.slow), 3,
                               pytest.param(5, marks=pytest.mark.slow)])
def test_constraint_at_every_node_and_stage(s):
    system = PARTICLE()
    q0, v0 = PARTICLE.initial_conditions()
    integ = vj.NonholonomicVPRK.lobatto(s)
    h = 0.1
    sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=h, n_steps=30)
    assert sol.states.lam.shape == (31, 1)
    assert bool(sol.stats.all_converged)
    nodes = jax.vmap(system.nonholonomic)(sol.q, sol.v)
    assert float(jnp.max(jnp.abs(nodes))) <= 1e-12
    prev = jax.tree_util.tree_map(lambda x: x[:-1], sol.states)
    new = jax.tree_util.tree_map(lambda x: x[1:], sol.states)
    Q, ps, vs, stages = eqx.filter_jit(lambda prev, new: (
        *(out := jax.vmap(lambda a, b: integ.stage_values(system, a, b, h))(prev, new)),
        jax.vmap(jax.vmap(system.nonholonomic))(out[0], out[2])))(prev, new)
    assert float(jnp.max(jnp.abs(stages))) <= 1e-12
    # the last stage is the node; p^i are the momenta of v^i
    np.testing.assert_allclose(Q[:, -1], sol.q[1:], atol=1e-15)
    np.testing.assert_allclose(vs[:, -1], sol.v[1:], atol=1e-14)
    np.testing.assert_allclose(ps, system.m * vs, atol=1e-14)


@pytest.mark.parametrize("s", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_nonlinear_constraint_and_non_quadratic_lagrangian(s):
    """Orders (2, 2, 2) / (4, 4, 2) with Φ nonlinear in v and L quartic in v (the stage
    velocities v^i join the unknowns); Φ at every node and stage to 1e-13."""
    system = QuarticParticle()
    ref = reference(system, QUARTIC_Q0, QUARTIC_V0)
    integ = vj.NonholonomicVPRK.lobatto(s)
    got = slopes(*errors(integ, system, QUARTIC_Q0, QUARTIC_V0, (10, 20, 40), ref))
    for g, want in zip(got, expected_orders(s)):
        assert abs(g - want) <= 0.3, (s, got)
    h = jnp.asarray(0.1)
    st0 = integ.init(system, 0.0, QUARTIC_Q0, QUARTIC_V0)
    st1, _ = _run(integ, system, st0, h, jnp.asarray(1))
    Q, _, vs = eqx.filter_jit(integ.stage_values)(system, st0, st1, h)
    assert float(jnp.max(jnp.abs(system.nonholonomic(st1.q, st1.v)))) <= 1e-13
    assert float(jnp.max(jnp.abs(jax.vmap(system.nonholonomic)(Q, vs)))) <= 1e-13


def test_time_dependent_lagrangian_keeps_the_order():
    """A pulsating potential (TimeDependentSystem): every derivative of L at t_k + c_i h;
    orders (4, 4, 2) for s = 3."""
    system = PulsingParticle()
    q0, v0 = PARTICLE.initial_conditions()
    ref = reference(system, q0, v0)
    got = slopes(*errors(vj.NonholonomicVPRK.lobatto(3), system, q0, v0, (10, 20, 40), ref))
    for g, want in zip(got, expected_orders(3)):
        assert abs(g - want) <= 0.3, got


@pytest.mark.parametrize("s", [pytest.param(2, marks=pytest.mark.slow), 3,
                               pytest.param(4, marks=pytest.mark.slow)])
def test_symmetric_step(s):
    """The Lobatto pairs give a symmetric method: a step with -h undoes a step with h in
    (q, p, λ) to round-off (the trait ``symmetric`` that simulate's reversible adjoint uses)."""
    system = PARTICLE()
    q0, v0 = ALT_Q0, ALT_V0
    integ = vj.NonholonomicVPRK.lobatto(s)
    assert integ.symmetric and not integ.symplectic
    step = eqx.filter_jit(lambda st, h: integ.step(system, st, h)[0])
    st0 = integ.init(system, 0.0, q0, v0)
    st1 = step(st0, jnp.asarray(0.2))
    st2 = step(st1, jnp.asarray(-0.2))
    for a, b in ((st2.q, st0.q), (st2.p, st0.p), (st2.lam, st0.lam)):
        np.testing.assert_allclose(a, b, atol=1e-13)
    assert float(jnp.max(jnp.abs(st1.q - st0.q))) > 0.1


def test_newton_matrix_stays_conditioned_as_h_goes_to_zero():
    """Unknowns V^i and impulses h Λ^i: the condition number of the step's Jacobian does not
    grow as h -> 0 (chaotic system of §7.3, s = 3, h = 1e-1 .. 1e-5)."""
    from jax.flatten_util import ravel_pytree
    system = vj.systems.ChaoticNonholonomic()
    q0, v0 = (x[3] for x in system.initial_conditions(8))
    integ = vj.NonholonomicVPRK.lobatto(3)
    state = integ.init(system, 0.0, q0, v0)

    @jax.jit
    def jacobian(h):
        x0, unravel = ravel_pytree(integ._predictor(system, state, h))
        f = lambda x: ravel_pytree(integ.stage_equations(system, state, h, unravel(x))[0])[0]
        return jax.jacfwd(f)(x0)

    conds = [np.linalg.cond(np.asarray(jacobian(jnp.asarray(h)))) for h in (1e-1, 1e-3, 1e-5)]
    assert max(conds) <= 1.5 * min(conds) and max(conds) < 100, conds


def _unicycle_data():
    system = vj.systems.Unicycle()
    return (system,) + tuple(system.initial())


@pytest.mark.parametrize("case", ["particle", "quartic", "unicycle"])
def test_fixed_point_preconditioner_inverts_the_jacobian_to_order_h(case):
    """The default solver's preconditioner (velocity Hessians, constraint matrices and their
    configuration derivatives at the predicted stages) inverts the stage equations' Jacobian
    up to the dropped terms of order h: ``|P J - I|`` (2-norm, s = 3, first step) at
    h = 0.1, 0.05, 0.025 measured 1.4e-2, 3.7e-3, 9.3e-4 (slope 2.0: the particle's force
    terms are O(h^2)) on the particle, 2.1e-2, 1.1e-2, 5.7e-3 (slope 0.92) on a non-quadratic
    Lagrangian with a nonlinear constraint (stage velocities as unknowns) and 0.10, 0.051,
    0.026 (slope 1.0: the retraction's tangent maps) on the unicycle (SE(2), Cayley).  A
    wrong block (a sign, a transposed tableau) leaves a defect of order 1."""
    from jax.flatten_util import ravel_pytree

    from vijax.integrators._prk_core import nonholonomic_precond
    if case == "unicycle":
        system, q0, v0 = _unicycle_data()
        integ = vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley())
        predictor = lambda st, h: integ._predictor(system, st, h, "nonholonomic")  # noqa: E731
    else:
        system, q0, v0 = ((PARTICLE(), ALT_Q0, ALT_V0) if case == "particle" else
                          (QuarticParticle(), QUARTIC_Q0, QUARTIC_V0))
        integ = vj.NonholonomicVPRK.lobatto(3)
        predictor = lambda st, h: integ._predictor(system, st, h)  # noqa: E731
    state = integ.init(system, 0.0, q0, v0)

    @jax.jit
    def defect(h):
        x0, unravel = ravel_pytree(predictor(state, h))
        f = lambda x: ravel_pytree(integ.stage_equations(system, state, h, unravel(x))[0])[0]
        J = jax.jacfwd(f)(x0)
        r0, unravel_r = ravel_pytree(integ.stage_equations(system, state, h, unravel(x0))[0])
        group, retraction = ((system.group, vj.lie.Cayley()) if case == "unicycle" else
                             (vj.lie.Rn(3), vj.lie.Exp()))
        pc = nonholonomic_precond(integ.tableau, group, retraction, system, state, h,
                                  unravel(x0)[0], not system.quadratic_in_velocity)
        P = jax.jacfwd(lambda r: ravel_pytree(pc(unravel_r(r)))[0])(r0)
        return jnp.linalg.norm(P @ J - jnp.eye(J.shape[0]), 2)

    hs = np.array([0.1, 0.05, 0.025])
    d = np.array([float(defect(jnp.asarray(h))) for h in hs])
    slope = vj.diagnostics.estimate_order(hs, d).order
    assert slope >= 0.9 and d[-1] < 0.1, (d, slope)


@pytest.mark.parametrize("case", ["chaotic", "unicycle"])
def test_default_fixed_point_and_simplified_newton_agree_with_newton(case):
    """The default solver (the preconditioned fixed point) and SimplifiedNewton (Jacobian
    once per step) find the steps of full Newton: the chaotic system of §7.3 (s = 3,
    h = 0.05) and the unicycle (SE(2), Cayley, s = 3, h = 0.1), 200 steps."""
    if case == "chaotic":
        system = vj.systems.ChaoticNonholonomic()
        q0, v0 = (x[5] for x in system.initial_conditions(8))
        make, dt = vj.NonholonomicVPRK.lobatto, 0.05
    else:
        system, q0, v0 = _unicycle_data()
        make = lambda s, **kw: vj.GroupVPRK.lobatto(s, retraction=vj.lie.Cayley(), **kw)  # noqa: E731
        dt = 0.1
    runs = [vj.simulate(system, make(3, **kw), q0=q0, v0=v0, dt=dt, n_steps=200,
                        save_every=200)
            for kw in ({"solver": vj.solvers.Newton()}, {},
                       {"solver": vj.solvers.SimplifiedNewton()})]
    assert all(bool(r.stats.all_converged) for r in runs)
    for r in runs[1:]:
        np.testing.assert_allclose(r.q, runs[0].q, atol=1e-12)
        np.testing.assert_allclose(r.states.lam, runs[0].states.lam, atol=1e-11)


# --------------------------------------------------------------------------------------------
# Hamiltonian form (eq. (15), Appendix E)
# --------------------------------------------------------------------------------------------
class CurvedParticle(vj.MechanicalSystem, vj.NonholonomicSystem):
    """The particle with a configuration-dependent mass matrix
    ``diag(1 + 0.3 y², 1, 1 + 0.2 x²)``: ``∂²H/∂p²`` is not the identity, so the one-forms
    ``♭_H(D2Ψ)`` of the Hamiltonian form differ from ``D2Ψ``."""

    k: float = 1.0
    constraint_form = "linear"

    def mass_matrix(self, q):
        return jnp.diag(jnp.stack([1.0 + 0.3 * q[1] ** 2, jnp.ones((), q.dtype),
                                   1.0 + 0.2 * q[0] ** 2]))

    def potential(self, q):
        return 0.5 * self.k * (q[0] ** 2 + q[1] ** 2)

    def nonholonomic(self, q, v):
        return jnp.atleast_1d(v[2] - q[1] * v[0])


@pytest.mark.parametrize("s", [2, 3])
def test_hamiltonian_form_gives_the_lagrangian_trajectory(s):
    """The Hamiltonian form (derivatives of ``H = E_L∘FL^{-1}`` by autodiff, one-forms
    ``♭_H(D2Ψ) = D2Φ(Q, ∂H/∂p)``; unknowns ``V, P, hΛ``) and the Lagrangian form (eq.
    (14)) are the same method for a hyperregular Lagrangian: equal trajectories to solver
    tolerance on a curved mass matrix, with damping, and with a pulsating potential."""
    q0, v0 = PARTICLE.initial_conditions()
    lag = vj.NonholonomicVPRK.lobatto(s)
    ham = vj.NonholonomicVPRK.lobatto(s, form="hamiltonian")
    assert ham.name == f"NonholonomicVPRK[{lag.tableau.name}, hamiltonian]"
    for system in (CurvedParticle(), DampedParticle(c=0.3), PulsingParticle()):
        st_l, ok_l = _run(lag, system, lag.init(system, 0.0, q0, v0), jnp.asarray(0.1),
                          jnp.asarray(20))
        st_h, ok_h = _run(ham, system, ham.init(system, 0.0, q0, v0), jnp.asarray(0.1),
                          jnp.asarray(20))
        assert bool(ok_l) and bool(ok_h)
        assert float(jnp.max(jnp.abs(st_l.q - q0))) > 0.1       # it moved
        for a, b in ((st_l.q, st_h.q), (st_l.p, st_h.p), (st_l.v, st_h.v),
                     (st_l.lam, st_h.lam)):
            np.testing.assert_allclose(a, b, atol=1e-12, err_msg=type(system).__name__)
        assert float(jnp.max(jnp.abs(system.nonholonomic(st_h.q, st_h.v)))) <= 1e-13


def test_unknown_form_is_refused():
    with pytest.raises(ValueError, match="'lagrangian'.*'hamiltonian'"):
        vj.NonholonomicVPRK.lobatto(3, form="symplectic")


# --------------------------------------------------------------------------------------------
# Forcing
# --------------------------------------------------------------------------------------------
def test_damped_particle_keeps_the_order_and_loses_energy():
    """F = -c v through the stage forces: orders (4, 4, 2) for s = 3 against the forced
    index-1 ODE; the energy decreases at every one of 200 steps."""
    system = DampedParticle(c=0.3)
    q0, v0 = PARTICLE.initial_conditions()
    ref = reference(system, q0, v0)
    integ = vj.NonholonomicVPRK.lobatto(3)
    got = slopes(*errors(integ, system, q0, v0, (10, 20, 40), ref))
    for g, want in zip(got, expected_orders(3)):
        assert abs(g - want) <= 0.3, got
    sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=0.05, n_steps=200)
    energy = np.asarray(jax.vmap(system.energy)(sol.q, sol.v))
    assert np.all(np.diff(energy) < 0)
    assert energy[-1] < 0.5 * energy[0]


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------
def _consistent(x):
    """(system, q0, v0) from x = (x0, y0, vx, vy, k): v_z = y v_x."""
    q0 = jnp.stack([x[0], x[1], jnp.zeros((), x.dtype)])
    v0 = jnp.stack([x[2], x[3], x[1] * x[2]])
    return PARTICLE(k=x[4]), q0, v0


def _loss(x, adjoint="store_all"):
    system, q0, v0 = _consistent(x)
    sol = vj.simulate(system, vj.NonholonomicVPRK.lobatto(3), q0=q0, v0=v0, dt=0.1,
                      n_steps=10, save_every=10, adjoint=adjoint)
    w = jnp.array([1.0, -0.5, 0.7])
    return sol.q[-1] @ w + sol.p[-1] @ w[::-1] + 0.3 * sol.states.lam[-1, 0]


def test_gradients_match_central_differences():
    x = jnp.array([0.2, 0.9, 1.0, 0.4, 1.3])
    grad = np.asarray(jax.grad(_loss)(x))
    eps = 1e-5
    fd = np.array([(float(_loss(x + eps * e)) - float(_loss(x - eps * e))) / (2 * eps)
                   for e in np.eye(5)])
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-9)
    assert np.all(np.abs(fd) > 1e-3)


@pytest.mark.slow
def test_reversible_adjoint_agrees():
    """The method is symmetric: the reversible adjoint (states rebuilt by stepping back)
    gives the gradient of the stored-states adjoint."""
    x = jnp.array([0.2, 0.9, 1.0, 0.4, 1.3])
    rev = np.asarray(jax.grad(lambda y: _loss(y, "reversible"))(x))
    np.testing.assert_allclose(rev, np.asarray(jax.grad(_loss)(x)), rtol=1e-9)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
def test_inconsistent_velocity_is_refused_naming_project_velocity():
    system = PARTICLE()
    q0, _ = PARTICLE.initial_conditions()
    bad = jnp.array([1.0, 0.5, 0.3])
    integ = vj.NonholonomicVPRK.lobatto(2)
    with pytest.raises(vj.constraints.InconsistentInitialData,
                       match=r"by 7\.00e-01.*system.project_velocity\(q0, v0\)"):
        vj.simulate(system, integ, q0=q0, v0=bad, dt=0.1, n_steps=2)
    with pytest.raises(eqx.EquinoxRuntimeError, match="project_velocity"):
        jax.block_until_ready(eqx.filter_jit(
            lambda v: vj.simulate(system, integ, q0=q0, v0=v, dt=0.1, n_steps=2).q)(bad))
    sol = vj.simulate(system, integ, q0=q0, v0=bad, dt=0.1, n_steps=2, project=True)
    assert abs(float(system.nonholonomic(sol.q[0], sol.v[0])[0])) <= 1e-15


class DoubledParticle(vj.systems.NonholonomicParticle):
    def nonholonomic(self, q, v):
        phi = v[2] - q[1] * v[0]
        return jnp.stack([phi, 2.0 * phi])


class IndefiniteParticle(vj.NonholonomicSystem):
    """A regular but indefinite velocity Hessian diag(1, -1, 1) with D2Φ = (1, 1, 0): full
    rank, but C = D2Φ H^-1 D2Φ^T = 0 (incompatible)."""

    quadratic_in_velocity = True

    def lagrangian(self, q, v):
        return 0.5 * (v[0] ** 2 - v[1] ** 2 + v[2] ** 2) - 0.5 * q @ q

    def nonholonomic(self, q, v):
        return jnp.atleast_1d(v[0] + v[1])


def test_dependent_constraint_rows_are_refused_naming_the_rank():
    q0, v0 = PARTICLE.initial_conditions()
    integ = vj.NonholonomicVPRK.lobatto(2)
    with pytest.raises(ValueError,
                       match=r"constraint matrix D2Φ of DoubledParticle.* rank 1 < m = 2"):
        vj.simulate(DoubledParticle(), integ, q0=q0, v0=v0, dt=0.1, n_steps=2)
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"rank 1 < m = 2"):
        jax.block_until_ready(eqx.filter_jit(
            lambda q: vj.simulate(DoubledParticle(), integ, q0=q, v0=v0, dt=0.1,
                                  n_steps=2).q)(q0))
    with pytest.raises(ValueError, match=r"compatibility matrix .* rank 0 < m = 1"):
        vj.simulate(IndefiniteParticle(), integ, q0=q0, v0=jnp.array([1.0, -1.0, 0.0]), dt=0.1,
                    n_steps=2)


def test_inconsistent_explicit_multiplier_warns_with_the_residual():
    system = PARTICLE()
    q0, v0 = PARTICLE.initial_conditions()
    integ = vj.NonholonomicVPRK.lobatto(3)
    with pytest.warns(UserWarning, match=r"by 1\.000e-01 \(residual"):
        state = integ.init(system, 0.0, q0, v0, lam0=jnp.array([0.35]))
    assert float(state.lam[0]) == 0.35
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        integ.init(system, 0.0, q0, v0, lam0=jnp.array([0.25]))   # the exact one: silent


def test_tableau_without_the_hypotheses_is_refused():
    with pytest.raises(ValueError, match="H1: a_1j = 0.*NonholonomicVPRK.lobatto"):
        vj.NonholonomicVPRK(vj.tableaus.gauss(2))
    with pytest.raises(ValueError, match="H3: a_sj = b_j"):
        vj.NonholonomicVPRK(vj.tableaus.gauss(2))
    with pytest.raises(ValueError, match=r"violates H1: a_1j = 0, H2'"):   # Radau IIA: H3 holds
        vj.NonholonomicVPRK(vj.tableaus.radau_iia(2))


def test_system_mismatch_names_the_right_methods():
    q0, v0 = PARTICLE.initial_conditions()
    with pytest.raises(vj.IncompatibleSystemError, match="NonholonomicVPRK"):
        vj.simulate(PARTICLE(), vj.VPRK.gauss(2), q0=q0, v0=v0, dt=0.1, n_steps=2)
    with pytest.raises(vj.IncompatibleSystemError,
                       match=r"NonholonomicVPRK\[.*\] needs a NonholonomicSystem"):
        vj.simulate(vj.systems.HarmonicOscillator(), vj.NonholonomicVPRK.lobatto(2),
                    q0=jnp.array([1.0]), v0=jnp.array([0.0]), dt=0.1, n_steps=2)


@pytest.mark.slow
def test_float32_run_stays_float32():
    q0, v0 = (x.astype(jnp.float32) for x in PARTICLE.initial_conditions())
    sol = vj.simulate(PARTICLE(), vj.NonholonomicVPRK.lobatto(3), q0=q0, v0=v0, dt=0.05,
                      n_steps=40)
    assert sol.q.dtype == sol.states.lam.dtype == jnp.float32
    assert bool(sol.stats.all_converged)
    ref = reference(PARTICLE(), *PARTICLE.initial_conditions())
    assert np.max(np.abs(np.asarray(sol.q[-1], np.float64) - ref[0])) <= 1e-5


@pytest.mark.slow
def test_docs_example_runs():
    """The example of docs/nonholonomic.md (executed here)."""
    import pathlib
    import re
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "nonholonomic.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 1
    scope = {}
    exec(blocks[0], scope)
    np.testing.assert_allclose(scope["sol"].states.lam[0], [0.25], rtol=1e-15)
    assert scope["sol"].q.shape == (41, 3)


# --------------------------------------------------------------------------------------------
# The chaotic system of §7.3
# --------------------------------------------------------------------------------------------
def test_chaotic_system_data():
    """The potential against the paper's m = 3 expression
    U = (|q|² + q5²q6² + q2²q5² + q3²q6² + q4²q7²)/2 (1-based); the paper's ensemble and the
    random samples lie on E = 3.06 and on the constraint."""
    system = vj.systems.ChaoticNonholonomic()
    q = jnp.asarray(np.random.default_rng(0).standard_normal(7))
    want = 0.5 * (q @ q + q[4] ** 2 * q[5] ** 2 + q[1] ** 2 * q[4] ** 2 + q[2] ** 2 * q[5] ** 2
                  + q[3] ** 2 * q[6] ** 2)
    np.testing.assert_allclose(system.potential(q), want, rtol=1e-15)
    q0, v0 = system.initial_conditions(8)
    q1, v1 = jax.jit(system.sample_energy_sheet, static_argnums=1)(jax.random.PRNGKey(0), 16)
    assert q1.shape == v1.shape == (16, 7)
    check = jax.jit(lambda q, v: (jax.vmap(system.energy)(q, v),
                                  jax.vmap(system.nonholonomic)(q, v)))
    for qs, vs in ((q0, v0), (q1, v1)):
        energy, phi = check(qs, vs)
        np.testing.assert_allclose(energy, 3.06, rtol=1e-14)
        assert float(jnp.max(jnp.abs(phi))) <= 1e-14
    assert float(jnp.std(v1[:, 0])) > 0.05          # the samples differ
    with pytest.raises(ValueError, match="pairs = m >= 2"):
        vj.systems.ChaoticNonholonomic(pairs=1)


@pytest.mark.slow
def test_chaotic_energy_error_scales_with_twice_the_order():
    """§7.3 / Fig. 6: the mean squared energy error over the paper's ensemble (J = 8) divided
    by h^(2 order) is the same for two step sizes (within 20 %): Lobatto-2 at t = 10
    (h = 0.1, 0.05), Lobatto-3 at t = 5 (h = 0.2, 0.1)."""
    system = vj.systems.ChaoticNonholonomic()
    q0, v0 = system.initial_conditions(8)
    for s, t_end, hs in ((2, 10.0, (0.1, 0.05)), (3, 5.0, (0.2, 0.1))):
        integ = vj.NonholonomicVPRK.lobatto(s)
        scaled = []
        for h in hs:
            n = int(round(t_end / h))
            ens = vj.simulate_ensemble(system, integ, q0=q0, v0=v0, dt=h, n_steps=n,
                                       save_every=n)
            e = jax.vmap(jax.vmap(system.energy))(ens.q, ens.v)[:, -1]
            scaled.append(float(jnp.mean((e - 3.06) ** 2)) / h ** (2 * integ.order))
        assert abs(scaled[0] / scaled[1] - 1.0) <= 0.2, (s, scaled)


@pytest.mark.slow
def test_energy_variance_example_quick(tmp_path):
    """examples/chaotic_energy_variance.py at reduced size (64 members, t = 1; four
    compilations, hence slow): it writes its JSON and figure."""
    import importlib.util
    import json
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "chaotic_energy_variance.py"
    spec = importlib.util.spec_from_file_location("chaotic_energy_variance", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with jax.numpy_rank_promotion("allow"):   # the example is user code, written loosely
        result = example.main(["--members", "64", "--t-end", "1", "--out", str(tmp_path)])
    assert (tmp_path / "chaotic_energy_variance.png").exists()
    saved = json.loads((tmp_path / "chaotic_energy_variance.json").read_text())
    assert saved["members"] == 64 and set(saved["runs"]) == set(result["runs"])
    for run in result["runs"].values():
        mu = np.asarray(run["mu"])
        assert mu[0] < 1e-20 and np.all(np.isfinite(mu)) and mu[-1] > 0


def test_energy_variance_is_the_mean_squared_energy_error():
    """``vj.diagnostics.energy_variance`` against the mean over the members of the squared
    energy error, computed by hand from an ensemble sampled on the energy sheet."""
    system = vj.systems.ChaoticNonholonomic()
    q0, v0 = system.sample_energy_sheet(jax.random.PRNGKey(1), 4)
    ens = vj.simulate_ensemble(system, vj.NonholonomicVPRK.lobatto(2), q0=q0, v0=v0, dt=0.1,
                               n_steps=4, save_every=2)
    e = np.array([[float(system.energy(ens.q[j, k], ens.v[j, k])) for k in range(3)]
                  for j in range(4)])
    np.testing.assert_allclose(e[:, 0], 3.06, rtol=1e-13)
    mu = np.asarray(vj.diagnostics.energy_variance(system, ens))
    np.testing.assert_allclose(mu, np.mean((e - e[:, :1]) ** 2, axis=0), rtol=1e-10, atol=1e-30)


@pytest.mark.parametrize("s", [2, 3, 4])
def test_predictor_misses_remove_a_power_of_h_each(s):
    """The warm start of the stage values, corrected by the predictor's misses of the last
    steps (``_prk_core.corrected``, carried by the nonholonomic mode): its error against the
    step's root is ``O(h^(s-1))`` uncorrected, ``O(h^s)`` with the last miss and
    ``O(h^(s+1))`` with the trend of the last two (measured on the particle at t = 0.4,
    h = 0.04 ... 0.01: s = 2 1.00 / 2.02 / 3.05, s = 3 2.00 / 2.99 / 4.01, s = 4 3.00 / 4.01 /
    5.07; the impulses gain two orders for s = 3, 3.03 -> 4.93, none for even s, whose
    multipliers' misses are not smooth in time).  On the CVT gearbox (h = 0.1) the
    corrected start changes no root beyond the solver's tolerance and saves updates."""
    from helpers import assert_miss_orders

    system = vj.systems.NonholonomicParticle()
    q0 = jnp.array([0.2, 0.3, 0.0])
    v0 = jnp.array([0.4, 0.5, 0.3 * 0.4])   # on v_z = y v_x
    integrator = vj.NonholonomicVPRK.lobatto(s)

    def case(h):
        state = integrator.init(system, 0.0, q0, v0)
        step = jax.jit(lambda st: integrator.step(system, st, h)[0])
        for _ in range(int(round(0.4 / h))):
            state = step(state)
        return integrator._predictor(system, state, h)[0], state.misses, step(state).stages

    assert_miss_orders(np.array([0.04, 0.02, 0.01]), case, (s - 1, s, s + 1))

    if s != 3:
        return
    from helpers import with_and_without_misses

    cvt = vj.systems.CVTGearbox()
    a, b, updates_a, updates_b = with_and_without_misses(integrator, cvt, *cvt.initial(), 0.1,
                                                         200)
    np.testing.assert_allclose(a.q, b.q, rtol=0, atol=1e-11)
    np.testing.assert_allclose(a.p, b.p, rtol=0, atol=1e-11)
    assert updates_a < 0.95 * updates_b, (updates_a, updates_b)
