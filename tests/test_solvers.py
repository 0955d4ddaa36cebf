"""Tests for vijax.solvers: Newton, SimplifiedNewton and FixedPoint.

Convergence on small nonlinear systems, the reported statistics, graceful non-convergence
(never an exception, never a false ``converged``), NaN handling, gradients by the implicit
function theorem against the analytic derivative of the root and against unrolled
iterations, and jit / vmap / dtype behaviour.
"""

import jax


import jax.numpy as jnp
import numpy as np
import pytest
from helpers import while_loops

from vijax.solvers import (FixedPoint, ImplicitAdjoint, Newton, SimplifiedNewton, UnrolledAdjoint,
                           default_tolerance)

# x^3 = a componentwise; from x0 = 1 every solver below converges for these a (the
# simplified-Newton map x - (x^3 - a)/3 contracts with rate |1 - x*^2| <= 0.37 here).
A = jnp.array([0.8, 1.2, 1.6])
ROOT = A ** (1.0 / 3.0)


def cubic(a):
    return lambda x: x**3 - a


def cubic_precond(x0):
    """Inverse Jacobian of the cubic at the predictor (what VPRK supplies to FixedPoint)."""
    return lambda r: r / (3.0 * x0**2)


def run(solver, fn, x0, precond=None):
    return solver.solve(fn, x0, precond if isinstance(solver, FixedPoint) else None)


ALL_SOLVERS = {
    "newton": Newton(),
    "simplified_newton": SimplifiedNewton(),
    "fixed_point": FixedPoint(),
    "newton_unrolled": Newton(adjoint=UnrolledAdjoint()),
    "simplified_newton_unrolled": SimplifiedNewton(adjoint=UnrolledAdjoint()),
    "fixed_point_unrolled": FixedPoint(adjoint=UnrolledAdjoint()),
}
solver_params = pytest.mark.parametrize("solver", list(ALL_SOLVERS.values()),
                                        ids=list(ALL_SOLVERS))
# The iteration is the same code whichever the adjoint (while_loop vs masked scan);
# the cheaper tests run on all six variants, the rest on these four.
SOME = ["newton", "simplified_newton", "fixed_point", "fixed_point_unrolled"]


def solvers(*names):
    return pytest.mark.parametrize("solver", [ALL_SOLVERS[k] for k in names], ids=list(names))


some_solver_params = solvers(*SOME)


# ---------------------------------------------------------------------------------------------
# Convergence and statistics
# ---------------------------------------------------------------------------------------------


def test_default_tolerance():
    """A pure function of the dtype, between round-off and a loose engineering tolerance."""
    tol64, tol32 = default_tolerance(jnp.float64), default_tolerance(jnp.float32)
    assert isinstance(tol64, float) and isinstance(tol32, float)
    assert np.finfo(np.float64).eps <= tol64 <= 1e-12
    assert np.finfo(np.float32).eps <= tol32 <= 1e-5
    assert default_tolerance(np.dtype("float64")) == tol64


@solver_params
def test_cubic_converges(solver):
    x0 = jnp.ones(3)
    x, st = run(solver, cubic(A), x0, cubic_precond(x0))
    assert x.shape == (3,) and x.dtype == jnp.float64
    np.testing.assert_allclose(x, ROOT, rtol=1e-12, atol=0)
    assert bool(st.converged)
    assert 1 <= int(st.iterations) < solver.max_steps
    assert st.iterations.dtype == jnp.int32 and st.converged.dtype == jnp.bool_
    # residual: max-norm of F at the iterate before the returned root
    assert 0.0 <= float(st.residual) < 1e-9
    # the returned root is at least as good as the last residual (up to round-off)
    assert float(jnp.max(jnp.abs(cubic(A)(x)))) <= float(st.residual) + 1e-14


@solvers("newton", "fixed_point_unrolled")
def test_keeps_the_shape_of_the_unknowns(solver):
    """Unknowns of any shape (VPRK uses (stages, n)) are flattened and restored."""
    a = jnp.reshape(jnp.array([0.8, 1.2, 1.6, 1.0, 0.9, 1.3]), (2, 3))
    x0 = jnp.ones((2, 3))
    x, st = run(solver, cubic(a), x0, cubic_precond(x0))
    assert x.shape == (2, 3)
    np.testing.assert_allclose(x, a ** (1.0 / 3.0), rtol=1e-12)
    assert bool(st.converged)


