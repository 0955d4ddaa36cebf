"""The variational PRK over a retraction on a Lie group (:class:`vijax.GroupVPRK`).

Martín de Diego & Sato Martín de Almagro (2022), §6 (Thm 6.1, the holonomic extension of §6.3,
the nonholonomic one of §6.4 and App. F).  Independent references:

* on ``R^n`` the method is the vector-space family: the same trajectories as
  :class:`vijax.VPRK`, :class:`vijax.HolonomicVPRK` and :class:`vijax.NonholonomicVPRK` on the
  same Lagrangian, to round-off;
* the unicycle with a spring on ``SE(2)`` (their §7.4) is linear in rotating coordinates, so
  :meth:`vijax.systems.Unicycle.exact` gives its exact solution by a matrix exponential (the
  multiplier too); measured orders against it, and the paper's prototype errors;
* the ball on a turntable (their §7.5) has four first integrals in closed form;
* the free rigid body conserves its spatial angular momentum exactly (Noether), which the
  variational method inherits.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import PinnedBody, SpringPendulum, drift_measures

import vijax as vj

# XLA optimisation passes off (tests/conftest.py): compiling is this module's cost
pytestmark = pytest.mark.fast_compile

# --------------------------------------------------------------------------------------------
# The vector-space systems as Lie-group systems on R^n
# --------------------------------------------------------------------------------------------


class _OnRn(vj.LieGroupSystem):
    """A vector-space system written on the abelian group ``R^n``."""

    base: vj.LagrangianSystem
    n: int = eqx.field(static=True)

    @property
    def group(self):
        return vj.lie.Rn(self.n)

    def lagrangian(self, g, xi):
        return self.base.lagrangian(g, xi)


class _HolonomicOnRn(_OnRn, vj.HolonomicSystem):
    def holonomic(self, g):
        return self.base.holonomic(g)


class _NonholonomicOnRn(_OnRn, vj.NonholonomicSystem):
    def nonholonomic(self, g, xi):
        return self.base.nonholonomic(g, xi)


class _Quartic(vj.LagrangianSystem):
    """A nonlinear Lagrangian with a configuration-dependent mass."""

    def lagrangian(self, q, v):
        return (0.5 * jnp.sum(v ** 2) * (1.0 + 0.1 * q[0] ** 2) - 0.25 * jnp.sum(q ** 4)
                + 0.1 * q[0] * v[1])


def _run(integ, system, q0, v0, h, n):
    state = integ.init(system, 0.0, q0, v0)
    step = jax.jit(lambda s: integ.step(system, s, h))
    for _ in range(n):
        state, stats = step(state)
        assert bool(stats.converged)
    return state


@pytest.mark.parametrize("tableau", [vj.tableaus.gauss(2), vj.tableaus.lobatto_iiia_iiib(3)],
                         ids=lambda t: t.name)
def test_on_rn_it_is_the_vector_space_vprk(tableau):
    base = _Quartic()
    q0, v0 = jnp.array([0.7, -0.2]), jnp.array([0.3, 0.9])
    a = _run(vj.GroupVPRK(tableau), _OnRn(base, 2), q0, v0, 0.1, 15)
    b = _run(vj.VPRK(tableau, solver=vj.solvers.Newton()), base, q0, v0, 0.1, 15)
    np.testing.assert_allclose(a.q, b.q, rtol=0, atol=1e-13)
    np.testing.assert_allclose(a.p, b.p, rtol=0, atol=1e-13)


@pytest.mark.parametrize("s", [2, 3])
def test_on_rn_it_is_the_holonomic_vprk(s):
    base = SpringPendulum(k=3.0)
    th = 0.8
    q0, v0 = jnp.array([np.sin(th), -np.cos(th)]), 0.5 * jnp.array([np.cos(th), np.sin(th)])
    a = _run(vj.GroupVPRK.lobatto(s), _HolonomicOnRn(base, 2), q0, v0, 0.05, 10)
    b = _run(vj.HolonomicVPRK.lobatto(s), base, q0, v0, 0.05, 10)
    np.testing.assert_allclose(a.q, b.q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.p, b.p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.lam, b.lam, rtol=0, atol=1e-10)


@pytest.mark.parametrize("s", [2, 3, 4])
def test_on_rn_it_is_the_nonholonomic_vprk(s):
    base = vj.systems.NonholonomicParticle()
    q0 = jnp.array([1.0, 0.5, 0.0])
    v0 = jnp.array([0.5, 1.0, 0.5 * 0.5])       # v_z = y v_x
    a = _run(vj.GroupVPRK.lobatto(s), _NonholonomicOnRn(base, 3), q0, v0, 0.1, 10)
    b = _run(vj.NonholonomicVPRK.lobatto(s), base, q0, v0, 0.1, 10)
    np.testing.assert_allclose(a.q, b.q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.p, b.p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.lam, b.lam, rtol=0, atol=1e-10)
    np.testing.assert_allclose(a.v, b.v, rtol=0, atol=1e-12)


def test_on_rn_the_hamiltonian_form_is_the_vector_space_one():
    """App. G on ``R^n`` is App. E: the Hamiltonian forms agree as the Lagrangian ones do."""
    base = vj.systems.NonholonomicParticle()
    q0 = jnp.array([1.0, 0.5, 0.0])
    v0 = jnp.array([0.5, 1.0, 0.5 * 0.5])
    a = _run(vj.GroupVPRK.lobatto(3, form="hamiltonian"), _NonholonomicOnRn(base, 3), q0, v0,
             0.1, 10)
    b = _run(vj.NonholonomicVPRK.lobatto(3, form="hamiltonian"), base, q0, v0, 0.1, 10)
    for x, y in ((a.q, b.q), (a.p, b.p), (a.v, b.v)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.lam, b.lam, rtol=0, atol=1e-10)


# --------------------------------------------------------------------------------------------
# The unicycle on SE(2) (their §7.4): orders against the exact solution
# --------------------------------------------------------------------------------------------

# Errors at T = 2 of the paper's independent prototype (Cayley retraction; Frobenius norm of
# the SE(2) matrix, Euclidean norms of μ and λ), h = 0.1, 0.05, 0.025.
_UNICYCLE_PROTOTYPE = {
    2: [(6.245e-3, 2.297e-3, 2.730e-3), (1.551e-3, 5.679e-4, 6.869e-4), (3.870e-4, 1.416e-4, 1.720e-4)],
    3: [(2.520e-6, 1.757e-6, 1.824e-3), (1.582e-7, 1.107e-7, 4.543e-4), (9.913e-9, 6.948e-9, 1.134e-4)],
    4: [(8.672e-10, 3.245e-10, 2.356e-6), (1.356e-11, 5.088e-12, 1.479e-7), (2.105e-13, 8.810e-14, 9.261e-09)],
}
_STEPS = (0.1, 0.05, 0.025)


class _WithoutDD(vj.GroupVPRK):
    """The method with the (dd^L τ)* term dropped from its stage equations."""

    def stage_equations(self, system, state, h, X, force=None, dd_term=True):
        return super().stage_equations(system, state, h, X, force, dd_term=False)


def _run_scan(integ, system, g0, xi0, h, n):
    """``n`` steps of ``h`` from ``(g0, ξ0)``: the final state (one compilation per method and
    system; ``h`` and ``n`` are traced)."""
    st, conv = _final(integ, system, g0, xi0, jnp.asarray(h), jnp.asarray(n))
    assert bool(conv)
    return st


@eqx.filter_jit
def _final(integ, system, g0, xi0, h, n):
    def body(_, carry):
        st, ok = carry
        st, stats = integ.step(system, st, h)
        return st, ok & stats.converged

    return jax.lax.fori_loop(0, n, body, (integ.init(system, 0.0, g0, xi0), jnp.asarray(True)))


def _unicycle_errors(integ, T=2.0, steps=_STEPS):
    system = vj.systems.Unicycle()
    g0, xi0 = system.initial()
    gT, xiT, lamT = system.exact(T, g0, xi0)
    muT = system.momentum(gT, xiT)
    out = []
    for h in steps:
        st = _run_scan(integ, system, g0, xi0, h, int(round(T / h)))
        out.append((float(jnp.linalg.norm(st.q - gT)), float(jnp.linalg.norm(st.p - muT)),
                    float(jnp.linalg.norm(st.lam - lamT))))
    return np.array(out)


def _slopes(steps, errs):
    x = np.log(np.asarray(steps))
    return [float(np.polyfit(x, np.log(errs[:, k]), 1)[0]) for k in range(errs.shape[1])]


def test_unicycle_exact_solution_matches_the_published_values():
    # the prototype's reference at T = 2 (DOP853 on the coordinate equations)
    system = vj.systems.Unicycle()
    g, xi, lam = system.exact(2.0, *system.initial())
    np.testing.assert_allclose([g[0, 2], g[1, 2], jnp.arctan2(g[1, 0], g[0, 0])],
                               [0.992253494216, -0.472364876139, 2.0], atol=1e-11)
    np.testing.assert_allclose([xi[0], xi[1], xi[2], lam],
                               [-0.205680400148, 0.0, 1.0, -0.911360800297], atol=1e-11)
    # and it solves the constrained Euler-Poincaré equations: derivative against the flow
    g0, xi0 = system.initial()
    dxi = jax.jacfwd(lambda t: system.exact(t, g0, xi0)[1])(0.7)
    g7, xi7, lam7 = system.exact(0.7, g0, xi0)
    np.testing.assert_allclose(dxi, vj.integrators.lie.euler_poincare(system, jnp.asarray(0.7),
                                                                       g7, xi7), atol=1e-12)
    np.testing.assert_allclose(lam7, vj.integrators.lie.nonholonomic_multiplier(
        system, jnp.asarray(0.7), g7, xi7)[0], atol=1e-12)


@pytest.mark.parametrize("s", [2, 3, 4])
def test_unicycle_orders_and_prototype_errors(s):
    errs = _unicycle_errors(vj.GroupVPRK.lobatto(s, retraction=vj.lie.Cayley()))
    expected = (2 * s - 2, 2 * s - 2, s if s % 2 == 0 else s - 1)
    slopes = _slopes(_STEPS, errs)
    np.testing.assert_allclose(slopes, expected, atol=0.3)
    # the independent prototype's errors, to the digits it published (the s = 4 errors at
    # h = 0.025 sit at 1e-13, where round-off takes the second digit: atol 2e-14)
    np.testing.assert_allclose(errs, np.array(_UNICYCLE_PROTOTYPE[s]), rtol=5e-3, atol=2e-14)


@pytest.mark.slow
def test_unicycle_orders_with_the_exponential_retraction():
    errs = _unicycle_errors(vj.GroupVPRK.lobatto(3), steps=(0.1, 0.05))
    np.testing.assert_allclose(_slopes((0.1, 0.05), errs), (4, 4, 2), atol=0.3)


def test_hamiltonian_form_on_the_group_app_g():
    """Their App. G (the nonholonomic method in the reduced Hamiltonian ``𝔥(g, μ)``, stage
    momenta as unknowns; ``H^i = (d^Lτ)^{-1} D2𝔥``, where the paper prints ``(d^Lτ)*``): for
    the hyperregular unicycle it is the Lagrangian method of App. F to solver tolerance, so
    it has the same orders (4, 4, 2) and the same errors as the prototype, s = 3."""
    system = vj.systems.Unicycle()
    g0, xi0 = system.initial()
    ham = vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley(), form="hamiltonian")
    lag = vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley())
    a = _run_scan(ham, system, g0, xi0, 0.1, 20)
    b = _run_scan(lag, system, g0, xi0, 0.1, 20)
    for x, y in ((a.q, b.q), (a.p, b.p), (a.v, b.v), (a.lam, b.lam)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-12)
    errs = _unicycle_errors(ham)
    np.testing.assert_allclose(_slopes(_STEPS, errs), (4, 4, 2), atol=0.3)
    np.testing.assert_allclose(errs, np.array(_UNICYCLE_PROTOTYPE[3]), rtol=5e-3)


class _GeneralUnicycle(vj.systems.Unicycle):
    """The unicycle declared without ``quadratic_in_velocity``: the stage velocities
    ``η^2..η^s`` of the constraint rows join the unknowns (Legendre rows) instead of being
    one linear solve."""

    quadratic_in_velocity = False


def test_non_quadratic_lagrangians_solve_for_the_stage_velocities():
    system = _GeneralUnicycle()
    g0, xi0 = system.initial()
    integ = vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley())
    X0 = integ._predictor(system, integ.init(system, 0.0, g0, xi0), 0.1, "nonholonomic")
    assert X0[2] is not None and X0[2].shape == (2, 3)    # η^2, η^3 are unknowns
    a = _run_scan(integ, system, g0, xi0, 0.1, 20)
    b = _run_scan(integ, vj.systems.Unicycle(), g0, xi0, 0.1, 20)
    for x, y in ((a.q, b.q), (a.p, b.p), (a.v, b.v), (a.lam, b.lam)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-12)


def test_dropping_the_second_order_retraction_term_breaks_the_order():
    """The (dd^L τ)* term of eq. (30) comes from varying d^Lτ_Ξ in the discrete action; without
    it the stage momenta are wrong at O(h) and the method is first order, whatever s."""
    errs = _unicycle_errors(_WithoutDD(vj.tableaus.lobatto_iiia_iiib(3),
                                       retraction=vj.lie.Cayley()), steps=(0.05, 0.025))
    slopes = _slopes((0.05, 0.025), errs)
    assert max(slopes[:2]) < 1.3, slopes
    assert errs[-1, 0] > 1e-3   # the full method: 9.9e-9 at h = 0.025


# --------------------------------------------------------------------------------------------
# The ball on a turntable (their §7.5): four first integrals
# --------------------------------------------------------------------------------------------
def test_ball_on_turntable_keeps_its_first_integrals():
    """a = b = c, Lobatto-3, Cayley, h = 0.1, T = 100 (their Fig. 8): I1, I2, I3 to solver
    tolerance (< 1e-10; measured 8e-15), the moving energy bounded without drift (measured
    1.9e-9; the paper's prototype 2e-9), the constraint at every node and R orthogonal."""
    system = vj.systems.BallOnTurntable()
    g0, xi0 = system.initial()
    # the consistent multiplier: the centre's velocity turns at the rate aΩ/(1 + a)
    k = system.a * system.Omega / (1 + system.a)
    np.testing.assert_allclose(
        vj.integrators.lie.nonholonomic_multiplier(system, jnp.asarray(0.0), g0, xi0),
        [-k * xi0[4], k * xi0[3]], atol=1e-15)
    sol = vj.simulate(system, vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley()), q0=g0,
                      v0=xi0, dt=0.1, n_steps=1000)
    integrals = np.asarray(jax.vmap(system.integrals)(sol.q, sol.v))
    err = np.abs(integrals - integrals[0])
    assert np.max(err[:, :3]) < 1e-10, np.max(err[:, :3], axis=0)
    e_mov = err[:, 3]
    assert 1e-12 < np.max(e_mov) < 1e-8
    # no drift: the slope fitted to block means statistically zero (measured t = -0.39; the
    # signal is noise-like, so the accumulated share, 0.07 here, is within its own error)
    assert abs(drift_measures(sol.t, integrals[:, 3] - integrals[0, 3])[0]) < 3
    assert np.max(np.abs(jax.vmap(system.nonholonomic)(sol.q, sol.v))) < 1e-12
    R = np.asarray(sol.q[0])
    assert np.max(np.abs(np.einsum("kji,kjl->kil", R, R) - np.eye(3))) < 1e-13
    # the centre's velocity: v(t) = Rot(k t) v0 exactly in the continuous flow
    t = np.asarray(sol.t)
    c, s = np.cos(k * t), np.sin(k * t)
    v_exact = np.stack([c * xi0[3] - s * xi0[4], s * xi0[3] + c * xi0[4]], axis=1)
    assert np.max(np.abs(np.asarray(sol.v)[:, 3:] - v_exact)) < 1e-4


