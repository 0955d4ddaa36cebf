"""Never a silent wrong answer: every bad input, and every failed stage solve, ends in an error
that says what happened and what to change -- eagerly, under ``jax.jit`` and under
``jax.vmap``.

One table lists the bad inputs (case, how to call, expected exception, message fragments that
name the fix).  Each case runs twice:

* eagerly: the exception type and every fragment;
* under ``jax.jit``, with the case's arrays (and system) as traced arguments.  A *static* check
  (types, shapes, dtypes, Python ints) raises at trace time -- ``jax.jit(f).lower(...)`` already
  raises the same exception.  A check on *values* cannot run at trace time: the program must
  compile, and running it must raise an error whose text carries the same fragments (an
  ``equinox.error_if`` in the graph).

Then the failed-solve cases (a pendulum at dt = 1.5, a stiff spring): they raise by default,
eager, jitted and under vmap with one bad lane; ``throw=False`` returns the statistics and a
NaN derivative.  Last, the float32 fallback warning, in a subprocess without x64.
"""

import json
import os
import subprocess
import sys
import textwrap
import warnings
from typing import Callable, ClassVar, NamedTuple, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from vijax import systems as S

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py

GAUSS2 = vj.VPRK.gauss(2)
RATTLE = vj.HolonomicVPRK.rattle()
PEND = S.Pendulum()
Q0, V0 = jnp.array([1.0]), jnp.array([0.3])
# Cartesian pendulum at theta = 1, at rest: on g(q) = 0 and its hidden constraint.
CQ0, CV0 = jnp.array([np.sin(1.0), -np.cos(1.0)]), jnp.zeros(2)


def sim(system=PEND, integrator=GAUSS2, **kwargs):
    """``simulate`` with the pendulum defaults overridden by ``kwargs``; returns ``q``."""
    args = dict(q0=Q0, v0=V0, dt=0.1, n_steps=4)
    args.update(kwargs)
    return vj.simulate(system, integrator, **args).q


class OnlyFirstHasInertia(vj.LagrangianSystem):
    """L = v0^2 / 2 - q1^2 on R^2: the velocity Hessian is singular (coordinate 1 has none)."""

    def lagrangian(self, q, v):
        return 0.5 * v[0] ** 2 - q[1] ** 2


class OnlySecondHasInertia(vj.LagrangianSystem):
    """Coordinate 0 carries no inertia: a degenerate Lagrangian, not a too long q0."""

    def lagrangian(self, q, v):
        return 0.5 * v[1] ** 2 - 0.5 * jnp.vdot(q, q)


class SumVelocity(vj.LagrangianSystem):
    """L = (v0 + v1)^2 / 2 - |q|^2 / 2: singular, yet every coordinate enters the kinetic
    energy."""

    def lagrangian(self, q, v):
        return 0.5 * (v[0] + v[1]) ** 2 - 0.5 * jnp.vdot(q, q)


class Oscillator2(vj.LagrangianSystem):
    """A two-coordinate oscillator that does not declare ``ndim``."""

    def lagrangian(self, q, v):
        return 0.5 * jnp.vdot(v[:2], v[:2]) - 0.5 * jnp.vdot(q[:2], q[:2])


class VectorLagrangian(vj.LagrangianSystem):
    """A Lagrangian returning its terms per coordinate instead of their sum."""

    def lagrangian(self, q, v):
        return 0.5 * v**2 - 0.5 * q**2


class VectorMassMatrix(vj.MechanicalSystem):
    """A mass matrix given as its diagonal."""

    def mass_matrix(self, q):
        return jnp.ones(q.shape[0], q.dtype)

    def potential(self, q):
        return 0.5 * jnp.vdot(q, q)


class BoundedKinetic(vj.LagrangianSystem):
    """L = -cos(v) - q^2 / 2: the momentum sin(v) never exceeds 1."""

    ndim: ClassVar[Optional[int]] = 1

    def lagrangian(self, q, v):
        return -jnp.cos(v[0]) - 0.5 * q[0] ** 2