def test_pytree_unknowns():
    """Unknowns may be a pytree; the residual a pytree with as many scalars."""
    def fn(x):
        return jnp.concatenate([x["u"] ** 3 - A[:2], (x["w"] ** 3 - A[2])[None]])

    x0 = {"u": jnp.ones(2), "w": jnp.ones(())}
    x, st = Newton().solve(fn, x0)
    assert bool(st.converged)
    assert x["u"].shape == (2,) and x["w"].shape == ()
    np.testing.assert_allclose(jnp.append(x["u"], x["w"]), ROOT, rtol=1e-12)


def _reference_iterates(update, x0, n):
    """x_0, x_1, ..., x_n of the documented iteration x <- x - dx, and the residuals F(x_k)."""
    xs, rs = [np.asarray(x0, dtype=np.float64)], []
    for _ in range(n):
        dx, r = update(xs[-1])
        xs.append(xs[-1] - dx)
        rs.append(np.max(np.abs(r)))
    return xs, rs


@pytest.mark.parametrize("adjoint", [ImplicitAdjoint(), UnrolledAdjoint()], ids=["implicit", "unrolled"])
@pytest.mark.parametrize("kind", ["newton", "simplified_newton", "fixed_point"])
def test_statistics_match_a_reference_implementation(kind, adjoint):
    """``iterations`` counts the updates that produced the returned root, ``residual`` is
    max|F| at the iterate before it, and the stopping rule neither stops before the
    tolerance is met nor runs much past it."""
    tol = 1e-9  # far from round-off, so the comparisons are unambiguous
    a = np.asarray(A)
    x0 = np.ones(3)
    cls = {"newton": Newton, "simplified_newton": SimplifiedNewton,
           "fixed_point": FixedPoint}[kind]
    solver = cls(rtol=tol, atol=tol, adjoint=adjoint)
    if kind == "newton":
        ref_update = lambda x: ((x**3 - a) / (3 * x**2), x**3 - a)  # noqa: E731
    else:  # Jacobian (or preconditioner) frozen at x0 = 1
        ref_update = lambda x: ((x**3 - a) / 3.0, x**3 - a)  # noqa: E731
    x, st = run(solver, cubic(jnp.asarray(a)), jnp.asarray(x0), cubic_precond(jnp.asarray(x0)))
    xs, rs = _reference_iterates(ref_update, x0, solver.max_steps)
    root = a ** (1.0 / 3.0)
    errors = [np.max(np.abs(xk - root) / (tol + tol * np.abs(root))) for xk in xs]
    k = int(st.iterations)
    assert bool(st.converged)
    assert 1 <= k < solver.max_steps
    np.testing.assert_allclose(x, xs[k], rtol=1e-14)
    np.testing.assert_allclose(float(st.residual), rs[k - 1], rtol=1e-6, atol=1e-15)
    assert errors[k] <= 10.0  # the returned root meets the tolerance
    first_ok = next(j for j, e in enumerate(errors) if e <= 1.0)
    assert k <= first_ok + 2  # ... without wasting iterations
    if kind == "newton":
        assert k <= 6  # quadratic convergence


def test_looser_tolerance_means_fewer_iterations():
    x0 = jnp.ones(3)
    _, tight = FixedPoint().solve(cubic(A), x0, cubic_precond(x0))
    _, loose = FixedPoint(rtol=1e-4, atol=1e-4).solve(cubic(A), x0, cubic_precond(x0))
    assert bool(tight.converged) and bool(loose.converged)
    assert int(loose.iterations) < int(tight.iterations)


def test_fixed_point_without_preconditioner():
    """Plain iteration x <- x - F(x) for a contraction: F(x) = (x - cos x) / 2."""
    fn = lambda x: 0.5 * (x - jnp.cos(x))  # noqa: E731
    x, st = FixedPoint().solve(fn, jnp.zeros(2))
    np.testing.assert_allclose(x, 0.7390851332151607, rtol=1e-12)
    assert bool(st.converged)


def coupled(theta):
    """A 2-D coupled system: a circle of radius^2 theta0 meets y = theta1 - exp(x)."""
    def fn(z):
        x, y = z[0], z[1]
        return jnp.stack([x**2 + y**2 - theta[0], jnp.exp(x) + y - theta[1]])
    return fn


THETA = jnp.array([4.0, 1.0])
Z0 = jnp.array([-1.5, 1.0])


def coupled_jacobian(z):
    x, y = z[0], z[1]
    return jnp.array([[2 * x, 2 * y], [jnp.exp(x), 1.0]])