# --------------------------------------------------------------------------------------------
# Rigid bodies on SO(3)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("integ", [vj.GroupVPRK.gauss(2), vj.GroupVPRK.lobatto(3),
                                   vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley())],
                         ids=["gauss2-exp", "lobatto3-exp", "lobatto3-cayley"])
def test_free_rigid_body_keeps_its_spatial_momentum(integ):
    """Discrete Noether: the discrete Lagrangian is invariant under g -> R g, so the spatial
    angular momentum g I Ω is conserved to round-off, while the energy is not (it oscillates
    at O(h^p)); the rotation stays orthogonal without any projection."""
    system = vj.systems.FreeRigidBody()
    g0 = vj.lie.SO3().exp(jnp.array([0.4, 0.1, -0.3]))
    xi0 = jnp.array([0.3, -0.1, 0.5]) / jnp.array([1.0, 2.0, 3.0]) * 3
    sol = vj.simulate(system, integ, q0=g0, v0=xi0, dt=0.1, n_steps=300)
    m = np.asarray(jax.vmap(system.spatial_momentum)(sol.q, sol.v))
    assert np.max(np.abs(m - m[0])) < 2e-14
    e = np.asarray(jax.vmap(system.energy)(sol.q, sol.v))
    assert 1e-13 < np.max(np.abs(e - e[0])) < 1e-3
    R = np.asarray(sol.q)
    assert np.max(np.abs(np.einsum("kji,kjl->kil", R, R) - np.eye(3))) < 1e-13