class StaticStiffness(vj.MechanicalSystem):
    """A parameter in a static field: not a leaf of the pytree, checked all the same."""

    k: float = eqx.field(static=True, default=1.0)

    def mass_matrix(self, q):
        return jnp.eye(q.shape[0], dtype=q.dtype)

    def potential(self, q):
        return 0.5 * self.k * jnp.vdot(q, q)


class DoubledConstraint(S.AbstractCartesianPendulum):
    """The same constraint twice: a rank-deficient constraint Jacobian."""

    ndim: ClassVar[Optional[int]] = 2

    def holonomic(self, q):
        g = 0.5 * (q @ q - self.l**2)
        return jnp.stack([g, 2 * g])


STATIC, VALUE = "static", "value"


class Case(NamedTuple):
    name: str
    call: Callable       # call(*args) performs the bad call
    args: tuple          # the arrays (and systems) that are traced under jax.jit
    exc: type            # the exception raised eagerly (and at trace time, for static checks)
    fragments: tuple     # each must appear in the message
    kind: str            # STATIC: raised at trace time under jit; VALUE: in the graph
    jit_gap: str = ""    # non-empty: under jit the check is not in the graph yet (strict xfail)
    eager_ok: bool = False  # only bad under jit (a traced int): the eager call must run


NO_INSTANCE = "pass an instance"
NAN, INF = float("nan"), float("inf")
FINITE_DT = ("dt must be positive and finite", "dt > 0")

