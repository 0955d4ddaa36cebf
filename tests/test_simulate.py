"""Tests for vijax.simulate: the Solution layout, save_every, v0/p0, ensembles (vmap), jit,
dtype following, solver statistics, input validation and non-convergence reporting."""

import jax


import jax.numpy as jnp
import numpy as np
import pytest
from helpers import RelativisticParticle

import vijax as vj
from vijax import systems as S

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py

GAUSS2 = vj.VPRK.gauss(2)
PENDULUM = S.Pendulum()
Q0 = jnp.array([1.0])
V0 = jnp.array([0.3])


def pendulum(**kwargs):
    """Pendulum, Gauss(2), 12 steps of 0.1 unless overridden (one shared compilation)."""
    args = dict(q0=Q0, v0=V0, dt=0.1, n_steps=12)
    args.update(kwargs)
    return vj.simulate(PENDULUM, GAUSS2, **args)


class Wall(vj.MechanicalSystem):
    """A free particle meeting a stiff one-sided wall at q = 1.05.  From q0 = 0, v0 = 1 and
    dt = 0.1, steps 0-9 are free; the stages of step 10 penetrate the wall, where the default
    fixed-point iteration cannot converge (h^2 k = 100), while Newton can."""

    k: float = 1e4
    wall: float = 1.05
    ndim = 1

    def mass_matrix(self, q):
        return jnp.eye(1, dtype=q.dtype)

    def potential(self, q):
        return 0.5 * self.k * jnp.maximum(q[0] - self.wall, 0.0) ** 2


class Degenerate(vj.LagrangianSystem):
    """L = 1/2 v0^2 - V(q) in 2-D: the second coordinate has no kinetic energy."""

    def lagrangian(self, q, v):
        return 0.5 * v[0] ** 2 - 0.5 * jnp.vdot(q, q)


def assert_no_silent_nan(sol):
    """Any non-finite saved state must come with a failed solve at or before it."""
    bad = ~(jnp.all(jnp.isfinite(sol.q), axis=1) & jnp.all(jnp.isfinite(sol.p), axis=1)
            & jnp.all(jnp.isfinite(sol.v), axis=1))
    bad = np.asarray(bad)
    assert not bad[0]
    failed_so_far = np.cumsum(~np.asarray(sol.stats.converged)) > 0
    for j in np.flatnonzero(bad):
        assert failed_so_far[j - 1], f"row {j} is non-finite but every solve up to it converged"


# ---------------------------------------------------------------------------------------------
# Layout of the Solution
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("save_every", [1, 3, 4])
def test_solution_shapes_and_times(save_every):
    t0, dt = 0.5, 0.1
    sol = pendulum(t0=t0, dt=dt, save_every=save_every)
    n_saves = 12 // save_every
    for x in (sol.q, sol.v, sol.p):
        assert x.shape == (n_saves + 1, 1)
    assert sol.t.shape == (n_saves + 1,)
    assert sol.n_steps == 12
    expected = t0 + dt * save_every * np.arange(n_saves + 1)
    np.testing.assert_allclose(sol.t, expected, rtol=2e-16, atol=0)
    assert float(sol.t[0]) == t0
    for field in ("iterations", "max_iterations", "residual", "converged", "failed_step"):
        assert getattr(sol.stats, field).shape == (n_saves,), field
    # the full integrator states are saved at the same times only
    for leaf in jax.tree_util.tree_leaves(sol.states):
        assert leaf.shape[0] == n_saves + 1
    assert sol.states.stages.shape == (n_saves + 1, GAUSS2.stages, 1)
    np.testing.assert_allclose(sol.states.t, sol.t, rtol=1e-14)
    assert sol.final_state.q.shape == (1,)
    np.testing.assert_array_equal(sol.final_state.q, sol.q[-1])


def test_initial_row_is_the_initial_state():
    sol = vj.simulate(S.DoublePendulum(), GAUSS2, q0=jnp.array([0.4, -0.2]),
                      v0=jnp.array([0.1, 0.5]), dt=0.05, n_steps=4)
    np.testing.assert_array_equal(sol.q[0], [0.4, -0.2])
    np.testing.assert_allclose(sol.v[0], [0.1, 0.5], rtol=1e-14)
    np.testing.assert_allclose(sol.p[0], S.DoublePendulum().momentum(sol.q[0], sol.v[0]),
                               rtol=1e-14)
    # v is the inverse Legendre map of the saved (q, p) at every row
    np.testing.assert_allclose(jax.vmap(S.DoublePendulum().momentum)(sol.q, sol.v), sol.p,
                               rtol=1e-12, atol=1e-14)