@pytest.mark.parametrize("case", ["heavy_top-gauss2-exp", "heavy_top-lobatto3-cayley",
                                  "quadrotor-gauss2-exp", "quartic_on_rn-gauss2-exp",
                                  "quartic_on_rn-lobatto3-exp"])
def test_free_preconditioner_inverts_the_jacobian_to_second_order(case):
    """The fixed point's preconditioner carries the terms of order h of the stage equations'
    Jacobian: on a non-commutative group the coadjoint terms (expanded to first order in h),
    and, for a momentum that depends on the configuration (here a velocity coupling and a
    configuration-dependent mass on ``R^n``), ``∂D2ℓ/∂g``.  ``P J - I = O(h²)`` against the
    Jacobian of the residual by ``jax.jacfwd``, where the inverse velocity Hessian alone
    leaves ``O(h)``; at h = 0.05 the heavy top's Gauss(2) step then takes about half the
    updates (measured 4.9 against 9.6)."""
    name, tableau, _ = case.split("-")
    integ = (vj.GroupVPRK.gauss(2) if tableau == "gauss2" else
             vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley()))
    if name == "heavy_top":
        system = vj.systems.HeavyTop(inertia=(1.0, 2.0, 3.0))
        g0 = vj.lie.SO3().exp(jnp.array([0.4, -0.3, 0.2]))
        xi0 = jnp.array([0.3, -0.8, 1.0])
    elif name == "quadrotor":
        system = vj.systems.Quadrotor(inertia=(1.0, 1.5, 2.0))
        g0 = vj.lie.SE3().exp(jnp.array([0.1, -0.2, 0.3, 0.4, -0.3, 0.2]))
        xi0 = jnp.array([0.5, -0.2, 0.3, 0.3, -0.8, 1.0])
    else:
        system = _OnRn(base=_Quartic(), n=2)
        g0, xi0 = jnp.array([0.8, -0.5]), jnp.array([1.2, -0.9])
    state = integ.init(system, 0.0, g0, xi0)
    s, n = integ.stages, xi0.shape[0]
    core = vj.integrators._prk_core

    @jax.jit
    def defects(h):
        H0 = jnp.broadcast_to(state.v, (s, n))
        J = jax.jacfwd(lambda H: integ.stage_equations(
            system, state, h, (H, jnp.zeros((0,)), None))[0])(H0).reshape(s * n, s * n)
        minv = system.inverse_velocity_hessian(state.q, state.v)
        coupling = core.momentum_coupling(system, system.group, state.q, state.v)
        assert (coupling is None) == (name != "quartic_on_rn")
        assert coupling is None or (coupling.N is not None and coupling.Mdot is not None)
        P = core.free_precond(integ.tableau, system.group, minv, state.p, state.v, h, coupling)
        PJ = jax.vmap(lambda col: P(col.reshape(s, n)).reshape(-1), 1, 1)(J)
        eye = jnp.eye(s * n)
        return (jnp.max(jnp.abs(PJ - eye)),
                jnp.max(jnp.abs(jnp.kron(jnp.eye(s), minv) @ J - eye)))

    steps = np.array([0.04, 0.02, 0.01])
    new, old = np.array([[float(d) for d in defects(h)] for h in steps]).T
    np.testing.assert_allclose(np.diff(np.log(new)) / np.diff(np.log(steps)), 2, atol=0.15)
    np.testing.assert_allclose(np.diff(np.log(old)) / np.diff(np.log(steps)), 1, atol=0.15)
    assert np.all(new < 0.2 * old)