CASES = [
    # --- types and argument order (static) ----------------------------------------------------
    Case("system-is-a-string", lambda q: sim(system="pendulum", q0=q), (Q0,), TypeError,
         ("vijax.LagrangianSystem", "str"), STATIC),
    Case("arguments-swapped", lambda q: sim(system=GAUSS2, integrator=PEND, q0=q), (Q0,),
         TypeError, ("swapped", "simulate(system, integrator"), STATIC),
    Case("system-class-not-instance", lambda q: sim(system=S.Pendulum, q0=q), (Q0,), TypeError,
         (NO_INSTANCE, "Pendulum()"), STATIC),
    Case("integrator-class-not-instance", lambda q: sim(integrator=vj.VPRK, q0=q), (Q0,),
         TypeError, (NO_INSTANCE, "vijax.VPRK."), STATIC),
    Case("integrator-is-a-tableau", lambda q: sim(integrator=vj.tableaus.gauss(2), q0=q),
         (Q0,), TypeError, ("vijax integrator", "VPRK.gauss(2)", "ButcherTableau"), STATIC),
    Case("constrained-system-unconstrained-method",
         lambda q, v: sim(system=S.CartesianPendulum(), q0=q, v0=v), (CQ0, CV0),
         vj.IncompatibleSystemError, ("does not support", "HolonomicVPRK"), STATIC),
    Case("unconstrained-system-constrained-method",
         lambda q, v: sim(integrator=RATTLE, q0=q, v0=v), (Q0, V0),
         vj.IncompatibleSystemError, ("HolonomicSystem", "vijax.VPRK"), STATIC),
    Case("general-lagrangian-for-a-mass-matrix-method",
         lambda q, v: sim(system=S.GeneralKepler(), integrator=vj.DGVI(2, kinetic_quadrature=2),
                          q0=q, v0=v), (jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0])),
         vj.IncompatibleSystemError, ("must be a vijax.MechanicalSystem", "kinetic Gauss(2)",
                                      "vijax.DGVI(1)"), STATIC),
    Case("keyword-only", lambda q, v: vj.simulate(PEND, GAUSS2, q, v, 0.1, 4), (Q0, V0),
         TypeError, ("positional",), STATIC),
    # --- shapes and dtypes (static) -----------------------------------------------------------
    Case("q0-2d", lambda q: sim(q0=q, v0=V0[None]), (jnp.ones((1, 1)),), ValueError,
         ("q0 must be a 1-D array", "shape (1, 1)", "jax.vmap"), STATIC),
    Case("q0-scalar", lambda q: sim(q0=q), (jnp.asarray(1.0),), ValueError,
         ("q0 must be a 1-D array", "shape ()"), STATIC),
    Case("v0-shape", lambda q, v: sim(system=S.HarmonicOscillator(), q0=q, v0=v),
         (jnp.ones(2), jnp.ones(3)), ValueError, ("v0 has shape (3,)", "q0 has shape (2,)"),
         STATIC),
    Case("p0-shape", lambda p: sim(v0=None, p0=p), (jnp.ones(2),), ValueError,
         ("p0 has shape (2,)", "q0 has shape (1,)"), STATIC),
    Case("q0-too-long-for-ndim", lambda q, v: sim(q0=q, v0=v), (jnp.ones(2), jnp.ones(2)),
         ValueError, ("q0 has 2 components", "ndim = 1", "pass q0 of length 1"), STATIC),
    Case("q0-too-short-for-ndim", lambda q, v: sim(system=S.DoublePendulum(), q0=q, v0=v),
         (Q0, V0), ValueError, ("q0 has 1 component ", "ndim = 2", "pass q0 of length 2"),
         STATIC),
    Case("integer-q0", lambda q: sim(q0=q), (jnp.array([1]),), TypeError,
         ("q0 has dtype int", "floating-point", "float64"), STATIC),
    Case("integer-v0", lambda v: sim(v0=v), (jnp.array([0]),), TypeError,
         ("v0 has dtype int", "floating-point"), STATIC),
    Case("dt-not-scalar", lambda dt: sim(dt=dt), (jnp.array([0.1, 0.2]),), ValueError,
         ("dt must be a scalar", "shape (2,)"), STATIC),
    Case("both-v0-and-p0", lambda q, v: sim(q0=q, v0=v, p0=v), (Q0, V0), ValueError,
         ("exactly one of v0", "p0", "both"), STATIC),
    Case("neither-v0-nor-p0", lambda q: sim(q0=q, v0=None), (Q0,), ValueError,
         ("exactly one of v0", "p0", "neither"), STATIC),
    # --- Python ints (static) -----------------------------------------------------------------
    *[Case(f"n_steps-{label}", lambda q, n=n: sim(q0=q, n_steps=n), (Q0,), ValueError,
           ("n_steps must be a positive Python int",), STATIC)
      for label, n in [("zero", 0), ("negative", -3), ("float", 10.0), ("bool", True),
                       ("str", "10")]],
    Case("n_steps-jax-array", lambda q: sim(q0=q, n_steps=jnp.asarray(12)), (Q0,), ValueError,
         ("n_steps must be a positive Python int",), STATIC),
    Case("n_steps-traced", lambda n: sim(n_steps=n), (12,), ValueError,
         ("n_steps must be a positive Python int", "static", "static_argnums",
          "static_argnames", "equinox.filter_jit"), STATIC, eager_ok=True),
    Case("save_every-traced", lambda k: sim(n_steps=12, save_every=k), (3,), ValueError,
         ("save_every must be a positive Python int", "static", "static_argnums",
          "equinox.filter_jit"), STATIC, eager_ok=True),
    Case("save_every-zero", lambda q: sim(q0=q, save_every=0), (Q0,), ValueError,
         ("save_every must be a positive Python int",), STATIC),
    Case("save_every-float", lambda q: sim(q0=q, save_every=2.0), (Q0,), ValueError,
         ("save_every must be a positive Python int",), STATIC),
    Case("n_steps-not-a-multiple", lambda q: sim(q0=q, n_steps=12, save_every=5), (Q0,),
         ValueError, ("not a multiple of save_every = 5", "n_steps = 15"), STATIC),
    # --- values: checked in the graph under jit ------------------------------------------------
    *[Case(f"dt-{label}", lambda dt: sim(dt=dt), (dt,), ValueError, FINITE_DT, VALUE)
      for label, dt in [("zero", 0.0), ("negative", -0.1), ("nan", NAN), ("inf", INF)]],
    Case("t0-nan", lambda t0: sim(t0=t0), (NAN,), ValueError,
         ("t0 contains non-finite values", "finite initial time"), VALUE),
    Case("q0-nan", lambda q: sim(q0=q), (jnp.array([NAN]),), ValueError,
         ("q0 contains non-finite values", "finite initial coordinates"), VALUE),
    Case("v0-inf", lambda v: sim(v0=v), (jnp.array([INF]),), ValueError,
         ("v0 contains non-finite values", "finite initial velocities"), VALUE),
    Case("p0-nan", lambda p: sim(v0=None, p0=p), (jnp.array([NAN]),), ValueError,
         ("p0 contains non-finite values", "finite initial momenta"), VALUE),
    Case("parameter-l-nan", lambda s: sim(system=s), (S.Pendulum(l=NAN),), ValueError,
         ("Pendulum.l is not finite", "pass a finite value for Pendulum.l"), VALUE),
    Case("parameter-g-nan", lambda s: sim(system=s), (S.Pendulum(g=NAN),), ValueError,
         ("Pendulum.g is not finite", "pass a finite value for Pendulum.g"), VALUE),
    Case("parameter-m-inf-with-p0", lambda s: sim(system=s, v0=None, p0=V0),
         (S.Pendulum(m=INF),), ValueError, ("Pendulum.m is not finite",), VALUE),
    Case("parameter-of-a-constrained-system", lambda s: sim(system=s, integrator=RATTLE,
                                                            q0=CQ0, v0=CV0),
         (S.CartesianPendulum(gravity=NAN),), ValueError, ("CartesianPendulum.gravity",),
         VALUE),
    Case("singular-hessian", lambda q, v: sim(system=OnlyFirstHasInertia(), q0=q, v0=v),
         (jnp.array([1.0, 0.5]), jnp.zeros(2)), ValueError,
         ("d2L/dv2", "singular", "coordinates [1] of q0 (length 2) do not enter the kinetic "
          "energy", "every coordinate needs inertia"), VALUE),
    Case("singular-hessian-from-p0", lambda q, p: sim(system=OnlyFirstHasInertia(), q0=q,
                                                      v0=None, p0=p),
         (jnp.array([1.0, 0.5]), jnp.array([0.3, 0.0])), ValueError,
         ("d2L/dv2", "singular", "coordinates [1] of q0"), VALUE),
    Case("q0-too-long-without-ndim", lambda q, v: sim(system=Oscillator2(), q0=q, v0=v),
         (jnp.ones(3), jnp.zeros(3)), ValueError,
         ("coordinates [2] of q0 (length 3) do not enter the kinetic energy",
          "if the system has 2 coordinates pass q0 of length 2", "declare `ndim`"), VALUE),
    Case("no-inertia-in-a-leading-coordinate",
         lambda q, v: sim(system=OnlySecondHasInertia(), q0=q, v0=v),
         (jnp.array([0.1, 0.2]), jnp.zeros(2)), ValueError,
         ("d2L/dv2", "singular at the initial state", "every coordinate needs inertia"), VALUE),
    Case("singular-hessian-no-zero-row", lambda q, v: sim(system=SumVelocity(), q0=q, v0=v),
         (jnp.array([0.1, 0.2]), jnp.zeros(2)), ValueError,
         ("d2L/dv2", "singular at the initial state", "every coordinate needs inertia"), VALUE),
    # --- constrained initial data (the integrators' check_initial) -----------------------------
    *[Case(f"q0-off-the-constraint-{label}", lambda q, integ=integ: sim(
        system=S.CartesianPendulum(), integrator=integ, q0=q, v0=CV0), (1.01 * CQ0,),
        vj.constraints.InconsistentInitialData, ("project_position", "project=True"), VALUE)
      for label, integ in [("rattle", RATTLE), ("galerkin", vj.GalerkinVI.gauss(2)),
                           ("dg", vj.DGVI(2))]],
    Case("v0-off-the-hidden-constraint", lambda v: sim(system=S.CartesianPendulum(),
                                                       integrator=RATTLE, q0=CQ0, v0=v),
         (jnp.array([1.0, 1.0]),), vj.constraints.InconsistentInitialData,
         ("project_velocity", "project=True"), VALUE),
    Case("rank-deficient-constraints", lambda q: sim(system=DoubledConstraint(),
                                                     integrator=RATTLE, q0=q, v0=CV0),
         (CQ0,), ValueError, ("rank deficiency", "Remove redundant constraints"), VALUE),
    # --- dense output (static) ----------------------------------------------------------------
    Case("dense-output-of-a-non-collocation-prk", lambda q: sim(q0=q, dense=True, integrator=vj.VPRK(
        vj.tableaus.symplectic_pair(vj.tableaus.lobatto_iiib(3)))), (Q0,), ValueError,
         ("collocation", "dense=False"), STATIC),
    # --- method construction (static) ---------------------------------------------------------
    Case("non-symplectic-tableau-pair", lambda q: sim(q0=q, integrator=vj.VPRK(
        vj.tableaus.PartitionedTableau(q=vj.tableaus.lobatto_iiia(3),
                                       p=vj.tableaus.lobatto_iiia(3), name="bad", order=4))),
         (Q0,), ValueError, ("symplectic-conjugate", "symplectic_pair"), STATIC),
    Case("gauss-for-constraints", lambda q: sim(q0=q, integrator=vj.HolonomicVPRK(
        vj.tableaus.gauss(2))), (Q0,), ValueError, ("a_1j = 0",), STATIC),
    Case("p0-outside-the-range-of-the-legendre-map",
         lambda q, p: vj.simulate(BoundedKinetic(), GAUSS2, q0=q, p0=p, dt=1e-4, n_steps=3).q,
         (jnp.array([0.1]), jnp.array([2.0])), ValueError,
         ("inverse Legendre map of BoundedKinetic failed", "outside the range",
          "Pass v0 instead of p0"), VALUE),
    Case("clock-does-not-advance", lambda q, v, d, t: sim(q0=q, v0=v, dt=d, t0=t),
         (Q0.astype(jnp.float32), V0.astype(jnp.float32), jnp.float32(0.1), jnp.float32(1e8)),
         ValueError, ("below the resolution of t0", "clock would not advance"), VALUE),
    Case("nan-in-a-static-field", lambda q: sim(system=StaticStiffness(k=NAN), q0=q), (Q0,),
         ValueError, ("StaticStiffness.k is not finite", "pass a finite value"), STATIC),
    # --- what the user's model returns (static: jax.eval_shape) -------------------------------
    Case("lagrangian-not-a-scalar", lambda q, v: sim(system=VectorLagrangian(), q0=q, v0=v),
         (jnp.ones(2), jnp.zeros(2)), ValueError,
         ("VectorLagrangian.lagrangian(q, v) returned shape (2,)", "real scalar"), STATIC),
    Case("mass-matrix-as-a-vector", lambda q, v: sim(system=VectorMassMatrix(), q0=q, v0=v),
         (jnp.ones(2), jnp.zeros(2)), ValueError,
         ("VectorMassMatrix.mass_matrix(q) returned shape (2,)", "2 x 2 mass matrix"), STATIC),
    # --- dtypes a run cannot compute in, solver settings (static) ------------------------------
    Case("half-precision-q0", lambda q, v: sim(q0=q, v0=v),
         (Q0.astype(jnp.float16), V0.astype(jnp.float16)), TypeError,
         ("float16", "float32 or float64"), STATIC),
    Case("complex-dt", lambda d: sim(dt=d), (jnp.asarray(0.1 + 0.5j),), TypeError,
         ("dt has dtype complex", "real number"), STATIC),
    Case("boolean-t0", lambda t: sim(t0=t), (jnp.asarray(True),), TypeError,
         ("t0 has dtype bool", "real number"), STATIC),
    Case("solver-class-not-instance", lambda q: sim(q0=q, integrator=vj.HolonomicVPRK(
        RATTLE.tableau, solver=vj.solvers.Newton), system=S.CartesianPendulum()), (CQ0,),
         TypeError, (NO_INSTANCE, "solver=Newton()"), STATIC),
    Case("solver-without-iterations", lambda q: sim(q0=q, integrator=vj.VPRK.gauss(
        2, solver=vj.solvers.FixedPoint(max_steps=0))), (Q0,), ValueError,
         ("max_steps must be an int >= 1",), STATIC),
    Case("solver-negative-tolerance", lambda q: sim(q0=q, integrator=vj.VPRK.gauss(
        2, solver=vj.solvers.FixedPoint(rtol=-1.0))), (Q0,), ValueError,
         ("rtol must be a finite number >= 0",), STATIC),
]