@some_solver_params
def test_coupled_2d_system(solver):
    from scipy.optimize import fsolve

    ref = fsolve(lambda z: np.asarray(coupled(THETA)(jnp.asarray(z))), np.asarray(Z0),
                 fprime=lambda z: np.asarray(coupled_jacobian(jnp.asarray(z))), xtol=1e-14)
    jinv = jnp.linalg.inv(coupled_jacobian(Z0))
    z, st = run(solver, coupled(THETA), Z0, lambda r: jinv @ r)
    assert bool(st.converged)
    np.testing.assert_allclose(z, ref, rtol=1e-11)
    assert float(jnp.max(jnp.abs(coupled(THETA)(z)))) < 1e-12


# ---------------------------------------------------------------------------------------------
# Failure modes: reported, never raised, never a false "converged"
# ---------------------------------------------------------------------------------------------


@some_solver_params
def test_iteration_cap_reports_non_convergence(solver):
    capped = type(solver)(max_steps=2, adjoint=solver.adjoint)
    x0 = jnp.ones(3)
    x, st = run(capped, cubic(A), x0, cubic_precond(x0))
    assert not bool(st.converged)
    assert int(st.iterations) == 2
    assert bool(jnp.all(jnp.isfinite(x)))
    assert float(st.residual) > 1e-3


@solver_params
def test_no_root_is_not_converged(solver):
    """x^2 + 1 = 0 has no real root: whatever the iterates do, converged must stay False."""
    fn = lambda x: x**2 + 1.0  # noqa: E731
    x0 = jnp.array([0.5, -2.0, 3.0])
    x, st = run(solver, fn, x0, lambda r: r / 2.0)
    assert not bool(st.converged)
    assert 1 <= int(st.iterations) <= solver.max_steps
    # either the cap was hit or a non-finite iterate stopped the loop
    assert int(st.iterations) == solver.max_steps or not bool(jnp.all(jnp.isfinite(x)))


@pytest.mark.parametrize("adjoint", [ImplicitAdjoint(), UnrolledAdjoint()], ids=["implicit", "unrolled"])
def test_nan_residual_stops_immediately(adjoint):
    # sqrt of a negative number: the very first residual (and iterate) is NaN
    fn = lambda x: jnp.sqrt(x) - 2.0  # noqa: E731
    x, st = Newton(adjoint=adjoint).solve(fn, jnp.array([-1.0]))
    assert not bool(st.converged)
    assert int(st.iterations) == 1
    assert bool(jnp.isnan(st.residual))


@solvers("newton", "simplified_newton", "fixed_point")
def test_nan_after_a_few_iterations(solver):
    # Newton on log x + 5 = 0 from 0.5 jumps to a negative x, where log is NaN
    fn = lambda x: jnp.log(x) + 5.0  # noqa: E731
    x0 = jnp.array([0.5])
    x, st = run(solver, fn, x0, lambda r: r * x0)  # x0 * r = J(x0)^{-1} r
    assert not bool(st.converged)
    assert int(st.iterations) < solver.max_steps  # stopped by the NaN, not the cap


def test_nan_stops_the_loop_early_in_one_component():
    """One bad component is enough to report failure for the whole solve."""
    fn = lambda x: jnp.sqrt(x) - 1.0  # noqa: E731
    x, st = Newton().solve(fn, jnp.array([0.5, -1.0, 2.0]))
    assert not bool(st.converged)
    assert int(st.iterations) == 1


@pytest.mark.parametrize("adjoint", [ImplicitAdjoint(), UnrolledAdjoint()], ids=["implicit", "unrolled"])
def test_an_iterate_that_overflows_stops_the_loop(adjoint):
    """A finite iterate and a finite increment whose difference overflows: the loop stops
    at once and reports failure (the increment's size alone, ``|dx| / (atol + rtol |x|)``, is
    0 there, so the finiteness test must look at the new iterate itself)."""
    fn = lambda x: -x  # noqa: E731  (the plain fixed point doubles x)
    x, st = FixedPoint(min_steps=0, adjoint=adjoint).solve(fn, jnp.array([1.0, 1.5e308]))
    assert not bool(st.converged)
    assert int(st.iterations) == 1


def test_damped_newton_converges_where_plain_newton_diverges():
    """arctan(x - 1) from x0 = 4: plain Newton overshoots further every step; the line search
    of Newton(damped=True) brings it home."""
    fn = lambda x: jnp.arctan(x - 1.0)  # noqa: E731
    x0 = jnp.array([4.0])
    x, st = Newton().solve(fn, x0)
    assert not bool(st.converged)
    x, st = Newton(damped=True).solve(fn, x0)
    assert bool(st.converged)
    np.testing.assert_allclose(x, 1.0, rtol=1e-13)
    # no root: the line search stalls, and that is not mistaken for convergence
    x, st = Newton(damped=True).solve(lambda x: x**2 + 1.0, jnp.array([0.5, -2.0, 3.0]))
    assert not bool(st.converged)


