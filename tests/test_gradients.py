"""Gradients through vijax.simulate.

A final-state loss ``|q_N|^2 + |p_N|^2 + |v_N|^2 / 10`` is differentiated with respect to the
initial state, the step size and system parameters, by reverse mode (implicit function
theorem at every stage solve) and forward mode, and compared with central finite differences,
with unrolled solver iterations, and across equivalent formulations (Kepler vs GeneralKepler,
vmapped ensembles vs loops).

Every loss is a jitted function of one flat float64 vector ``theta``, so that the finite
differences reuse one compilation.  System parameters enter as traced arrays (Python-float
fields would be static under the library's ``filter_jit`` and recompile for every value).
"""

import jax


import functools

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from helpers import while_loops
from vijax import systems as S

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py

N_STEPS = 100
FD_REL_STEP = 1e-6


def final_state_loss(sol):
    # v_N is the inverse Legendre map of (q_N, p_N): Newton for a general Lagrangian
    return jnp.sum(sol.q[-1] ** 2) + jnp.sum(sol.p[-1] ** 2) + 0.1 * jnp.sum(sol.v[-1] ** 2)


class Problem:
    """``loss(theta)`` with ``theta = [q0 (n), v0 (n), dt, *params]``."""

    def __init__(self, make_system, params, q0, v0, dt, integrator, n_steps=N_STEPS,
                 use_p0=False):
        self.make_system = make_system
        self.n = len(q0)
        self.integrator = integrator
        self.n_steps = n_steps
        self.use_p0 = use_p0
        self.theta = jnp.asarray([*q0, *v0, dt, *params], dtype=jnp.float64)
        # one compilation serves the loss (finite differences) and the gradient
        self.value_and_grad = jax.jit(jax.value_and_grad(self._loss))

    def loss(self, theta):
        return self.value_and_grad(theta)[0]

    def grad(self, theta):
        return self.value_and_grad(theta)[1]

    def _loss(self, theta):
        n = self.n
        q0, v0, dt, params = theta[:n], theta[n:2 * n], theta[2 * n], theta[2 * n + 1:]
        system = self.make_system(*params)
        if self.use_p0:
            init = dict(p0=system.momentum(q0, v0))
        else:
            init = dict(v0=v0)
        sol = vj.simulate(system, self.integrator, q0=q0, dt=dt, n_steps=self.n_steps,
                          save_every=self.n_steps, **init)
        return final_state_loss(sol)

    def finite_differences(self):
        theta = np.asarray(self.theta)
        out = np.empty_like(theta)
        for i in range(theta.size):
            h = FD_REL_STEP * max(abs(theta[i]), 1.0)
            plus, minus = theta.copy(), theta.copy()
            plus[i] += h
            minus[i] -= h
            out[i] = (float(self.loss(jnp.asarray(plus)))
                      - float(self.loss(jnp.asarray(minus)))) / (2 * h)
        return out


def assert_gradients_close(actual, expected, rtol):
    actual, expected = np.asarray(actual), np.asarray(expected)
    scale = np.max(np.abs(expected))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


# Problems are cached so that tests sharing one reuse its compiled loss and gradient.
@functools.cache
def pendulum_problem(integrator):
    return Problem(lambda l, g: S.Pendulum(l=l, g=g), [1.3, 9.81], [1.0], [0.3], 0.05,
                   integrator)


@functools.cache
def double_pendulum_problem(integrator, n_steps=N_STEPS):
    return Problem(lambda m2, l1: S.DoublePendulum(m2=m2, l1=l1), [0.8, 1.2], [0.5, -0.3],
                   [0.2, 0.4], 0.05, integrator, n_steps=n_steps)


@functools.cache
def kepler_problem(integrator, system=S.Kepler, **kwargs):
    return Problem(lambda mu: system(mu=mu), [1.1], [0.6, 0.1], [0.1, 1.4], 0.05, integrator,
                   **kwargs)


INTEGRATORS = {
    "gauss1": vj.VPRK.gauss(1),
    "gauss2": vj.VPRK.gauss(2),
    "lobatto3": vj.VPRK.lobatto(3),
}

FD_CASES = [
    ("pendulum", "gauss1"), ("pendulum", "gauss2"), ("pendulum", "lobatto3"),
    ("double_pendulum", "gauss2"), ("double_pendulum", "lobatto3"),
    ("kepler", "gauss2"), ("kepler", "lobatto3"),
]
# The pendulum cases (constant mass, as Kepler here and Hénon-Heiles in tests/test_contract.py,
# which runs every preset) and Lobatto IIIA-IIIB on the others (the contract test checks every
# preset's gradient against central differences) with -m slow.
FD_PARAMS = [pytest.param(s, m, id=f"{s}-{m}",
                          marks=[pytest.mark.slow] if s == "pendulum" or m == "lobatto3" else [])
             for s, m in FD_CASES]