def _check_message(message, case):
    for fragment in case.fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    if case.kind == VALUE:
        assert "did not converge" not in message  # the cause, not a symptom downstream


def test_the_table_has_no_duplicate_names():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_eager(case):
    if case.eager_ok:
        assert bool(jnp.all(jnp.isfinite(case.call(*case.args))))
        return
    with pytest.raises(case.exc) as info:
        case.call(*case.args)
    _check_message(str(info.value), case)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_under_jit(case, request):
    if case.jit_gap:
        request.applymarker(pytest.mark.xfail(reason=case.jit_gap, strict=True))
    jitted = jax.jit(case.call)
    if case.kind == STATIC:
        with pytest.raises(case.exc) as info:
            jitted.lower(*case.args)  # at trace time: nothing was compiled or run
        _check_message(str(info.value), case)
        return
    jitted.lower(*case.args)  # traces and lowers: the check is in the graph
    with pytest.raises(Exception) as info:
        jax.block_until_ready(jitted(*case.args))
    _check_message(str(info.value), case)


@pytest.mark.parametrize("wrt", ["q0", "dt", "parameter"])
def test_derivatives_without_jit_name_the_bad_input(wrt):
    """Under jax.grad without jit a check's flag can be concrete while the values it was
    computed from are tracers: the check raises its own message, not JAX's conversion error
    from formatting a tracer into it."""
    loss = {
        "q0": lambda x: sim(q0=x)[-1, 0],
        "dt": lambda x: sim(dt=x)[-1, 0],
        "parameter": lambda x: sim(system=S.Pendulum(l=x))[-1, 0],
    }[wrt]
    bad = {"q0": jnp.array([NAN]), "dt": -0.1, "parameter": NAN}[wrt]
    fragment = {"q0": "q0 contains non-finite", "dt": FINITE_DT[0],
                "parameter": "Pendulum.l is not finite"}[wrt]
    with pytest.raises(ValueError, match=fragment):
        jax.grad(loss)(bad)