@pytest.mark.parametrize("s", [2, 3])
def test_nonholonomic_preconditioner_inverts_the_jacobian_to_second_order(s):
    """The nonholonomic preconditioner on a non-commutative group carries the coadjoint terms
    of order h too (the stage rows' velocity and impulse columns, the stage momenta the
    constraint rows read): on the unicycle (SE(2), Cayley) ``P J - I = O(h²)`` against
    ``jax.jacfwd`` of the stage equations in all unknowns (it was ``O(h)``: 2.0e-2 and 2.7e-2
    at h = 0.04), and a Lobatto step at h = 0.1 takes 6-8 updates instead of 11."""
    from jax.flatten_util import ravel_pytree

    system = vj.systems.Unicycle()
    g0 = vj.systems.Unicycle.element(1.0, 0.2, 0.3)
    xi0 = jnp.array([0.5, 0.0, 0.8])
    integ = vj.GroupVPRK.lobatto(s, retraction=vj.lie.Cayley())
    state = integ.init(system, 0.0, g0, xi0)

    @jax.jit
    def defect(h):
        X0 = integ._predictor(system, state, h, "nonholonomic")
        x0, unravel = ravel_pytree(X0)
        rows = lambda X: integ.stage_equations(system, state, h, X)[0]  # noqa: E731
        J = jax.jacfwd(lambda x: ravel_pytree(rows(unravel(x)))[0])(x0)
        _, unravel_rows = ravel_pytree(rows(X0))
        P = vj.integrators._prk_core.nonholonomic_precond(
            integ.tableau, system.group, integ.retraction, system, state, h, X0[0], False)
        PJ = jax.vmap(lambda col: ravel_pytree(P(unravel_rows(col)))[0], 1, 1)(J)
        return jnp.max(jnp.abs(PJ - jnp.eye(J.shape[0])))

    steps = np.array([0.04, 0.02, 0.01])
    d = np.array([float(defect(h)) for h in steps])
    np.testing.assert_allclose(np.diff(np.log(d)) / np.diff(np.log(steps)), 2, atol=0.15)
    assert d[0] < 3e-3