@pytest.mark.parametrize("adjoint", [ImplicitAdjoint(), UnrolledAdjoint()], ids=["implicit", "unrolled"])
def test_damped_newton_gradient(adjoint):
    solver = Newton(damped=True, adjoint=adjoint)

    def root(c):  # arctan(x - c) = c^3 - 1 at x = c + tan(c^3 - 1)
        return solver.solve(lambda x: jnp.arctan(x - c) - (c**3 - 1.0), jnp.array([4.0]))[0][0]

    c = 1.1
    x, dx_dc = jax.jit(jax.value_and_grad(root))(c)
    np.testing.assert_allclose(x, c + np.tan(c**3 - 1.0), rtol=1e-13)
    np.testing.assert_allclose(dx_dc, 1.0 + 3 * c**2 / np.cos(c**3 - 1.0) ** 2, rtol=1e-10)


@pytest.mark.parametrize("rate", [0.5, 0.99, 0.999])
def test_slow_contraction_is_not_declared_converged_early(rate):
    """A linearly converging iteration with rate close to 1 has tiny increments long before
    the error is small: the stopping test must account for the rate (a test on the last
    increment alone stops at an error ~ tol / (1 - rate), 1000x too large at rate 0.999)."""
    tol = 1e-10
    x, st = FixedPoint(rtol=tol, atol=tol, max_steps=50_000).solve(
        lambda x: x - 2.0, jnp.array([0.0]), lambda r: (1.0 - rate) * r)
    assert bool(st.converged)
    assert abs(float(x[0]) - 2.0) <= 10 * tol * (1.0 + 2.0)


def test_irregular_rates_do_not_stop_the_iteration_early():
    """A linear fixed point whose error components swap at every update, ``e <- A e`` with
    ``A = [[0, 0.1], [1e-4, 0]]``: the increments shrink by 0.1 and 1e-4 in turn (as a
    fixed point's can: the velocity form of ``VPRK.gauss(2)`` on the double pendulum showed
    rates 1e-3, 0.018, 4e-4).  Judged by the last rate alone, a fast update makes the
    remaining error look 1e-4 times the increment when it is 0.1 times; the stopping test
    takes the slower of the last two rates, and the returned root meets the tolerance.
    (With the last rate alone it stopped after 4 updates, 225 tolerances off; now 6.)"""
    A = jnp.array([[0.0, 0.1], [1e-4, 0.0]])
    root = jnp.array([1.0, 2.0])
    fn = lambda x: x - (root + A @ (x - root))  # noqa: E731  fixed point: x <- root + A(x - root)
    solver = FixedPoint()
    x, st = solver.solve(fn, root + jnp.array([1e-2, 1e-6]), lambda r: r)
    assert bool(st.converged)
    rtol, atol = solver.tolerances(jnp.float64)
    assert float(jnp.max(jnp.abs(x - root) / (atol + rtol * jnp.abs(root)))) <= 1.0


# ---------------------------------------------------------------------------------------------
# Gradients: implicit function theorem vs analytic derivative vs unrolled iterations
# ---------------------------------------------------------------------------------------------


def cubic_root(solver, a):
    x0 = jnp.ones_like(a)
    x, _ = run(solver, cubic(a), x0, cubic_precond(x0))
    return x


GRAD_SOLVERS = ["newton", "simplified_newton", "fixed_point"]


@pytest.mark.parametrize("kind", GRAD_SOLVERS)
def test_cubic_root_gradients(kind):
    ift, unrolled = ALL_SOLVERS[kind], ALL_SOLVERS[kind + "_unrolled"]
    w = jnp.array([0.3, -1.2, 0.7])
    analytic = w / (3.0 * ROOT**2)  # d(a^{1/3})/da = 1/(3 x^2)

    da = jnp.array([1.0, 0.5, -2.0])

    @jax.jit
    def everything(a, da):
        out = {}
        for name, solver in (("ift", ift), ("unrolled", unrolled)):
            out[name + "_grad"] = jax.grad(lambda a: jnp.vdot(w, cubic_root(solver, a)))(a)
            out[name + "_jvp"] = jax.jvp(lambda a: cubic_root(solver, a), (a,), (da,))
        return out

    out = everything(A, da)
    np.testing.assert_allclose(out["ift_grad"], analytic, rtol=1e-11)
    np.testing.assert_allclose(out["unrolled_grad"], analytic, rtol=1e-9)
    np.testing.assert_allclose(out["unrolled_grad"], out["ift_grad"], rtol=1e-9)
    # forward mode: jvp along a direction == analytic derivative times the direction
    for name in ("ift", "unrolled"):
        val, tangent = out[name + "_jvp"]
        np.testing.assert_allclose(val, ROOT, rtol=1e-12)
        np.testing.assert_allclose(tangent, da / (3.0 * ROOT**2), rtol=1e-9)