def test_ensemble_clock_follows_q0():
    """simulate_ensemble computes in q0's dtype, as simulate does: a float32 v0 beside a
    float64 q0 does not put the clock in float32."""
    q0 = jnp.linspace(0.1, 1.0, 4)[:, None]
    sol = vj.simulate_ensemble(PEND, GAUSS2, q0=q0, v0=jnp.zeros((4, 1), jnp.float32), dt=0.1,
                               n_steps=10, batch_size=np.int64(2))
    assert sol.t.dtype == jnp.float64 and float(sol.t[0, -1]) == 1.0


def test_in_graph_checks_under_filter_jit_raise_equinox_runtime_error():
    """Under equinox.filter_jit the in-graph message arrives without XLA's wrapping."""
    with pytest.raises(eqx.EquinoxRuntimeError, match="dt must be positive and finite"):
        jax.block_until_ready(eqx.filter_jit(lambda dt: sim(dt=dt))(-0.1))
    with pytest.raises(eqx.EquinoxRuntimeError, match="Pendulum.l is not finite"):
        jax.block_until_ready(eqx.filter_jit(lambda s: sim(system=s))(
            S.Pendulum(l=jnp.asarray(NAN))))  # (a Python float field would be static)
    # and a static int under filter_jit stays static
    q = eqx.filter_jit(lambda n: sim(n_steps=n))(4)
    assert q.shape == (5, 1)