@pytest.mark.slow
def test_heavy_top_orders():
    """Orders 4 (Gauss-2) and 4 (Lobatto-3) on the heavy top against a Gauss-3 reference at
    a small step, in g (spectral norm) and μ."""
    system = vj.systems.HeavyTop(gravity=1.0)
    g0 = vj.lie.SO3().exp(jnp.array([0.5, 0.0, 0.0]))
    xi0 = jnp.array([0.3, -0.2, 2.0])
    T = 1.0
    ref = _run_scan(vj.GroupVPRK.gauss(3), system, g0, xi0, T / 80, 80)
    for integ, expected in ((vj.GroupVPRK.gauss(2), 4), (vj.GroupVPRK.lobatto(3), 4)):
        errs = []
        steps = (T / 5, T / 10, T / 20)
        for h in steps:
            st = _run_scan(integ, system, g0, xi0, h, int(round(T / h)))
            errs.append((float(jnp.linalg.norm(st.q - ref.q, 2)),
                         float(jnp.linalg.norm(st.p - ref.p))))
        np.testing.assert_allclose(_slopes(steps, np.array(errs)), expected, atol=0.3)


@pytest.mark.slow
def test_heavy_top_stays_on_the_group_for_a_million_steps():
    """g is only ever updated by g τ(ξ): after 10^6 steps ‖gᵀg - I‖ and |det g - 1| stay at
    round-off (no projection), and the vertical spatial momentum (the symmetry about the
    vertical) is conserved."""
    system = vj.systems.HeavyTop(gravity=1.0)
    g0 = vj.lie.SO3().exp(jnp.array([0.5, 0.0, 0.0]))
    xi0 = jnp.array([0.3, -0.2, 2.0])
    sol = vj.simulate(system, vj.GroupVPRK.midpoint(retraction=vj.lie.Cayley()), q0=g0,
                      v0=xi0, dt=0.01, n_steps=1_000_000, save_every=100_000)
    R = np.asarray(sol.q)
    drift = np.max(np.abs(np.einsum("kji,kjl->kil", R, R) - np.eye(3)), axis=(1, 2))
    assert drift[-1] <= 1e-12, drift
    assert np.max(np.abs(np.linalg.det(R) - 1)) <= 1e-12
    m3 = np.asarray(jax.vmap(system.spatial_momentum)(sol.q, sol.v))[:, 2]
    assert np.max(np.abs(m3 - m3[0])) < 1e-10


# --------------------------------------------------------------------------------------------
# Forces and controls (Lagrange-d'Alembert, left-trivialised: body torques)
# --------------------------------------------------------------------------------------------
class _TorquedBody(vj.ForcedSystem, vj.systems.FreeRigidBody):
    """A free rigid body with a body-frame damping torque -c Ω and a control torque u about
    the first body axis."""

    c: float = 0.3
    control_dim = 1

    def force(self, t, g, xi, u):
        return -self.c * xi + u[0] * jnp.eye(3, dtype=xi.dtype)[0]


def test_body_torques_keep_the_order_and_the_energy_balance():
    """dE/dt = <F, Ω>: with damping only the energy decays; with a smooth control sampled at
    the force nodes the final state converges at the method's order (Gauss-2: 4) against a
    Gauss-3 reference."""
    system = _TorquedBody()
    g0 = vj.lie.SO3().exp(jnp.array([0.4, 0.1, -0.3]))
    xi0 = jnp.array([0.9, -0.1, 0.5])
    T = 2.0

    def u(t):
        return jnp.atleast_1d(0.5 * jnp.sin(2.0 * t))

    def run(integ, n, save_every=1):
        return vj.simulate(system, integ, q0=g0, v0=xi0, dt=T / n, n_steps=n, controls=u,
                           save_every=save_every)

    gauss2 = vj.GroupVPRK.gauss(2, retraction=vj.lie.Cayley())
    ref = run(vj.GroupVPRK.gauss(3, retraction=vj.lie.Cayley()), 160, 160)
    errs = []
    for n in (10, 20, 40):
        s = run(gauss2, n, n)
        errs.append((float(jnp.linalg.norm(s.q[-1] - ref.q[-1], 2)),
                     float(jnp.linalg.norm(s.p[-1] - ref.p[-1]))))
    np.testing.assert_allclose(_slopes((T / 10, T / 20, T / 40), np.array(errs)), 4, atol=0.3)
    sol = run(gauss2, 20)
    # the energy balance, integrated along the reference: E(T) - E(0) = ∫ <F, Ω> dt
    dense = run(vj.GroupVPRK.gauss(3, retraction=vj.lie.Cayley()), 2000)
    power = jax.vmap(lambda t, g, x: jnp.vdot(system.force(t, g, x, u(t)), x))(
        dense.t, dense.q, dense.v)
    work = float(jnp.sum(0.5 * (power[1:] + power[:-1])) * T / 2000)
    e = jax.vmap(system.energy)(sol.q, sol.v)
    e_ref = jax.vmap(system.energy)(dense.q, dense.v)
    np.testing.assert_allclose(float(e_ref[-1] - e_ref[0]), work, rtol=1e-5)
    assert abs(float(e[-1] - e[0]) - work) < 1e-3 * abs(work)


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------
def test_gradient_wrt_initial_velocity_and_inertia_matches_central_differences():
    g0 = vj.lie.SO3().exp(jnp.array([0.5, 0.0, 0.0]))

    def loss(x):
        system = vj.systems.HeavyTop(inertia=x[3:], gravity=1.0)
        sol = vj.simulate(system, vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley()), q0=g0,
                          v0=x[:3], dt=0.1, n_steps=10)
        return jnp.sum(sol.q[-1][0] * jnp.array([1.0, -0.5, 0.3])) + jnp.vdot(sol.p[-1], x[:3])

    x = jnp.array([0.3, -0.2, 2.0, 1.0, 2.0, 3.0])
    grad = np.asarray(jax.jit(jax.grad(loss))(x))
    eps = 1e-6
    fd = np.array([(float(loss(x + eps * e)) - float(loss(x - eps * e))) / (2 * eps)
                   for e in np.eye(6)])
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-7 * np.max(np.abs(fd)))


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
class _AffineLine(vj.lie.AbstractMatrixLieGroup):
    """The affine group of the line (no Cayley map declared)."""

    @property
    def dim(self):
        return 2

    def identity(self, dtype=None):
        return jnp.eye(2, dtype=dtype)

    def project(self, g):
        return g.at[1].set(jnp.array([0.0, 1.0], g.dtype))

    def distance(self, g):
        return jnp.max(jnp.abs(g[1] - jnp.array([0.0, 1.0], g.dtype)))

    def hat(self, xi):
        return jnp.array([[xi[0], xi[1]], [0.0, 0.0]], dtype=xi.dtype)

    def vee(self, X):
        return X[0]

    def exp(self, xi):
        return jax.scipy.linalg.expm(self.hat(xi))

    def log(self, g):
        raise NotImplementedError