PROBLEMS = {"pendulum": pendulum_problem, "double_pendulum": double_pendulum_problem,
            "kepler": kepler_problem}


# ---------------------------------------------------------------------------------------------
# Reverse mode vs central finite differences (initial state, dt, parameters at once)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("system, method", FD_PARAMS)
def test_gradient_matches_finite_differences(system, method):
    problem = PROBLEMS[system](INTEGRATORS[method])
    grad = problem.grad(problem.theta)
    assert np.all(np.isfinite(grad))
    # every component (q0, v0, dt and each parameter) is genuinely exercised
    assert np.all(np.abs(grad) > 1e-6 * np.max(np.abs(grad)))
    assert_gradients_close(grad, problem.finite_differences(), rtol=1e-6)


def test_pendulum_parameter_gradients_through_system_module():
    """jax.grad straight through the system module (its float fields are leaves)."""
    q0, v0 = jnp.array([1.0]), jnp.array([0.3])

    @jax.jit
    @jax.value_and_grad
    def loss(system):
        sol = vj.simulate(system, INTEGRATORS["gauss2"], q0=q0, v0=v0, dt=0.05,
                          n_steps=N_STEPS, save_every=N_STEPS)
        return final_state_loss(sol)

    system = S.Pendulum(m=jnp.asarray(1.0), l=jnp.asarray(1.3), g=jnp.asarray(9.81))
    _, grads = loss(system)
    assert isinstance(grads, S.Pendulum)
    for field in ("m", "l", "g"):
        value = float(getattr(system, field))
        h = FD_REL_STEP * value
        plus = eqx.tree_at(lambda s: getattr(s, field), system, jnp.asarray(value + h))
        minus = eqx.tree_at(lambda s: getattr(s, field), system, jnp.asarray(value - h))
        fd = (loss(plus)[0] - loss(minus)[0]) / (2 * h)
        np.testing.assert_allclose(getattr(grads, field), fd, rtol=1e-6, err_msg=field)


# ---------------------------------------------------------------------------------------------
# Implicit function theorem vs unrolled iterations; forward vs reverse mode
# ---------------------------------------------------------------------------------------------


def test_unrolled_iterations_agree_with_implicit_differentiation():
    """Unrolled fixed-point iterations (differentiated iteration by iteration) vs the implicit
    function theorem at the roots found by the default solver.  (Unrolled Newton and
    SimplifiedNewton are compared with the IFT in test_solvers.py.)"""
    # unrolled solves scan over max_steps iterations whether converged or not: keep the cap
    # modest (still well above what the solves need)
    unrolled = vj.solvers.FixedPoint(max_steps=30, adjoint=vj.solvers.UnrolledAdjoint())
    ift = pendulum_problem(INTEGRATORS["gauss2"])
    problem = pendulum_problem(vj.VPRK.gauss(2, solver=unrolled))
    theta, n = problem.theta, problem.n
    sol = vj.simulate(S.Pendulum(l=theta[-2], g=theta[-1]), problem.integrator,
                      q0=theta[:n], v0=theta[n:2 * n], dt=theta[2 * n],
                      n_steps=problem.n_steps, save_every=problem.n_steps)
    assert bool(sol.stats.all_converged)
    assert int(sol.stats.max_iterations[0]) < 0.7 * unrolled.max_steps
    # different solvers stop at different points within the tolerance (~3e-13 per step)
    np.testing.assert_allclose(problem.loss(theta), ift.loss(theta), rtol=1e-11)
    assert_gradients_close(problem.grad(theta), ift.grad(theta), rtol=1e-10)


@pytest.mark.slow  # also in tests/test_contract.py, on every preset
def test_forward_mode_agrees_with_reverse_mode():
    problem = pendulum_problem(INTEGRATORS["gauss2"])
    grad = problem.grad(problem.theta)
    directions = jnp.asarray(np.random.default_rng(0).normal(size=(3, problem.theta.size)))

    @jax.jit
    def jvps(theta, directions):
        return jax.vmap(lambda d: jax.jvp(problem._loss, (theta,), (d,)))(directions)

    values, tangents = jvps(problem.theta, directions)
    np.testing.assert_allclose(values, problem.loss(problem.theta), rtol=1e-14)
    np.testing.assert_allclose(tangents, directions @ grad, rtol=1e-10,
                               atol=1e-12 * np.abs(grad).max())