def test_in_graph_checks_under_vmap_fail_the_whole_call():
    dts = jnp.array([0.1, -0.1, 0.1])
    with pytest.raises(Exception, match="dt must be positive and finite"):
        jax.block_until_ready(jax.vmap(lambda dt: sim(dt=dt))(dts))
    with pytest.raises(Exception, match="dt must be positive and finite"):
        jax.block_until_ready(jax.jit(jax.vmap(lambda dt: sim(dt=dt)))(dts))
    ok = jax.vmap(lambda dt: sim(dt=dt))(jnp.array([0.1, 0.05]))
    assert ok.shape == (2, 5, 1) and bool(jnp.all(jnp.isfinite(ok)))


def test_the_checks_do_not_change_results_or_gradients():
    """Every check returns its input unchanged: the checked run under jit equals the eager run,
    and derivatives flow through the checks."""
    run = lambda q0, dt, l: sim(system=S.Pendulum(l=l), q0=q0, dt=dt)[-1, 0]  # noqa: E731
    args = (Q0, 0.1, 1.3)
    assert float(jax.jit(run)(*args)) == float(run(*args))
    grads = jax.grad(run, argnums=(0, 1, 2))(*args)
    eps = 1e-6
    fd = (run(Q0, 0.1, 1.3 + eps) - run(Q0, 0.1, 1.3 - eps)) / (2 * eps)
    np.testing.assert_allclose(grads[2], fd, rtol=1e-6)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def test_too_short_q0_without_ndim_is_not_detectable():
    """What is not caught: a q0 shorter than the coordinates the Lagrangian indexes.  JAX
    clamps out-of-range indices (v[1] of a length-1 v reads v[0]), so the Lagrangian is a valid,
    regular function of the short q0 and nothing distinguishes it from a one-coordinate
    system.  Declaring ``ndim`` on the system has the length checked (case
    q0-too-short-for-ndim)."""
    q = sim(system=Oscillator2(), q0=jnp.ones(1), v0=jnp.zeros(1))
    assert q.shape == (5, 1) and bool(jnp.all(jnp.isfinite(q)))