@pytest.mark.parametrize("kind", GRAD_SOLVERS)
def test_coupled_root_jacobian(kind):
    """f(z; theta) = g(z) - theta, so dz/dtheta = J(z*)^{-1} (implicit function theorem)."""
    jinv0 = jnp.linalg.inv(coupled_jacobian(Z0))

    def root(solver, theta):
        z, _ = run(solver, coupled(theta), Z0, lambda r: jinv0 @ r)
        return z

    @jax.jit
    def all_jacobians(theta):
        ift = lambda t: root(ALL_SOLVERS[kind], t)  # noqa: E731
        unrolled = lambda t: root(ALL_SOLVERS[kind + "_unrolled"], t)  # noqa: E731
        return (ift(theta), jax.jacrev(ift)(theta), jax.jacfwd(ift)(theta),
                jax.jacrev(unrolled)(theta))

    z, jac_rev, jac_fwd, jac_unrolled = all_jacobians(THETA)
    analytic = jnp.linalg.inv(coupled_jacobian(z))
    np.testing.assert_allclose(jac_rev, analytic, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(jac_fwd, analytic, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(jac_unrolled, jac_rev, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kind", GRAD_SOLVERS)
def test_the_residual_is_traced_once_per_solve(kind):
    """However many times a solve evaluates its residual (unrolled updates, the loop body,
    the value after the loop, the Jacobians of the derivative rules), the Python function is
    traced once: what a method's stage equations cost to trace is paid once per step.
    The derivatives through the traced residual are those of the closed-form root."""
    calls = []
    da = jnp.array([1.0, 0.5, -2.0])

    def residual(a):
        def f(x):
            calls.append(None)
            return x**3 - a
        return f

    def root(a):
        x0 = jnp.ones_like(a)
        x, _ = run(ALL_SOLVERS[kind], residual(a), x0, cubic_precond(x0))
        return x

    grad, (x, tangent) = jax.jit(lambda a: (jax.grad(lambda b: jnp.sum(root(b)))(a),
                                            jax.jvp(root, (a,), (da,))))(A)
    assert len(calls) == 2  # once under grad, once under jvp
    np.testing.assert_allclose(x, ROOT, rtol=1e-14)
    np.testing.assert_allclose(grad, 1.0 / (3.0 * ROOT**2), rtol=1e-12)
    np.testing.assert_allclose(tangent, da / (3.0 * ROOT**2), rtol=1e-12)


def test_gradient_through_a_closure_parameter_of_the_residual():
    """The residual closes over a scalar; jax.grad w.r.t. it is the IFT derivative."""
    def root(c):
        x, _ = Newton().solve(lambda x: x**3 + c * x - 1.0, jnp.array([1.0]))
        return x[0]

    c = 0.7
    x, dx_dc = jax.jit(jax.value_and_grad(root))(c)
    np.testing.assert_allclose(x**3 + c * x, 1.0, rtol=1e-14)
    # x^3 + c x - 1 = 0  =>  dx/dc = -x / (3x^2 + c)
    np.testing.assert_allclose(dx_dc, -x / (3 * x**2 + c), rtol=1e-12)


def test_statistics_carry_no_gradient():
    def f(a):
        _, st = Newton().solve(cubic(a), jnp.ones(3))
        return st.residual + st.iterations.astype(a.dtype)
    g = jax.grad(lambda a: f(a))(A)
    np.testing.assert_array_equal(g, jnp.zeros(3))


# ---------------------------------------------------------------------------------------------
# jit, vmap, dtypes
# ---------------------------------------------------------------------------------------------


@solvers("newton", "fixed_point_unrolled")
def test_jit_matches_eager(solver):
    eager = cubic_root(solver, A)
    jitted = jax.jit(lambda a: cubic_root(solver, a))(A)
    np.testing.assert_allclose(jitted, eager, rtol=1e-15)
    np.testing.assert_allclose(jitted, ROOT, rtol=1e-12)


@solvers("newton", "fixed_point", "fixed_point_unrolled")
def test_vmap_matches_loop_including_stats(solver):
    """Batch members needing different iteration counts keep their own results and stats."""
    batch = jnp.array([[0.8, 1.2, 1.6], [1.0, 1.0, 1.0], [0.9, 1.1, 1.3], [1.6, 1.6, 1.6]])
    x0 = jnp.ones(3)

    @jax.jit
    def solve(a):
        return run(solver, cubic(a), x0, cubic_precond(x0))

    xs, sts = jax.jit(jax.vmap(solve))(batch)
    assert xs.shape == (4, 3) and sts.iterations.shape == (4,)
    for i, a in enumerate(batch):
        x, st = solve(a)
        np.testing.assert_allclose(xs[i], x, rtol=1e-14)
        assert int(sts.iterations[i]) == int(st.iterations)
        assert bool(sts.converged[i]) == bool(st.converged)
    assert len(set(np.asarray(sts.iterations).tolist())) > 1  # genuinely different counts


def _kepler_fixed_point(e, w=1.0):
    """Kepler's equation ``E - e sin E = M`` as a fixed point preconditioned by 1: the rate is
    about ``e |cos E|``, so members of different eccentricity need very different counts.
    ``w = 0``: the residual ``-1``, whose iterates move by 1 forever (no root)."""
    return lambda x: w * (x - e * jnp.sin(x) - 1.0) + (w - 1.0)


def test_lane_compaction_keeps_every_member_its_own_loop():
    """Under vmap over enough members (64 on a CPU) the loop runs batched only while more than
    an eighth of them iterate; the rest finish in a compacted batch.  Each member's root,
    iteration count and convergence flag are those of its own solve; a member that fails is
    reported, and the compaction is really there (a second while loop in the batched
    program)."""
    es = jnp.concatenate([jnp.linspace(0.0, 0.6, 77), jnp.array([0.95, 0.99, 0.5])])
    ws = jnp.ones_like(es).at[-1].set(0.0)         # the last one has no root
    solver = FixedPoint(max_steps=400)
    solve = lambda e, w=1.0: solver.solve(_kepler_fixed_point(e, w), jnp.ones(1))  # noqa: E731
    xs, sts = jax.jit(jax.vmap(solve))(es, ws)
    counts = np.asarray(sts.iterations)[:-1]
    assert counts.max() > 2 * np.median(counts)                       # a real tail
    for i, e in enumerate(es):
        x, st = jax.jit(solve)(e, ws[i])
        np.testing.assert_allclose(xs[i], x, rtol=1e-15, atol=1e-15)
        assert int(sts.iterations[i]) == int(st.iterations)
        assert bool(sts.converged[i]) == bool(st.converged)
    assert not bool(sts.converged[-1]) and bool(np.all(np.asarray(sts.converged[:-1])))
    assert int(sts.iterations[-1]) == 400                             # ran to the cap
    loops = lambda fn, *args: while_loops(jax.make_jaxpr(fn)(*args).jaxpr)  # noqa: E731
    assert loops(jax.vmap(solve), es, ws) == 2
    assert loops(jax.vmap(solve), es[:32], ws[:32]) == 1             # too few to compact
    assert loops(solve, es[0]) == 1


def test_lane_compaction_is_not_differentiated():
    """A derivative's primal runs the plain loop (custom_vmap has its own derivative rule,
    which the second derivatives through a solve would reach): gradients of a batched solve
    are those of the single ones."""
    es = jnp.linspace(0.1, 0.9, 96)
    root = lambda e: FixedPoint().solve(_kepler_fixed_point(e), jnp.ones(1))[0][0]  # noqa: E731
    g = jax.jit(jax.vmap(jax.grad(root)))(es)
    h = jax.jit(jax.vmap(jax.grad(jax.grad(root))))(es)
    x = jax.vmap(root)(es)
    # dE/de = sin E / (1 - e cos E), and its derivative
    np.testing.assert_allclose(g, jnp.sin(x) / (1 - es * jnp.cos(x)), rtol=1e-12)
    dg = jax.vmap(jax.grad(lambda e: jnp.sin(root(e)) / (1 - e * jnp.cos(root(e)))))(es)
    np.testing.assert_allclose(h, dg, rtol=1e-10)


def test_vmap_of_grad_and_jit_of_vmap():
    batch = jnp.array([[0.5, 1.5, 2.0], [1.0, 3.0, 0.2]])
    g = jax.jit(jax.vmap(jax.grad(lambda a: jnp.sum(cubic_root(Newton(), a)))))(batch)
    np.testing.assert_allclose(g, 1.0 / (3.0 * batch ** (2.0 / 3.0)), rtol=1e-11)


def test_vmap_with_a_failing_member():
    """One batch member without a root does not spoil the others."""
    batch = jnp.array([[2.0], [-1.0], [3.0]])

    def solve(c):
        return Newton().solve(lambda x: x**2 - c, jnp.array([1.0]))

    xs, sts = jax.vmap(solve)(batch)
    np.testing.assert_array_equal(np.asarray(sts.converged), [True, False, True])
    np.testing.assert_allclose(xs[0], jnp.sqrt(2.0), rtol=1e-13)
    np.testing.assert_allclose(xs[2], jnp.sqrt(3.0), rtol=1e-13)


@some_solver_params
def test_float32_stays_float32(solver):
    a = A.astype(jnp.float32)
    x0 = jnp.ones(3, jnp.float32)
    x, st = run(solver, cubic(a), x0, cubic_precond(x0))
    assert x.dtype == jnp.float32
    assert st.residual.dtype == jnp.float32
    assert bool(st.converged)
    np.testing.assert_allclose(x, np.asarray(ROOT), rtol=1e-5)

    g = jax.jit(jax.grad(lambda a: jnp.sum(cubic_root(solver, a))))(a)
    assert g.dtype == jnp.float32
    # unrolled linear iterations stop at |dx| ~ 3e-6, so their derivative is a bit less exact
    np.testing.assert_allclose(g, 1.0 / (3.0 * np.asarray(ROOT) ** 2), rtol=1e-3)


def _noisy_linear(noise):
    """``F(x) = A x - b`` plus deterministic round-off-like noise of size ``noise`` that the
    Jacobian does not see: the situation of constraint rows ``g(Q) / h`` at small ``h``."""
    a = jnp.asarray([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]])
    b = jnp.asarray([1.0, 2.0, 3.0])

    def f(x):
        return a @ x - b + noise * jax.lax.stop_gradient(jnp.sin(1e9 * x))

    return f, np.linalg.solve(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("adjoint", [ImplicitAdjoint(), UnrolledAdjoint()], ids=["implicit", "unrolled"])
def test_a_noise_floor_far_below_the_first_increment_is_accepted(adjoint):
    """Residual noise 1e-10 stalls Newton's increments at ~1e4 x the 2.2e-15 tolerance,
    above the 1000 x floor; the iteration has still shrunk its increments by 13 orders from
    the first one, so the stall is round-off and reported as converged."""
    f, root = _noisy_linear(1e-10)
    x, st = Newton(adjoint=adjoint).solve(f, jnp.asarray([10.0, -10.0, 10.0]))
    assert bool(st.converged) and int(st.iterations) < 10
    assert np.max(np.abs(np.asarray(x) - root)) < 1e-9


def test_a_stall_far_above_round_off_is_still_reported():
    """Noise 1e-7 (a rough residual, not round-off) from a predictor 1e-3 off: the increments
    stall near 1e7 x the tolerance, far above both accepted levels, and non-convergence is
    reported."""
    f, root = _noisy_linear(1e-7)
    _, st = Newton().solve(f, jnp.asarray(root) + 1e-3)
    assert not bool(st.converged) and int(st.iterations) == Newton().max_steps


# ---------------------------------------------------------------------------------------------
# The solver contract: aux output of the last residual evaluation, adjoints as objects, and
# NaN derivatives through a failed solve
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("adjoint", [ImplicitAdjoint(), UnrolledAdjoint()],
                         ids=["implicit", "unrolled"])
@pytest.mark.parametrize("cls", [Newton, SimplifiedNewton, FixedPoint])
def test_aux_comes_from_the_last_residual_evaluation_and_differentiates_exactly(cls, adjoint):
    """``aux = 3 x^2`` computed inside the residual ``x^3 - c``: its value is that of the last
    evaluated iterate (within the tolerance of the root) and its derivative is exactly
    ``d(3 x(c)^2)/dc = 6 x x'(c) = 2 / x`` at the root ``x = c^(1/3)``."""
    solver = cls(adjoint=adjoint)

    def aux_of(c):
        def fn(x):
            r = x**3 - c
            return (r / (3 * 1.2**2) if cls is FixedPoint else r), 3 * x**2

        x, aux, st = solver.solve(fn, jnp.array([1.2]), has_aux=True)
        return aux[0], (x, st)

    c = 2.0
    (aux, (x, st)), grad = jax.value_and_grad(aux_of, has_aux=True)(c)
    assert bool(st.converged)
    root = c ** (1 / 3)
    np.testing.assert_allclose(float(x[0]), root, rtol=1e-14)
    np.testing.assert_allclose(float(aux), 3 * root**2, rtol=1e-14)
    # exact through the implicit function theorem; the unrolled iterations approximate it
    rtol = 1e-12 if isinstance(adjoint, ImplicitAdjoint) else 1e-7
    np.testing.assert_allclose(float(grad), 2 / root, rtol=rtol)
    # forward mode agrees with reverse mode
    _, tangent = jax.jvp(lambda c: aux_of(c)[0], (c,), (1.0,))
    np.testing.assert_allclose(float(tangent), 2 / root, rtol=rtol)


def test_aux_is_one_evaluation_not_a_second_solve_pass():
    """With ``has_aux`` the residual is evaluated exactly once per iteration (the aux rides
    along), counted at run time."""
    calls = []

    def fn(x):
        jax.debug.callback(lambda: calls.append(1))
        return x**2 - 2.0, 2 * x

    x, aux, st = jax.jit(lambda x0: Newton().solve(fn, x0, has_aux=True))(jnp.array([1.0]))
    jax.block_until_ready(x)
    assert len(calls) == int(st.iterations)


@pytest.mark.parametrize("adjoint", [ImplicitAdjoint(), UnrolledAdjoint()],
                         ids=["implicit", "unrolled"])
def test_derivative_through_a_failed_solve_is_nan(adjoint):
    """Two Newton iterations cannot reach the tolerance: the value is returned with
    ``converged=False`` and every derivative through it (root and aux, forward and reverse,
    under vmap) is NaN -- never a number."""
    solver = Newton(max_steps=2, adjoint=adjoint)

    def root(c):
        x, aux, st = solver.solve(lambda x: (x**2 - c, 2 * x), jnp.array([1.0]), has_aux=True)
        return x[0] + aux[0], st

    (value, st), grad = jax.value_and_grad(root, has_aux=True)(2.0)
    assert not bool(st.converged) and np.isfinite(float(value))
    assert np.isnan(float(grad))
    assert np.isnan(float(jax.jvp(lambda c: root(c)[0], (2.0,), (1.0,))[1]))
    # under vmap only the failed member's derivative is NaN: c = -1 has no real root
    def lane(c):
        return Newton(adjoint=adjoint).solve(lambda x: x**2 - c, jnp.array([1.0]))[0][0]

    grads = jax.vmap(jax.grad(lane))(jnp.array([2.0, -1.0, 3.0]))
    assert np.isnan(float(grads[1]))
    np.testing.assert_allclose(np.asarray(grads)[[0, 2]], 0.5 / np.sqrt([2.0, 3.0]),
                               rtol=1e-8)


def test_adjoint_is_an_object_not_a_flag():
    assert isinstance(Newton().adjoint, ImplicitAdjoint)
    with pytest.raises(TypeError):
        Newton(implicit_diff=False)  # the old boolean is gone: pass adjoint=UnrolledAdjoint()


# ---------------------------------------------------------------------------------------------
# Preconditioner on a residual shaped unlike the unknowns; the kappa safety factor
# ---------------------------------------------------------------------------------------------


def test_precond_receives_the_residual_structure():
    """``precond`` gets the residual pytree (here a tuple of a 2-vector and a scalar, the
    unknowns one 3-vector) and returns an increment shaped like the unknowns."""
    a = jnp.array([0.8, 1.2, 1.6])
    fn = lambda x: (x[:2] ** 3 - a[:2], x[2] ** 3 - a[2])  # noqa: E731
    seen = []

    def precond(r):
        seen.append(jax.tree_util.tree_map(jnp.shape, r))
        return jnp.concatenate([r[0], r[1][None]]) / 3.0

    x, st = FixedPoint().solve(fn, jnp.ones(3), precond)
    assert seen[0] == ((2,), ())
    assert bool(st.converged)
    np.testing.assert_allclose(x, ROOT, rtol=1e-14)


def test_smaller_kappa_stops_later_and_closer():
    """``kappa`` < 1 never stops earlier, and leaves no more error than the default."""
    x0 = jnp.ones(3)
    loose, st_loose = FixedPoint().solve(cubic(A), x0, cubic_precond(x0))
    tight, st_tight = FixedPoint(kappa=0.01).solve(cubic(A), x0, cubic_precond(x0))
    assert bool(st_tight.converged)
    assert int(st_tight.iterations) >= int(st_loose.iterations)
    assert float(jnp.max(jnp.abs(tight - ROOT))) <= max(float(jnp.max(jnp.abs(loose - ROOT))),
                                                        2e-16)