class _OnAffineLine(vj.LieGroupSystem):
    @property
    def group(self):
        return _AffineLine()

    def lagrangian(self, g, xi):
        return 0.5 * jnp.sum(xi ** 2)


def test_bad_input_names_the_fix():
    top = vj.systems.HeavyTop()
    g0, xi0 = jnp.eye(3), jnp.array([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"project\(q0\)"):
        vj.simulate(top, vj.GroupVPRK.midpoint(), q0=1.01 * g0, v0=xi0, dt=0.1, n_steps=2)
    sol = vj.simulate(top, vj.GroupVPRK.midpoint(), q0=1.01 * g0, v0=xi0, dt=0.1, n_steps=2,
                      project=True)
    np.testing.assert_allclose(sol.q[0], g0, atol=1e-15)
    with pytest.raises(ValueError, match="dimension 3"):
        vj.simulate(top, vj.GroupVPRK.midpoint(), q0=g0, v0=xi0[:2], dt=0.1, n_steps=2)
    with pytest.raises(ValueError, match="element of SO3"):
        vj.simulate(top, vj.GroupVPRK.midpoint(), q0=jnp.eye(4), v0=xi0, dt=0.1, n_steps=2)
    with pytest.raises(TypeError, match=r"vijax\.lie\.Exp\(\)"):
        vj.simulate(_OnAffineLine(), vj.GroupVPRK.midpoint(retraction=vj.lie.Cayley()),
                    q0=jnp.eye(2), v0=jnp.array([0.1, 0.2]), dt=0.1, n_steps=2)
    uni = vj.systems.Unicycle()
    g0, xi0 = uni.initial()
    with pytest.raises(vj.constraints.InconsistentInitialData, match="project_velocity"):
        vj.simulate(uni, vj.GroupVPRK.lobatto(2), q0=g0, v0=xi0 + jnp.array([0.0, 0.1, 0.0]),
                    dt=0.1, n_steps=2)
    with pytest.raises(vj.IncompatibleSystemError, match=r"GroupVPRK\.lobatto"):
        vj.simulate(uni, vj.GroupVPRK.gauss(2), q0=g0, v0=xi0, dt=0.1, n_steps=2)
    with pytest.raises(vj.IncompatibleSystemError, match="GroupVPRK"):
        vj.simulate(uni, vj.VPRK.gauss(2), q0=g0, v0=xi0, dt=0.1, n_steps=2)
    # the Hamiltonian form (App. G) is the nonholonomic one
    with pytest.raises(vj.IncompatibleSystemError, match="form='lagrangian'"):
        vj.simulate(top, vj.GroupVPRK.lobatto(2, form="hamiltonian"), q0=jnp.eye(3), v0=xi0,
                    dt=0.1, n_steps=2)
    with pytest.raises(ValueError, match="'hamiltonian'"):
        vj.GroupVPRK.lobatto(2, form="poisson")
    # inside jit the same checks run in the compiled program
    with pytest.raises(Exception, match=r"project\(q0\)"):
        jax.jit(lambda g: vj.simulate(top, vj.GroupVPRK.midpoint(), q0=g, v0=jnp.array(
            [0.1, 0.2, 0.3]), dt=0.1, n_steps=2).q)(1.01 * jnp.eye(3)).block_until_ready()


# --------------------------------------------------------------------------------------------
# Holonomic constraints on a group: the heavy top as a constrained rigid body on SE(3)
# --------------------------------------------------------------------------------------------
def test_holonomic_constraints_on_se3_give_the_heavy_top():
    """GroupVPRK.lobatto(s) on SE(3) with the pin constraint (their §6.3: stage constraints
    and the tangency condition at the node) converges at order 2s - 2 to the heavy top on SO(3)
    integrated without constraints, its body momentum at 2s - 2 too (against lobatto(4) on the
    pinned body at h = T/160), and keeps Φ and its tangency at round-off.  The node
    multiplier carried in the state (the last stage's Λ^s) converges at order s - 1 only, as
    the raw node multiplier of the vector-space HolonomicVPRK does (test_holonomic.py): it is
    the predictor's start, not a node approximation of the method's order."""
    pinned = PinnedBody()
    m, p = pinned.mass, np.asarray(pinned.pin)
    Ic = np.diag(pinned.inertia)
    Io = Ic + m * (p @ p * np.eye(3) - np.outer(p, p))
    top = vj.systems.HeavyTop(inertia=tuple(np.diag(Io)), mass=m, gravity=pinned.gravity,
                              com=tuple(-p))
    R0 = vj.lie.SO3().exp(jnp.array([0.5, 0.1, 0.0]))
    w0 = jnp.array([0.3, -0.2, 1.5])
    g0 = vj.lie.SE3.from_rotation_translation(R0, -R0 @ jnp.asarray(p))
    xi0 = jnp.concatenate([-jnp.cross(w0, jnp.asarray(p)), w0])
    T = 1.0
    ref = _run_scan(vj.GroupVPRK.gauss(3), top, R0, w0, T / 80, 80)
    fine = _run_scan(vj.GroupVPRK.lobatto(4, retraction=vj.lie.Cayley()), pinned, g0, xi0,
                     T / 160, 160)
    for s in (2, 3):
        integ = vj.GroupVPRK.lobatto(s, retraction=vj.lie.Cayley())
        errs = []
        for n in (10, 20, 40):
            st = _run_scan(integ, pinned, g0, xi0, T / n, n)
            errs.append([float(jnp.linalg.norm(st.q[:3, :3] - ref.q, 2)),
                         float(jnp.linalg.norm(st.p - fine.p)),
                         float(jnp.linalg.norm(st.lam - fine.lam))])
            assert float(jnp.max(jnp.abs(pinned.holonomic(st.q)))) < 1e-13
            J = pinned.group.left_jacobian(pinned.holonomic, st.q)
            assert float(jnp.max(jnp.abs(J @ st.v))) < 1e-13
        np.testing.assert_allclose(_slopes((T / 10, T / 20, T / 40), np.array(errs)),
                                   [2 * s - 2, 2 * s - 2, s - 1], atol=0.3, err_msg=str(errs))
    # and simulate refuses initial data off the constraint
    with pytest.raises(vj.constraints.InconsistentInitialData, match="tangency"):
        vj.simulate(pinned, vj.GroupVPRK.lobatto(2), q0=g0, v0=xi0 + 0.1, dt=0.1, n_steps=1)


def test_quadrotor_hovers_and_keeps_its_energy_balance():
    """On SE(3) with thrust and body torques: the hovering thrust holds it still to round-off;
    under a manoeuvre the energy changes by the work of the wrench (trapezoid rule along the
    run, error O(h²))."""
    quad = vj.systems.Quadrotor()
    g0, xi0 = vj.lie.SE3().identity(jnp.float64), jnp.zeros(6)
    integ = vj.GroupVPRK.gauss(2, retraction=vj.lie.Cayley())
    sol = vj.simulate(quad, integ, q0=g0, v0=xi0, dt=0.01, n_steps=100,
                      controls=lambda t: quad.hover())
    assert float(jnp.max(jnp.abs(sol.q[-1] - g0))) < 1e-14
    u = lambda t: quad.hover() + jnp.array([0.5, 0.01 * jnp.sin(t), 0.0, 0.002])  # noqa: E731
    sol = vj.simulate(quad, integ, q0=g0, v0=xi0, dt=0.01, n_steps=200, controls=u)
    E = jax.vmap(quad.energy)(sol.q, sol.v)
    P = jax.vmap(lambda t, g, x: jnp.vdot(quad.force(t, g, x, u(t)), x))(sol.t, sol.q, sol.v)
    work = float(jnp.sum(0.5 * (P[1:] + P[:-1])) * 0.01)
    assert abs(float(E[-1] - E[0]) - work) < 1e-4 * abs(work)
    assert float(sol.q[-1][2, 3]) > 0.5                    # climbed
    assert float(vj.lie.SE3().distance(sol.q[-1])) < 1e-13


def test_symmetry_trait_matches_the_step():
    """The step with -h inverts the step with h for the midpoint rule only (the trait
    `adjoint="reversible"` relies on); with several stages on SO(3) it does not, even for a
    symmetric tableau."""
    top = vj.systems.HeavyTop(gravity=1.0)
    g0 = vj.lie.SO3().exp(jnp.array([0.5, 0.1, 0.0]))
    xi0 = jnp.array([0.3, -0.2, 2.0])
    @eqx.filter_jit
    def there_and_back(integ):   # one compilation per method, not an eager solve op by op
        st = integ.init(top, 0.0, g0, xi0)
        there, _ = integ.step(top, st, 0.1)
        return integ.step(top, there, -0.1)[0]

    for integ in (vj.GroupVPRK.midpoint(), vj.GroupVPRK.gauss(2, retraction=vj.lie.Cayley())):
        back = there_and_back(integ)
        defect = float(jnp.max(jnp.abs(back.q - g0)))
        assert (defect < 1e-14) == integ.symmetric, (integ.name, defect)
    with pytest.raises(ValueError, match="symmetric"):
        vj.simulate(top, vj.GroupVPRK.gauss(2), q0=g0, v0=xi0, dt=0.1, n_steps=2,
                    adjoint="reversible")


def test_ensembles_of_group_elements():
    """vj.simulate_ensemble takes one group element per member (a (members, 3, 3) array of
    rotations) and chunks them (batch_size, with a remainder): each member equals its own
    simulate run."""
    top = vj.systems.HeavyTop(gravity=1.0)
    integ = vj.GroupVPRK.midpoint(retraction=vj.lie.Cayley())
    g0 = jax.vmap(vj.lie.SO3().exp)(jnp.array([[0.5, 0.0, 0.0], [0.3, 0.1, 0.0],
                                               [0.2, 0.0, 0.1]]))
    xi0 = jnp.array([[0.3, -0.2, 2.0], [0.1, 0.2, 1.0], [0.0, 0.4, -1.0]])
    sol = vj.simulate_ensemble(top, integ, q0=g0, v0=xi0, dt=0.05, n_steps=10, batch_size=2)
    assert sol.q.shape == (3, 11, 3, 3)
    for i in range(3):
        one = vj.simulate(top, integ, q0=g0[i], v0=xi0[i], dt=0.05, n_steps=10)
        np.testing.assert_allclose(sol.q[i], one.q, atol=1e-14)
    with pytest.raises(ValueError, match="one element of SO3 per member"):
        vj.simulate_ensemble(top, integ, q0=g0[0], v0=xi0, dt=0.05, n_steps=10)


def _top_state_and_root(retraction, h):
    """The heavy top (Gauss(2)) at t = 0.4 with step ``h``: ``(integrator, state, H)``, ``H``
    the next step's root in that step's chart, solved from its stage body velocities to
    round-off (``H = dτ^{-1}_{h a H} V``, a contraction of rate ``O(h)``)."""
    top = vj.systems.HeavyTop(inertia=(1.0, 2.0, 3.0), gravity=1.0)
    integrator = vj.GroupVPRK.gauss(2, retraction=retraction)
    state = integrator.init(top, 0.0, vj.lie.SO3().exp(jnp.array([0.3, -0.2, 0.4])),
                            jnp.array([0.3, -0.8, 1.0]))
    step = jax.jit(lambda s: integrator.step(top, s, h)[0])
    for _ in range(int(round(0.4 / h))):
        state = step(state)
    V = step(state).stages
    a, H = jnp.asarray(integrator.tableau.q.a), V
    for _ in range(60):
        H = jax.vmap(lambda x, y: retraction.dtau_inv(top.group, x) @ y)(h * a @ H, V)
    return integrator, state, H


@pytest.mark.parametrize("retraction", [vj.lie.Exp(), vj.lie.Cayley()], ids=["exp", "cayley"])
def test_free_predictor_maps_the_body_velocities_into_the_new_chart(retraction):
    """The warm start of an unconstrained step on SO(3): the previous stage body velocities
    (and the node velocity) extrapolated, then mapped into this step's chart by
    ``H = d^Lτ^{-1}_{h a V} V``.  Against the step's root ``H`` (solved from its body
    velocities to round-off) its error is ``O(h^3)`` for Gauss(2) (measured slopes 3.00 Exp,
    2.99 Cayley; Gauss(3) 2.83, 2.92: the one-pass chart map is third order); the
    extrapolated body velocities taken as ``H`` without the map are ``O(h^2)`` (1.98, 2.00),
    and extrapolating the previous ``H`` across charts cost 0.8--1.7 more updates per step."""
    from vijax.integrators._prk_core import free_group_predictor, through_the_node
    group = vj.lie.SO3()
    hs = np.array([0.04, 0.02, 0.01])
    mapped, unmapped = [], []
    for h in hs:
        integrator, state, H = _top_state_and_root(retraction, h)
        E = through_the_node(integrator.tableau, jnp.float64)
        mapped.append(float(jnp.max(jnp.abs(
            free_group_predictor(integrator.tableau, state, h, group, retraction) - H))))
        unmapped.append(float(jnp.max(jnp.abs(
            E @ jnp.concatenate([state.stages, state.v[None]]) - H))))
    slope = lambda e: np.polyfit(np.log(hs), np.log(e), 1)[0]  # noqa: E731
    assert abs(slope(mapped) - 3.0) < 0.3, mapped
    assert abs(slope(unmapped) - 2.0) < 0.3, unmapped
    assert mapped[-1] < 0.1 * unmapped[-1]


@pytest.mark.parametrize("retraction", [vj.lie.Exp(), vj.lie.Cayley()], ids=["exp", "cayley"])
def test_free_predictor_misses_remove_a_power_of_h_each(retraction):
    """The chart-mapped warm start of an unconstrained step, corrected by the predictor's
    misses of the last steps (``_prk_core.corrected``): on the heavy top with Gauss(2) its
    error against the step's root goes from ``O(h^3)`` to ``O(h^4)`` with the last miss and
    ``O(h^5)`` with the trend of the last two (measured slopes 3.00 / 4.02 / 4.98 Exp,
    2.99 / 4.01 / 4.98 Cayley), and the steps keep their roots with fewer updates (measured
    at h = 0.05: 4.15 -> 3.38 Exp, 4.51 -> 3.73 Cayley per step, the step 0.88x)."""
    from helpers import assert_miss_orders, with_and_without_misses
    from vijax.integrators._prk_core import free_group_predictor

    def case(h):
        integrator, state, H = _top_state_and_root(retraction, h)
        raw = free_group_predictor(integrator.tableau, state, h, vj.lie.SO3(), retraction)
        return raw, state.misses, H

    assert_miss_orders(np.array([0.04, 0.02, 0.01]), case, (3, 4, 5))
    integrator = vj.GroupVPRK.gauss(2, retraction=retraction)
    top = vj.systems.HeavyTop(inertia=(1.0, 2.0, 3.0), gravity=1.0)
    g0 = vj.lie.SO3().exp(jnp.array([0.3, -0.2, 0.4]))
    a, b, updates_a, updates_b = with_and_without_misses(integrator, top, g0,
                                                         jnp.array([0.3, -0.8, 1.0]), 0.05, 200)
    np.testing.assert_allclose(a.q, b.q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.p, b.p, rtol=0, atol=1e-12)
    assert updates_a < 0.9 * updates_b, (updates_a, updates_b)


def test_group_steps_hold_no_wide_products_or_scatters():
    """Matrix groups compose by fusible small products, without a ``dot_general``: under the
    ``vmap`` over the stages, a product of a stack of elements with one shared element is one
    wide matrix product, which XLA:CPU hands to the YNNPACK library (a call costing several
    small products).  And a heavy-top step holds no scatter, although reverse passes run inside
    it (the stage forces are gradients): SO(3)'s ``hat`` is a stack of its entries, not a
    gather, whose transpose is a scatter-add (slower, and a loop holding one is never compiled
    into one kernel)."""
    from helpers import primitives

    for group in (vj.lie.SO3(), vj.lie.SE2(), vj.lie.SE3()):
        g = group.exp(0.1 + 0.1 * jnp.arange(group.dim, dtype=jnp.float64))
        stack = jnp.stack([g, g, g])
        prims = primitives(jax.make_jaxpr(jax.vmap(lambda x: group.compose(g, x)))(stack).jaxpr)
        assert "dot_general" not in prims, type(group).__name__
    top = vj.systems.HeavyTop(inertia=(1.0, 2.0, 3.0), gravity=1.0)
    g0 = vj.lie.SO3().exp(jnp.array([0.3, -0.2, 0.4]))
    for integ in (vj.GroupVPRK.gauss(2), vj.GroupVPRK.lobatto(3, retraction=vj.lie.Cayley())):
        state = integ.init(top, 0.0, g0, jnp.array([0.3, -0.8, 1.0]))
        step = jax.make_jaxpr(lambda s: integ.step(top, s, 0.05)[0])(state).jaxpr
        prims = primitives(step)
        assert "while" in prims and not any(p.startswith("scatter") for p in prims), integ.name