# ---------------------------------------------------------------------------------------------
# Failed stage solves: raised by default (throw=True), eager, jitted and under vmap
# ---------------------------------------------------------------------------------------------

FAILED = {
    # the pendulum at dt = 1.5 (a third of its period): the fixed-point iteration diverges
    "pendulum-dt-1.5": (S.Pendulum(), jnp.array([1.0]), jnp.array([0.0]), 1.5, 0.1),
    # a stiff spring (h^2 k = 1e4): the fixed-point iteration diverges to overflow
    "stiff-spring": (S.HarmonicOscillator(k=1e6), jnp.array([1.0]), jnp.array([0.0]), 0.1,
                     1e-4),
}
ADVICE = ("did not converge", "Reduce dt", "solver=vijax.solvers.Newton()", "throw=False",
          "sol.stats")


def failing(name, dt=None, throw=True):
    system, q0, v0, bad_dt, _ = FAILED[name]
    return vj.simulate(system, GAUSS2, q0=q0, v0=v0, dt=bad_dt if dt is None else dt,
                       n_steps=10, throw=throw)


@pytest.mark.parametrize("name", FAILED)
def test_failed_solve_raises_by_default_eagerly_naming_the_step(name):
    with pytest.raises(vj.ConvergenceError) as info:
        failing(name)
    message = str(info.value)
    for fragment in ("at step 0", "(t = 0;", "residual", *ADVICE):
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize("name", FAILED)
def test_failed_solve_raises_under_jit(name):
    run = jax.jit(lambda dt: failing(name, dt).q)
    with pytest.raises(Exception) as info:
        jax.block_until_ready(run(FAILED[name][3]))
    for fragment in ADVICE:
        assert fragment in str(info.value), (fragment, str(info.value))
    with pytest.raises(eqx.EquinoxRuntimeError, match="did not converge"):
        jax.block_until_ready(eqx.filter_jit(lambda dt: failing(name, dt).q)(FAILED[name][3]))
    # the same program with a good step runs
    good = run(FAILED[name][4])
    assert bool(jnp.all(jnp.isfinite(good)))


@pytest.mark.parametrize("name", FAILED)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_one_failed_lane_fails_the_vmapped_call(name, jit):
    _, _, _, bad, good = FAILED[name]
    dts = jnp.array([good, bad, good])
    run = jax.vmap(lambda dt: failing(name, dt).q)
    run = jax.jit(run) if jit else run
    with pytest.raises(Exception, match="did not converge"):
        jax.block_until_ready(run(dts))
    # with throw=False every lane comes back with its own statistics
    def lane(dt):
        stats = failing(name, dt, throw=False).stats
        return stats.all_converged, stats.first_failure

    converged, first = jax.vmap(lane)(dts)
    np.testing.assert_array_equal(converged, [True, False, True])
    np.testing.assert_array_equal(first, [-1, 0, -1])


