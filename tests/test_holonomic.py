"""Constrained VPRK (Martín de Diego & Sato Martín de Almagro (2022), eq. (13)) and the
consistent-initial-data helpers.

Reference: the Cartesian pendulum (L = |v|²/2 - y, g = (|q|² - 1)/2,
theta0 = 1 at rest) solved in its angle by DOP853, and the same pendulum with a nonlinear spring
(a nonlinear potential: under uniform gravity the Lagrangian integrand is a polynomial, so
schemes that differ only in its quadrature coincide; the spring tells them apart).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    SpringPendulum,
    assert_no_drift,
    constraint_residuals,
    double_pendulum_3d_initial,
    fitted_order,
    pendulum_initial,
    spring_pendulum_reference,
)

import vijax as vj

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py

T = 2.0
GRAVITY = 1.0  # L = |v|²/2 - y


def cartesian_pendulum(k=0.0):
    """The Cartesian pendulum of this module: unit mass, length and gravity, optional spring."""
    return SpringPendulum(k=k, gravity=GRAVITY)


def angle_reference(k, theta0, t_final):
    ref = spring_pendulum_reference(t_final, k=k, theta0=theta0, gravity=GRAVITY)
    return ref.q, ref.v


def initial(theta0=1.0):
    return pendulum_initial(theta0)


@pytest.fixture(scope="module")
def references():
    out = {}
    for k in (0.0, 5.0):
        system = cartesian_pendulum(k=k)
        q, v = angle_reference(k, 1.0, T)
        lam = np.asarray(vj.constraints.multiplier(system, jnp.asarray(q), jnp.asarray(v)))
        out[k] = (q, v, lam)
    return out


STEPS = {2: [20, 40, 80], 3: [10, 20, 40], 4: [8, 12, 18], 5: [6, 8, 10]}


# s = 4, 5 on the pure-gravity pendulum with -m slow (the spring runs them by default)
@pytest.mark.parametrize("s, k", [
    pytest.param(s, k, id=f"{s}-{name}",
                 marks=[pytest.mark.slow] if s >= 4 and k == 0.0 else [])
    for s in (2, 3, 4, 5) for k, name in ((0.0, "gravity"), (5.0, "spring"))])
def test_constrained_lobatto_orders(s, k, references):
    """Orders 2s - 2 in q, p and lambda (lambda from eq. (70) at the node). The raw node
    multiplier Lambda^s is not a node approximation of that order (measured: order s - 1 on
    the pure-gravity pendulum, erratic with the spring), so lambda is post-processed."""
    system = cartesian_pendulum(k=k)
    q_ref, v_ref, lam_ref = references[k]
    integ = vj.HolonomicVPRK.lobatto(s)
    q0, v0 = initial()
    hs, eq, ep, el = [], [], [], []
    for n in STEPS[s]:
        sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=T / n, n_steps=n, throw=True)
        lam = vj.constraints.multiplier(system, sol.q[-1], sol.v[-1])
        hs.append(T / n)
        eq.append(np.max(np.abs(sol.q[-1] - q_ref)))
        ep.append(np.max(np.abs(sol.p[-1] - v_ref)))
        el.append(np.max(np.abs(lam - lam_ref)))
        # constraint and hidden constraint at every step
        g, hidden = constraint_residuals(system, sol.q, sol.v)
        assert g <= 1e-12
        assert hidden <= 1e-12
    expected = 2 * s - 2
    for errs in (eq, ep, el):
        order = fitted_order(hs, errs)
        assert abs(order - expected) <= 0.3, (s, k, errs, order)


def test_rattle_is_the_s2_preset():
    assert vj.HolonomicVPRK.rattle().name == "RATTLE"
    assert vj.HolonomicVPRK.rattle().order == 2


def test_inconsistent_initial_data_is_refused_with_the_fix_named():
    system = cartesian_pendulum()
    q0, v0 = initial()
    integ = vj.HolonomicVPRK.rattle()
    with pytest.raises(ValueError, match="project_position"):
        vj.simulate(system, integ, q0=1.01 * q0, v0=v0, dt=0.1, n_steps=2)
    with pytest.raises(ValueError, match="project_velocity"):
        vj.simulate(system, integ, q0=q0, v0=jnp.array([1.0, 1.0]), dt=0.1, n_steps=2)
    sol = vj.simulate(system, integ, q0=1.01 * q0, v0=jnp.array([1.0, 1.0]), dt=0.1,
                      n_steps=2, project=True)
    assert abs(float(system.holonomic(sol.q[0])[0])) <= 1e-14
    assert abs(float(vj.constraints.hidden_constraint(system, sol.q[0], sol.v[0])[0])) <= 1e-14


def test_rank_deficient_constraint_jacobian_is_refused():
    class Doubled(SpringPendulum):
        def holonomic(self, q):
            g = 0.5 * (q @ q - 1.0)
            return jnp.stack([g, 2 * g])

    q0, v0 = initial()
    with pytest.raises(ValueError, match="rank deficiency"):
        vj.simulate(Doubled(gravity=GRAVITY), vj.HolonomicVPRK.rattle(), q0=q0, v0=v0, dt=0.1,
                    n_steps=2)


def test_method_and_system_mismatch_names_the_right_methods():
    q0, v0 = initial()
    with pytest.raises(ValueError, match="HolonomicVPRK"):
        vj.simulate(cartesian_pendulum(), vj.VPRK.gauss(2), q0=q0, v0=v0, dt=0.1, n_steps=2)
    with pytest.raises(ValueError, match="vijax.VPRK"):
        vj.simulate(vj.systems.Pendulum(), vj.HolonomicVPRK.rattle(), q0=jnp.array([1.0]),
                    v0=jnp.array([0.0]), dt=0.1, n_steps=2)


def test_gauss_is_refused_for_constraints():
    with pytest.raises(ValueError, match="a_1j = 0"):
        vj.HolonomicVPRK(vj.tableaus.gauss(2))


def test_multiplier_matches_the_pendulum_closed_form():
    """Eq. (70) of Wenger, Ober-Blöbaum & Leyendecker (2017) for their planar pendulum (§4):
    lambda = (|p|²/m - g m y) / l² (here m = l = g = 1)."""
    system = cartesian_pendulum()
    th, om = 0.7, 1.3
    q = jnp.array([np.sin(th), -np.cos(th)])
    v = om * jnp.array([np.cos(th), np.sin(th)])
    lam = vj.constraints.multiplier(system, q, v)
    np.testing.assert_allclose(lam[0], v @ v - q[1], rtol=1e-14)


def test_projection_helpers():
    system = cartesian_pendulum()
    q = vj.constraints.project_position(system, jnp.array([0.9, -0.8]))
    assert abs(float(system.holonomic(q)[0])) <= 1e-15
    v = vj.constraints.project_velocity(system, q, jnp.array([1.0, 2.0]))
    assert abs(float(q @ v)) <= 1e-15
    p = vj.constraints.project_momentum(system, q, jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(p, v, atol=1e-15)   # M = I: same projection


@pytest.mark.slow  # HolonomicVPRK.lobatto(3) is in tests/test_contract.py (every preset)
def test_gradient_through_rattle_matches_central_differences():
    def loss(k):
        q0, v0 = initial()
        sol = vj.simulate(cartesian_pendulum(k=k), vj.HolonomicVPRK.lobatto(3), q0=q0, v0=v0,
                          dt=0.1, n_steps=20, save_every=20)
        return jnp.sum(sol.q[-1] ** 2 * jnp.array([1.0, 3.0])) + jnp.sum(sol.p[-1] ** 2)

    k, eps = 2.0, 1e-5
    g = float(jax.grad(loss)(k))
    fd = float((loss(k + eps) - loss(k - eps)) / (2 * eps))
    assert abs(g - fd) <= 1e-6 * max(abs(fd), 1e-3)


def test_3d_double_pendulum_invariants_and_constraints_every_step():
    """Wenger et al. (2017), §4.2 and eq. (71): angular momentum about the vertical conserved
    to round-off; constraints at every step; energy bounded: no drift statistically (measured
    t = -0.10 RATTLE, -0.68 Lobatto(3)) and below 5 % of the error's size over the run
    (measured 0.5 %, 1.8 %)."""
    system = vj.systems.DoublePendulum3D()
    q0, v0 = double_pendulum_3d_initial()
    for integ in (vj.HolonomicVPRK.rattle(), vj.HolonomicVPRK.lobatto(3)):
        sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=0.05, n_steps=400, throw=True)
        iz = jax.vmap(system.angular_momentum_z)(sol.q, sol.p)
        assert abs(float(iz[0])) > 0.1                        # a nontrivial invariant
        assert float(jnp.max(jnp.abs(iz - iz[0]))) <= 1e-12
        g, hidden = constraint_residuals(system, sol.q, sol.v)
        assert g <= 1e-12
        assert hidden <= 1e-12
        de = np.asarray(vj.diagnostics.energy_error(system, sol))
        assert_no_drift(sol.t, de, label=integ.name)


def test_spherical_and_polar_pendulums_agree_with_the_cartesian_one():
    """The same planar motion in three parametrisations (Cartesian, polar with a
    configuration-dependent mass matrix, spherical in the x-z plane) gives the same angle."""
    theta0, omega0, h, n = 0.9, 0.4, 0.02, 100
    lob = vj.HolonomicVPRK.lobatto(4)
    cart = vj.simulate(vj.systems.CartesianPendulum(), lob,
                       q0=jnp.array([np.sin(theta0), -np.cos(theta0)]),
                       v0=omega0 * jnp.array([np.cos(theta0), np.sin(theta0)]), dt=h, n_steps=n)
    polar = vj.simulate(vj.systems.PolarPendulum(), lob, q0=jnp.array([1.0, theta0]),
                        v0=jnp.array([0.0, omega0]), dt=h, n_steps=n)
    sph = vj.simulate(vj.systems.SphericalPendulum(), lob,
                      q0=jnp.array([np.sin(theta0), 0.0, -np.cos(theta0)]),
                      v0=omega0 * jnp.array([np.cos(theta0), 0.0, np.sin(theta0)]), dt=h,
                      n_steps=n)
    th_cart = np.arctan2(np.asarray(cart.q[:, 0]), -np.asarray(cart.q[:, 1]))
    th_sph = np.arctan2(np.asarray(sph.q[:, 0]), -np.asarray(sph.q[:, 2]))
    # order 6 at h = 0.02: the parametrisations differ by discretisation error only
    np.testing.assert_allclose(np.asarray(polar.q[:, 1]), th_cart, atol=1e-8)
    np.testing.assert_allclose(th_sph, th_cart, atol=1e-12)   # same equations in 3-D
    np.testing.assert_allclose(np.asarray(polar.q[:, 0]), 1.0, atol=1e-13)


@pytest.mark.parametrize("make", [vj.HolonomicVPRK.rattle, lambda: vj.GalerkinVI.gauss(1),
                                  lambda: vj.HolonomicVPRK.lobatto(5),
                                  lambda: vj.GalerkinVI.gauss(3)],
                         ids=["rattle", "galerkin_gauss1", "lobatto5", "galerkin_gauss3"])
def test_small_steps_converge_at_the_round_off_floor(make):
    """3-D double pendulum at h = 1.5625e-4: the rows g(Q) / h carry round-off ~7e-13, so
    the increments stall a few thousand times above 10 eps.  Before the stall rule of
    ``vijax.solvers`` (accept a stall 1e-8 below the first increment) steps 1488 (RATTLE)
    and 1385 (Galerkin) hit the 50-iteration cap although their error was round-off.
    Lobatto IIIA-IIIB(5) and Galerkin Gauss(3), whose inner-stage impulses carry more
    round-off (their increments cycled at 1.1e4-6e4 tolerances), failed every step until
    the methods passed the solver their rows' round-off level
    (:func:`vijax.constraints.row_round_off`).  Now every step converges in at most 12
    updates."""
    system = vj.systems.DoublePendulum3D()
    q0, v0 = double_pendulum_3d_initial()
    sol = vj.simulate(system, make(), q0=q0, v0=v0, dt=4.0 / 25600, n_steps=1600,
                      save_every=1600)
    assert bool(sol.stats.all_converged)
    assert int(jnp.max(sol.stats.max_iterations)) <= 12


def test_rattle_steps_converge_where_the_impulses_round_off_above_the_default_floor():
    """RATTLE at h = 4e-5 (3-D double pendulum): the impulses inherit the round-off
    eps |q| / h of the rows g(Q)/h, about 0.16 |q| / h = 4000 tolerances, above the solver's
    default stall level of 1000, and the increments cycled there (measured before the step
    passed its rows' round-off level to the solver, :func:`vijax.constraints.row_round_off`:
    steps 1-4 hit the 100-update cap).  Every step converges."""
    system = vj.systems.DoublePendulum3D()
    q0, v0 = double_pendulum_3d_initial()
    sol = vj.simulate(system, vj.HolonomicVPRK.rattle(), q0=q0, v0=v0, dt=4.0 / 102400,
                      n_steps=200, save_every=200)
    assert bool(sol.stats.all_converged)
    assert int(jnp.max(sol.stats.max_iterations)) <= 20


def test_rattle_predictor_is_exact_to_second_order():
    """The RATTLE warm start (both stage velocities from the previous mean velocity and
    ``v_k``; ``v_{k+1}`` one step further: ``_prk_core.predict`` for equal stage momenta)
    misses the converged step by O(h^2), in the stage velocities and in ``v_{k+1}``; the
    generic one (the previous stage values extrapolated, ``v_{k+1}`` shifted to ``v_k``) by
    O(h).  Measured at the same time on the spring pendulum, halving h."""
    from vijax.integrators._prk_core import extrapolation, predict

    system = cartesian_pendulum(k=5.0)
    q0, v0 = initial()
    integ = vj.HolonomicVPRK.rattle()
    hs, new_errs, old_errs = (0.02, 0.01, 0.005), [], []
    for h in hs:
        n = int(round(0.4 / h))
        sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=h, n_steps=n, save_every=1)
        state = jax.tree_util.tree_map(lambda x: x[-1], sol.states)
        new, _ = integ.step(system, state, h)
        V_old = extrapolation(integ.tableau, state.q.dtype) @ state.stages
        generic = (V_old, None, V_old[-1] + state.v - state.stages[-1])
        for errs, (V0, _, v_next) in ((new_errs, predict(integ.tableau, state, h, "holonomic")),
                                      (old_errs, generic)):
            errs.append(max(float(jnp.max(jnp.abs(V0 - new.stages))),
                            float(jnp.max(jnp.abs(v_next - new.v)))))
    for errs, order in ((new_errs, 2), (old_errs, 1)):
        measured = fitted_order(hs, errs)
        assert abs(measured - order) <= 0.2, (errs, measured)
    assert new_errs[-1] < 0.1 * old_errs[-1]


def test_saddle_point_inverse_solves_the_bordered_system():
    """``constraints.saddle_point_inverse`` against a dense solve of the assembled matrix
    ``[[K (x) H, B (x) G_k^T], [C (x) Gr_l, 0]]`` (3-D double pendulum: n = 6, m = 2, with
    K, B, C of the Lobatto(3) HolonomicVPRK shape)."""
    from vijax import constraints as cons
    system = vj.systems.DoublePendulum3D()
    q0, v0 = double_pendulum_3d_initial()
    rng = np.random.default_rng(0)
    a, z, n, m = 4, 3, 6, 2
    K = np.eye(a) + 0.1 * rng.standard_normal((a, a))
    B, C = rng.standard_normal((a, z)), rng.standard_normal((z, a))
    Gc = jnp.asarray(rng.standard_normal((z, m, n)))
    Gr = jnp.asarray(rng.standard_normal((z, m, n)))
    H = np.asarray(system.velocity_hessian(q0, v0))
    top = np.concatenate([np.kron(K, H), np.concatenate(
        [np.concatenate([B[i, k] * np.asarray(Gc[k]).T for k in range(z)], axis=1)
         for i in range(a)], axis=0)], axis=1)
    bottom = np.concatenate([np.concatenate(
        [np.concatenate([C[l, i] * np.asarray(Gr[l]) for i in range(a)], axis=1)
         for l in range(z)], axis=0), np.zeros((z * m, z * m))], axis=1)
    R, T = rng.standard_normal((a, n)), rng.standard_normal((z, m))
    want = np.linalg.solve(np.concatenate([top, bottom]), np.concatenate([R.ravel(), T.ravel()]))
    X, Y = cons.saddle_point_inverse(system, q0, v0, K, B, C, Gc, Gr)(jnp.asarray(R),
                                                                      jnp.asarray(T))
    np.testing.assert_allclose(np.concatenate([np.ravel(X), np.ravel(Y)]), want, rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize("make", [vj.HolonomicVPRK.rattle,
                                  pytest.param(lambda: vj.HolonomicVPRK.lobatto(4),
                                               marks=pytest.mark.slow),
                                  lambda: vj.GalerkinVI.gauss(3),
                                  pytest.param(lambda: vj.GalerkinVI.gauss(2, mode="paper"),
                                               marks=pytest.mark.slow)],
                         ids=["rattle", "lobatto4", "galerkin_gauss3", "galerkin_paper"])
def test_default_solver_agrees_with_newton(make):
    """The default (fixed point with the saddle-point preconditioner) and full Newton find the
    same steps to round-off on the 3-D double pendulum (configuration-dependent mass matrix)."""
    system = vj.systems.DoublePendulum3D()
    q0, v0 = double_pendulum_3d_initial()
    integ = make()
    newton = eqx.tree_at(lambda i: i.solver, integ, vj.solvers.Newton())
    a, b = (vj.simulate(system, i, q0=q0, v0=v0, dt=0.01, n_steps=200, save_every=200)
            for i in (integ, newton))
    assert bool(a.stats.all_converged)
    np.testing.assert_allclose(np.asarray(a.q), np.asarray(b.q), atol=1e-12)
    np.testing.assert_allclose(np.asarray(a.p), np.asarray(b.p), atol=1e-11)