def test_dt_gradient_is_consistent_with_the_time_rescaling():
    """Harmonic oscillator, m = 1, v0 = 0: in the variables (q, dt p) the VPRK step depends on
    (dt, k) only through dt^2 k, hence dt dq_N/d(dt) = 2 k dq_N/dk."""
    q0, v0 = jnp.array([1.0]), jnp.array([0.0])

    @jax.jit
    def q_final(dt, k):
        sol = vj.simulate(S.HarmonicOscillator(k=k), INTEGRATORS["gauss2"], q0=q0, v0=v0,
                          dt=dt, n_steps=50, save_every=50)
        return sol.q[-1, 0]

    dt, k = 0.05, 1.3
    d_dt, d_k = jax.jit(jax.grad(q_final, argnums=(0, 1)))(dt, k)
    assert abs(float(d_dt)) > 1.0
    np.testing.assert_allclose(d_dt * dt, 2.0 * d_k * k, rtol=1e-10)
    # and the value itself is invariant along dt^2 k = const
    np.testing.assert_allclose(q_final(2 * dt, k / 4), q_final(dt, k), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# The generic (non-mechanical) path
# ---------------------------------------------------------------------------------------------


def test_general_kepler_gradients():
    """GeneralKepler: velocity Hessian by autodiff and the Newton inverse Legendre map (used
    for p0 and the saved v_N in the loss).  Same physics, so the same gradients as Kepler;
    and finite differences."""
    general = kepler_problem(INTEGRATORS["gauss2"], system=S.GeneralKepler, use_p0=True)
    mechanical = kepler_problem(INTEGRATORS["gauss2"])  # v0 = p0 / m: the same loss
    g_general = general.grad(general.theta)
    assert_gradients_close(g_general, mechanical.grad(mechanical.theta), rtol=1e-11)
    assert_gradients_close(g_general, general.finite_differences(), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Ensembles
# ---------------------------------------------------------------------------------------------


def test_gradient_of_a_vmapped_ensemble_loss():
    integrator = INTEGRATORS["gauss2"]
    q0s = jnp.array([[0.6, 0.1], [0.8, -0.1], [1.0, 0.2]])
    v0 = jnp.array([0.1, 1.3])

    def member(q0, mu):
        sol = vj.simulate(S.Kepler(mu=mu), integrator, q0=q0, v0=v0, dt=0.05, n_steps=60,
                          save_every=60)
        return final_state_loss(sol)

    def ensemble(q0s, mu):
        return jnp.sum(jax.vmap(member, in_axes=(0, None))(q0s, mu))

    ensemble_vg = jax.jit(jax.value_and_grad(ensemble, argnums=(0, 1)))
    _, (g_q0s, g_mu) = ensemble_vg(q0s, 1.1)
    assert g_q0s.shape == (3, 2)

    member_grad = jax.jit(jax.grad(member, argnums=(0, 1)))
    loop = [member_grad(q0s[i], 1.1) for i in range(3)]
    np.testing.assert_allclose(g_q0s, np.stack([g[0] for g in loop]), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(g_mu, sum(g[1] for g in loop), rtol=1e-11)

    h = 1.1e-6
    fd_mu = (ensemble_vg(q0s, 1.1 + h)[0] - ensemble_vg(q0s, 1.1 - h)[0]) / (2 * h)
    np.testing.assert_allclose(g_mu, fd_mu, rtol=1e-6)


def test_per_member_jacobian_via_vmap_of_grad():
    """vmap of grad (one gradient per ensemble member) equals the loop."""
    integrator = INTEGRATORS["gauss1"]
    q0s = jnp.array([[0.4], [0.9], [1.4]])

    def member(q0):
        sol = vj.simulate(S.Pendulum(), integrator, q0=q0, v0=jnp.zeros(1), dt=0.05,
                          n_steps=60, save_every=60)
        return final_state_loss(sol)

    batched = jax.jit(jax.vmap(jax.grad(member)))(q0s)
    single = jax.jit(jax.grad(member))
    for i in range(3):
        np.testing.assert_allclose(batched[i], single(q0s[i]), rtol=1e-11)


def test_second_derivatives_through_the_stage_solves_match_central_differences():
    """Hessian of a loss of a trajectory (forward over reverse, and forward over forward) on
    the double pendulum, whose VPRK stage solve returns the stage forces from its last
    residual evaluation: symmetric, and equal to central differences of the gradient.  (The
    forces' derivative was attached to a gradient-stopped value, so differentiated twice
    they lost their dependence on the root: the Hessian was off by 19 % and asymmetric.  A
    stage-solve rule whose primal output is the gradient-stopped root, inside the scan of
    steps, made it 1e-3 off: see ``vijax.solvers._implicit_solve``.)  The second derivative
    differentiates the stage loop itself, whose tangents start from the predictor's: with a
    gradient-stopped predictor they started from zero and lagged the iterates (asymmetry
    5.7e-11 and forward-over-forward 3.8e-11 relative, or 1.8e-9 once a better predictor
    needed fewer updates); now 2.6e-15 and 2.4e-15."""
    system = vj.systems.DoublePendulum()
    v0 = jnp.array([0.0, 0.3])

    def loss(q0):
        sol = vj.simulate(system, vj.VPRK.gauss(2), q0=q0, v0=v0, dt=0.01, n_steps=60,
                          save_every=20)
        return jnp.sum(sol.q ** 2) + jnp.sum(sol.p[-1]) + sol.q[-1, 0] * sol.p[-1, 1]

    q0 = jnp.array([1.0, 1.5])
    grad = jax.jit(jax.grad(loss))
    hess = np.asarray(jax.jit(jax.hessian(loss))(q0))  # forward over reverse
    fwd_fwd = np.asarray(jax.jit(jax.jacfwd(jax.jacfwd(loss)))(q0))
    eps = 1e-5
    central = np.stack([(grad(q0 + eps * e) - grad(q0 - eps * e)) / (2 * eps)
                        for e in jnp.eye(2, dtype=q0.dtype)])
    scale = np.max(np.abs(central))
    assert np.max(np.abs(hess - hess.T)) <= 1e-13 * scale
    assert np.max(np.abs(hess - central)) <= 1e-7 * scale, (hess, central)
    assert np.max(np.abs(fwd_fwd - hess)) <= 1e-13 * scale, (fwd_fwd, hess)


def test_the_backward_pass_linearises_at_the_stored_stage_root():
    """A step rematerialised with the stage root saved (``vj.solvers.STAGE_ROOT``) solves its
    stage equations once: its gradient's program has the forward solve's loop only, and the
    same gradient as the step re-run with its solve.  ``simulate``'s gradients (CPU) do the
    same: one loop, where re-running the solve in the backward pass would make two."""
    system = vj.systems.DoublePendulum()
    integrator = vj.VPRK.gauss(2)
    state = integrator.init(system, 0.0, jnp.array([1.0, 1.5]), jnp.array([0.0, 0.3]))

    def grad_of(policy):
        step = jax.checkpoint(lambda s: integrator.step(system, s, 0.05)[0], policy=policy)
        loss = lambda s: jnp.sum(step(s).q ** 2) + jnp.sum(step(s).p)  # noqa: E731
        return jax.jit(jax.grad(loss)), jax.make_jaxpr(jax.grad(loss))(state).jaxpr

    saved, saved_jaxpr = grad_of(
        jax.checkpoint_policies.save_only_these_names(vj.solvers.STAGE_ROOT))
    rerun, rerun_jaxpr = grad_of(None)
    assert while_loops(saved_jaxpr) == 2  # the two forward steps' solves
    assert while_loops(rerun_jaxpr) == 4  # and again in the backward pass
    for a, b in zip(jax.tree_util.tree_leaves(saved(state)),
                    jax.tree_util.tree_leaves(rerun(state))):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)

    def loss(q0):
        sol = vj.simulate(system, integrator, q0=q0, v0=jnp.zeros(2), dt=0.01, n_steps=20,
                          save_every=10)
        return jnp.sum(sol.q ** 2)

    if jax.default_backend() == "cpu":
        assert while_loops(jax.make_jaxpr(jax.grad(loss))(jnp.array([1.0, 1.5])).jaxpr) == 1


def test_small_products_differentiate_like_matmul():
    """``vijax._linalg.mm`` (elementwise code for small products, with its own tangent rule)
    has the derivatives of ``a @ b``: forward and reverse mode, with either operand constant,
    and second derivatives."""
    from vijax import _linalg

    key = jax.random.PRNGKey(3)
    a, b = jax.random.normal(key, (3, 4)), jax.random.normal(jax.random.fold_in(key, 1), (4, 2))

    def loss(prod, a, b):
        return jnp.sum(jnp.sin(prod(a, b))) + jnp.sum(prod(a, b[:, 0]) ** 2)

    ours = functools.partial(loss, _linalg.mm)
    ref = functools.partial(loss, jnp.matmul)
    for argnums in (0, 1, (0, 1)):
        for derivative in (jax.grad, jax.jacfwd, jax.hessian):
            got, want = (jax.tree_util.tree_leaves(jax.jit(derivative(f, argnums=argnums))(a, b))
                         for f in (ours, ref))
            for x, y in zip(got, want):
                np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-13)