@pytest.mark.parametrize("name", FAILED)
def test_throw_false_returns_the_statistics(name):
    sol = failing(name, throw=False)
    assert not bool(sol.stats.all_converged)
    assert int(sol.stats.first_failure) == 0
    assert not bool(sol.stats.converged[0])
    jitted = jax.jit(lambda dt: failing(name, dt, throw=False).stats)(FAILED[name][3])
    np.testing.assert_array_equal(jitted.converged, sol.stats.converged)
    np.testing.assert_array_equal(jitted.failed_step, sol.stats.failed_step)


def test_gradient_through_a_failed_run_is_nan():
    """With throw=False a failed run is returned, but its derivative is NaN, never a number;
    with the default the gradient computation raises."""
    def loss(g, dt, throw):
        return vj.simulate(S.Pendulum(g=g), GAUSS2, q0=jnp.array([1.0]), v0=jnp.array([0.0]),
                           dt=dt, n_steps=10, throw=throw).q[-1, 0]

    healthy = jax.grad(loss)(9.81, 0.1, True)
    assert np.isfinite(float(healthy)) and float(healthy) != 0.0
    for grad in (jax.grad(loss), jax.jit(jax.grad(loss), static_argnums=2)):
        value = grad(9.81, 1.5, False)
        assert np.isnan(float(value)), value
    with pytest.raises(vj.ConvergenceError, match="did not converge"):
        jax.grad(loss)(9.81, 1.5, True)
    with pytest.raises(Exception, match="did not converge"):
        jax.block_until_ready(jax.jit(jax.grad(loss), static_argnums=2)(9.81, 1.5, True))


# ---------------------------------------------------------------------------------------------
# float64 input without x64: a warning, once per process
# ---------------------------------------------------------------------------------------------

_PRECISION_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import jax, jax.numpy as jnp
    import vijax as vj

    assert not jax.config.jax_enable_x64
    P, G = vj.systems.Pendulum(), vj.VPRK.gauss(2)
    run = lambda **kw: vj.simulate(P, G, dt=0.1, n_steps=2, **kw)
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(q0=np.array([1.0], np.float32), v0=np.zeros(1, np.float32))  # float32 on purpose
        run(q0=jnp.array([1.0]), v0=jnp.zeros(1))                         # already JAX arrays
        vj.simulate(P, G, q0=jnp.array([1.0]), v0=jnp.zeros(1), dt=0.05, n_steps=2)  # float dt
        out["before"] = len(caught)
        if sys.argv[1] == "ensemble":
            sol = vj.simulate_ensemble(P, G, q0=np.array([[1.0]]), v0=np.zeros((1, 1)), dt=0.1,
                                       n_steps=2)
        else:
            sol = run(q0=sys.argv[1] == "list" and [1.0] or np.array([1.0]), v0=np.zeros(1))
        out["dtype"] = str(sol.q.dtype)
        run(q0=np.array([1.0]), v0=np.zeros(1))                           # once per process
        out["messages"] = [str(w.message) for w in caught]
        out["categories"] = [w.category.__name__ for w in caught]
        out["is_user_warning"] = all(issubclass(w.category, UserWarning) for w in caught)
        out["exported"] = all(w.category is vj.PrecisionWarning for w in caught)
        out["filename"] = [w.filename for w in caught]
    print(json.dumps(out))
""")


@pytest.mark.parametrize("form", ["numpy", "list", "ensemble"])
def test_float64_input_without_x64_warns_once(form, tmp_path):
    script = tmp_path / "precision.py"
    script.write_text(_PRECISION_SCRIPT)
    env = dict(os.environ, JAX_ENABLE_X64="0", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(vj.__file__)), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(script), form], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] == 0          # no warning for float32 or JAX input
    assert out["dtype"] == "float32"   # what the warning is about
    assert len(out["messages"]) == 1, out["messages"]
    message = out["messages"][0]
    assert 'jax.config.update("jax_enable_x64", True)' in message
    assert "float32" in message and "q0" in message
    assert out["categories"] == ["PrecisionWarning"] and out["is_user_warning"]
    assert out["exported"]
    assert out["filename"] == [str(script)]  # points at the user's call


def test_no_precision_warning_with_x64():
    assert jax.config.jax_enable_x64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim(q0=np.array([1.0]), v0=np.array([0.3]), dt=np.float64(0.1))
    assert issubclass(vj.PrecisionWarning, UserWarning)