def test_save_every_subsamples_the_same_trajectory():
    full = pendulum(n_steps=24, save_every=1)
    sub = pendulum(n_steps=24, save_every=4)
    assert sub.q.shape == (7, 1) and full.q.shape == (25, 1)
    assert sub.states.stages.shape == (7, 2, 1)
    for a, b in ((sub.t, full.t[::4]), (sub.q, full.q[::4]), (sub.v, full.v[::4]),
                 (sub.p, full.p[::4]), (sub.states.stages, full.states.stages[::4])):
        np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-15)
    # statistics aggregate the blocks of save_every steps
    its = np.asarray(full.stats.iterations).reshape(6, 4)
    np.testing.assert_array_equal(sub.stats.iterations, its.sum(axis=1))
    np.testing.assert_array_equal(sub.stats.max_iterations, its.max(axis=1))
    np.testing.assert_allclose(sub.stats.residual,
                               np.asarray(full.stats.residual).reshape(6, 4).max(axis=1))
    np.testing.assert_allclose(sub.mean_iterations, full.mean_iterations, rtol=1e-14)


def test_p0_gives_the_same_trajectory_as_v0():
    # (the non-quadratic, Newton-inverted case: test_p0_of_a_non_quadratic_lagrangian)
    system, q0, v0 = S.DoublePendulum(), jnp.array([0.4, -0.2]), jnp.array([0.1, 0.5])
    p0 = system.momentum(q0, v0)
    a = vj.simulate(system, GAUSS2, q0=q0, v0=v0, dt=0.05, n_steps=8)
    b = vj.simulate(system, GAUSS2, q0=q0, p0=p0, dt=0.05, n_steps=8)
    np.testing.assert_allclose(b.q, a.q, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(b.p, a.p, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(b.v, a.v, rtol=1e-13, atol=1e-14)


def test_t0_only_shifts_time():
    a = pendulum(t0=0.0)
    b = pendulum(t0=3.0)
    np.testing.assert_array_equal(a.q, b.q)
    np.testing.assert_allclose(b.t - a.t, 3.0, rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# vmap, jit, dtypes
# ---------------------------------------------------------------------------------------------


def test_vmapped_ensemble_equals_a_python_loop():
    system = S.Kepler()
    q0s = jnp.array([[0.5, 0.0], [0.7, 0.1], [0.9, -0.2], [1.1, 0.3]])
    v0 = jnp.array([0.0, 1.4])

    def run(q0):
        return vj.simulate(system, GAUSS2, q0=q0, v0=v0, dt=0.05, n_steps=20, save_every=5)

    batch = jax.vmap(run)(q0s)
    assert batch.q.shape == (4, 5, 2)
    assert batch.stats.iterations.shape == (4, 4)
    for i in range(q0s.shape[0]):
        single = run(q0s[i])
        np.testing.assert_allclose(batch.q[i], single.q, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(batch.p[i], single.p, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(batch.v[i], single.v, rtol=1e-13, atol=1e-13)
        np.testing.assert_array_equal(batch.stats.iterations[i], single.stats.iterations)
        assert bool(jnp.all(batch.stats.converged[i]))


@pytest.mark.slow  # also in tests/test_contract.py, on every preset
def test_simulate_under_jit():
    def run(q0, v0, dt):
        return vj.simulate(S.DoublePendulum(), GAUSS2, q0=q0, v0=v0, dt=dt, n_steps=8,
                           save_every=2)

    q0, v0 = jnp.array([0.4, -0.2]), jnp.array([0.1, 0.5])
    eager = run(q0, v0, 0.05)
    jitted = jax.jit(run)(q0, v0, 0.05)
    assert isinstance(jitted, vj.Solution)
    np.testing.assert_allclose(jitted.q, eager.q, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(jitted.t, eager.t, rtol=1e-15)
    np.testing.assert_array_equal(jitted.stats.iterations, eager.stats.iterations)
    # a traced dt is still validated (at run time), with the eager message
    with pytest.raises(Exception, match="dt must be positive and finite"):
        jax.block_until_ready(jax.jit(run)(q0, v0, -0.05).q)


def test_float32_inputs_give_float32_outputs():
    assert jax.config.jax_enable_x64
    q0, v0 = Q0.astype(jnp.float32), V0.astype(jnp.float32)
    sol = pendulum(q0=q0, v0=v0)
    for x in (sol.t, sol.q, sol.v, sol.p, sol.stats.residual, sol.states.stages):
        assert x.dtype == jnp.float32
    assert bool(sol.stats.all_converged)
    ref = pendulum()
    np.testing.assert_allclose(sol.q, ref.q, rtol=1e-5, atol=1e-5)
    # the working dtype is q0's: a float64 v0 (or dt) is rounded to it, with a warning
    with pytest.warns(vj.PrecisionWarning, match="v0, dt are float64 but q0 is float32"):
        mixed = pendulum(q0=q0, v0=V0, dt=jnp.float64(0.1))
    assert mixed.q.dtype == mixed.v.dtype == mixed.p.dtype == jnp.float32
    # p0 instead of v0
    from_p0 = pendulum(q0=q0, v0=None, p0=PENDULUM.momentum(q0, v0))
    assert from_p0.q.dtype == from_p0.v.dtype == jnp.float32
    np.testing.assert_allclose(from_p0.q, sol.q, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def test_stats_of_healthy_runs():
    kwargs = dict(q0=jnp.array([0.4, -0.2]), v0=jnp.array([0.1, 0.5]), dt=0.05, n_steps=20,
                  save_every=5)
    newton = vj.VPRK.gauss(2, solver=vj.solvers.Newton())
    means = {}
    for integrator in (GAUSS2, vj.VPRK.lobatto(3), newton):
        sol = vj.simulate(S.DoublePendulum(), integrator, **kwargs)
        st = sol.stats
        assert bool(jnp.all(st.converged)) and bool(st.all_converged)
        np.testing.assert_array_equal(st.failed_step, -1)
        assert int(st.first_failure) == -1
        # the residual is that of the iterate *before* the returned root (for Newton, the
        # returned root is quadratically better)
        assert bool(jnp.all(st.residual < 1e-6))
        assert bool(jnp.all(st.max_iterations >= 1))
        assert bool(jnp.all(st.max_iterations < integrator.solver.max_steps))
        # blocks of 5 steps, at least one iteration each
        assert bool(jnp.all(st.iterations >= jnp.maximum(st.max_iterations, 5)))
        assert bool(jnp.all(st.iterations <= 5 * st.max_iterations))
        mean = float(sol.mean_iterations)
        np.testing.assert_allclose(mean, float(jnp.sum(st.iterations)) / 20, rtol=1e-15)
        assert 1.0 <= mean <= 0.3 * integrator.solver.max_steps
        means[integrator] = mean, sol
    # Newton converges quadratically: fewer iterations, the same trajectory
    assert means[newton][0] < means[GAUSS2][0]
    np.testing.assert_allclose(means[newton][1].q, means[GAUSS2][1].q, rtol=1e-11, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Non-convergence: raised by default (throw=True), reported in stats with throw=False
# ---------------------------------------------------------------------------------------------


def test_iteration_cap_is_reported_and_raised():
    capped = vj.VPRK.gauss(2, solver=vj.solvers.FixedPoint(max_steps=2))
    sol = vj.simulate(PENDULUM, capped, q0=Q0, v0=V0, dt=0.1, n_steps=12, save_every=4,
                      throw=False)
    assert not bool(jnp.any(sol.stats.converged))
    assert not bool(sol.stats.all_converged)
    np.testing.assert_array_equal(sol.stats.failed_step, [0, 4, 8])
    assert int(sol.stats.first_failure) == 0
    np.testing.assert_array_equal(sol.stats.max_iterations, 2)
    assert bool(jnp.all(jnp.isfinite(sol.q)))  # not converged, but not NaN either
    with pytest.raises(vj.ConvergenceError, match=r"step 0\b") as info:
        vj.simulate(PENDULUM, capped, q0=Q0, v0=V0, dt=0.1, n_steps=12, save_every=4)
    message = str(info.value)
    assert "did not converge" in message and "Newton" in message and "dt" in message
    assert "throw=False" in message
    assert issubclass(vj.ConvergenceError, RuntimeError)


def test_first_failure_names_the_failing_step():
    kwargs = dict(q0=jnp.zeros(1), v0=jnp.ones(1), dt=0.1, n_steps=20, save_every=4)
    sol = vj.simulate(Wall(), GAUSS2, throw=False, **kwargs)
    # steps 0-9 are free flight, step 10 enters the wall: block 2 (steps 8-11) fails
    np.testing.assert_array_equal(sol.stats.converged, [True, True, False, True, True])
    assert int(sol.stats.first_failure) == 10  # a global step index, not a block index
    np.testing.assert_array_equal(sol.stats.failed_step, [-1, -1, 10, -1, -1])
    assert int(sol.stats.max_iterations[2]) == GAUSS2.solver.max_steps
    np.testing.assert_allclose(sol.q[:3, 0], [0.0, 0.4, 0.8], atol=1e-14)  # before the wall

    with pytest.raises(vj.ConvergenceError, match=r"step 10\b") as info:
        vj.simulate(Wall(), GAUSS2, **kwargs)  # throw=True is the default
    assert "(t = 1;" in str(info.value)
    assert "VPRK[Gauss(2)]" in str(info.value)
    # the advice in the message works: Newton handles the stiff wall
    newton = vj.simulate(Wall(), vj.VPRK.gauss(2, solver=vj.solvers.Newton()), **kwargs)
    assert bool(newton.stats.all_converged)


def test_throw_under_jit_raises():
    capped = vj.VPRK.gauss(2, solver=vj.solvers.FixedPoint(max_steps=2))
    run = jax.jit(lambda q0: vj.simulate(PENDULUM, capped, q0=q0, v0=V0, dt=0.1, n_steps=12,
                                         save_every=4).q)
    with pytest.raises(Exception, match="did not converge") as info:
        jax.block_until_ready(run(Q0))
    for fix in ("Reduce dt", "solver=vijax.solvers.Newton()", "throw=False", "sol.stats"):
        assert fix in str(info.value)


def test_throw_is_silent_when_everything_converges():
    sol = pendulum(throw=True)
    assert bool(sol.stats.all_converged)


@pytest.mark.parametrize("system, q0, v0, dt", [
    (S.Pendulum(), [3.0], [2.0], 2.0),
    (S.DoublePendulum(), [2.0, 1.0], [3.0, -3.0], 0.5),
    (S.HenonHeiles(), [0.5, 0.5], [1.0, 1.0], 10.0),  # escapes: NaN after the failure
], ids=["pendulum", "double_pendulum", "henon_heiles"])
def test_large_steps_fail_loudly_never_silently(system, q0, v0, dt):
    sol = vj.simulate(system, GAUSS2, q0=jnp.asarray(q0), v0=jnp.asarray(v0), dt=dt,
                      n_steps=10, throw=False)
    assert not bool(sol.stats.all_converged)
    k = int(sol.stats.first_failure)
    assert 0 <= k < 10
    assert not bool(sol.stats.converged[k]) and bool(jnp.all(sol.stats.converged[:k]))
    assert_no_silent_nan(sol)
    with pytest.raises(vj.ConvergenceError, match=rf"step {k}\b"):
        vj.simulate(system, GAUSS2, q0=jnp.asarray(q0), v0=jnp.asarray(v0), dt=dt,
                    n_steps=10)


def test_nan_initial_state_is_refused_up_front_also_under_jit():
    with pytest.raises(ValueError, match="q0 contains non-finite"):
        pendulum(q0=jnp.array([jnp.nan]))
    with pytest.raises(ValueError, match="v0 contains non-finite"):
        pendulum(v0=jnp.array([jnp.inf]))
    # under jit the values are traced: checked in the graph, with the same message, whether
    # or not the run would throw on a failed solve
    for throw in (True, False):
        run = jax.jit(lambda q: vj.simulate(PENDULUM, GAUSS2, q0=q, v0=V0, dt=0.1, n_steps=12,
                                            throw=throw).q)
        with pytest.raises(Exception, match="q0 contains non-finite"):
            jax.block_until_ready(run(jnp.array([jnp.nan])))


# ---------------------------------------------------------------------------------------------
# Input validation: clear errors that name the fix
# ---------------------------------------------------------------------------------------------


def raises(exc, *fragments, **kwargs):
    """Call simulate with the pendulum defaults overridden by kwargs; check the message."""
    args = dict(system=PENDULUM, integrator=GAUSS2, q0=Q0, v0=V0, dt=0.1, n_steps=12)
    args.update(kwargs)
    system, integrator = args.pop("system"), args.pop("integrator")
    with pytest.raises(exc) as info:
        vj.simulate(system, integrator, **args)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def test_q0_must_be_one_dimensional():
    raises(ValueError, "q0", "1-D", "shape (1, 1)", "jax.vmap", q0=jnp.ones((1, 1)))
    raises(ValueError, "q0", "1-D", "shape ()", q0=1.0)


def test_v0_shape_mismatch():
    raises(ValueError, "v0 has shape (3,)", "q0 has shape (2,)", system=S.HarmonicOscillator(),
           q0=jnp.ones(2), v0=jnp.ones(3))
    raises(ValueError, "v0", "1-D", v0=jnp.ones((1, 1)))
    raises(ValueError, "p0 has shape (2,)", p0=jnp.ones(2), v0=None)


def test_q0_must_match_the_system_dimension():
    raises(ValueError, "q0 has 2 components", "ndim = 1", q0=jnp.ones(2), v0=jnp.ones(2))


def test_integer_initial_conditions_are_refused():
    raises(TypeError, "q0", "int", "floating-point", "float64", q0=jnp.array([1]))
    raises(TypeError, "v0", "int", "floating-point", v0=jnp.array([0]))


@pytest.mark.parametrize("dt", [0.0, -0.1, float("nan")])
def test_dt_must_be_positive(dt):
    raises(ValueError, "dt must be positive", dt=dt)


def test_dt_must_be_finite():
    raises(ValueError, "dt must be positive", dt=float("inf"))


def test_dt_must_be_scalar():
    raises(ValueError, "dt must be a scalar", "shape (2,)", dt=jnp.array([0.1, 0.2]))


@pytest.mark.parametrize("n_steps", [0, -3, 10.0, True, "10", jnp.asarray(12)],
                         ids=["zero", "negative", "float", "bool", "str", "jax-array"])
def test_n_steps_must_be_a_positive_int(n_steps):
    raises(ValueError, "n_steps must be a positive Python int", n_steps=n_steps)


def test_numpy_integer_n_steps():
    """numpy integers are integers (they used to pass the check and then fail inside jit)."""
    sol = pendulum(n_steps=np.int64(12), save_every=np.int64(3))
    assert sol.q.shape == (5, 1)


def test_save_every_validation():
    raises(ValueError, "not a multiple of save_every = 5", "n_steps = 15", n_steps=12,
           save_every=5)
    raises(ValueError, "save_every must be a positive Python int", save_every=0)
    raises(ValueError, "save_every must be a positive Python int", save_every=2.0)


def test_exactly_one_of_v0_and_p0():
    raises(ValueError, "exactly one of v0", "p0", "both", p0=V0)
    raises(ValueError, "exactly one of v0", "p0", "neither", v0=None)


def test_non_symplectic_partitioned_tableau_is_refused():
    bad = vj.tableaus.PartitionedTableau(q=vj.tableaus.lobatto_iiia(3),
                                         p=vj.tableaus.lobatto_iiia(3), name="bad", order=4)
    assert not bad.is_symplectic_conjugate()
    with pytest.raises(ValueError) as info:
        vj.VPRK(bad)
    message = str(info.value)
    for fragment in ("symplectic-conjugate", "bad", "defect", "symplectic_pair"):
        assert fragment in message
    # the remedies named in the message work
    vj.VPRK(vj.tableaus.symplectic_pair(vj.tableaus.lobatto_iiia(3)))
    vj.VPRK(vj.tableaus.lobatto_iiia_iiib(3))


def test_wrong_tableau_type_is_refused():
    with pytest.raises(TypeError, match="ButcherTableau"):
        vj.VPRK("gauss")
    with pytest.raises(ValueError, match="predictor"):
        vj.VPRK.gauss(2, predictor="linear")


def test_singular_velocity_hessian_is_refused():
    msg = raises(ValueError, "Degenerate", "singular", "kinetic energy", system=Degenerate(),
                 q0=jnp.array([0.1, 0.2]), v0=jnp.array([0.3, 0.4]))
    assert "d2L/dv2" in msg
    raises(ValueError, "singular", system=Degenerate(), q0=jnp.array([0.1, 0.2]),
           p0=jnp.array([0.3, 0.0]), v0=None)


def unit_relativistic():
    """``L = -sqrt(1 - |v|^2) - |q|^2 / 2``: ``p = v / sqrt(1 - |v|^2)``,
    ``v = p / sqrt(1 + |p|^2)``."""
    return RelativisticParticle(m=1.0, k=1.0)


def test_p0_of_a_non_quadratic_lagrangian():
    q0, p0 = jnp.array([0.3, -0.2]), jnp.array([0.5, 0.4])
    sol = vj.simulate(unit_relativistic(), GAUSS2, q0=q0, p0=p0, dt=0.05, n_steps=4)
    v0 = p0 / jnp.sqrt(1.0 + p0 @ p0)
    np.testing.assert_allclose(sol.v[0], v0, rtol=1e-12)
    assert bool(sol.stats.all_converged)
    # the same trajectory as from v0
    from_v0 = vj.simulate(unit_relativistic(), GAUSS2, q0=q0, v0=v0, dt=0.05, n_steps=4)
    np.testing.assert_allclose(sol.q, from_v0.q, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(sol.p, from_v0.p, rtol=1e-13, atol=1e-14)


def test_p0_outside_the_newton_basin_is_handled_or_reported_as_such():
    """Plain Newton from v = 0 overshoots to |v| >= 1 when |p0| >= m (NaN): the inverse
    Legendre map must either still find v or say that it failed for this p0, not blame a
    singular velocity Hessian."""
    q0, p0 = jnp.array([0.3, -0.2]), jnp.array([2.0, 1.0])
    try:
        sol = vj.simulate(unit_relativistic(), GAUSS2, q0=q0, p0=p0, dt=0.05, n_steps=4)
    except ValueError as err:
        assert "singular" not in str(err) and "p0" in str(err)
    else:
        np.testing.assert_allclose(sol.v[0], p0 / jnp.sqrt(1.0 + p0 @ p0), rtol=1e-12)


def test_wrong_system_and_integrator_types():
    raises(TypeError, "vijax.LagrangianSystem", "str", system="pendulum")
    raises(TypeError, "vijax.LagrangianSystem", "VPRK", system=GAUSS2, integrator=PENDULUM)
    raises(TypeError, "vijax integrator", "VPRK.gauss(2)", "ButcherTableau",
           integrator=vj.tableaus.gauss(2))
    raises(TypeError, "vijax.LagrangianSystem", system=S.Pendulum)  # the class, not an instance
    raises(TypeError, "vijax integrator", integrator=vj.VPRK)


def test_keyword_only_arguments():
    with pytest.raises(TypeError):
        vj.simulate(PENDULUM, GAUSS2, Q0, V0, 0.1, 12)



def test_direct_calls_check_each_distinct_input_once():
    """A direct call runs the value checks once per distinct input and caches what they return:
    a repeated call adds no cache entry and gives the same trajectory; a new value (of a
    parameter, the initial data or the integrator's configuration) is checked afresh, so a bad
    value after a good one still raises."""
    import sys

    sim_module = sys.modules["vijax.simulate"]  # the module (vijax.simulate is the function)

    sim_module._CHECKED.clear()
    first = pendulum()
    assert len(sim_module._CHECKED) == 1
    again = pendulum()
    assert len(sim_module._CHECKED) == 1
    np.testing.assert_array_equal(np.asarray(first.q), np.asarray(again.q))
    # from momenta: the cached entry holds the velocity the inverse Legendre map returned
    p_first = pendulum(v0=None, p0=jnp.array([0.3]))
    p_again = pendulum(v0=None, p0=jnp.array([0.3]))
    assert len(sim_module._CHECKED) == 2
    np.testing.assert_array_equal(np.asarray(p_first.v), np.asarray(p_again.v))
    vj.simulate(S.Pendulum(l=2.0), GAUSS2, q0=Q0, v0=V0, dt=0.1, n_steps=12)
    vj.simulate(PENDULUM, vj.VPRK.gauss(3), q0=Q0, v0=V0, dt=0.1, n_steps=12)
    assert len(sim_module._CHECKED) == 4
    with pytest.raises(ValueError, match="Pendulum.l is not finite"):
        vj.simulate(S.Pendulum(l=float("nan")), GAUSS2, q0=Q0, v0=V0, dt=0.1, n_steps=12)
    with pytest.raises(ValueError, match="dt must be positive"):
        pendulum(dt=-0.1)
    assert len(sim_module._CHECKED) == 4  # failed checks are not cached
