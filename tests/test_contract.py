"""The integrator contract, run on every preset of every family.

The presets come from the package itself (:func:`vijax.integrators.registry`), so a new family
or preset is checked without touching this file.  Each preset runs on a small nonlinear
problem it accepts: Hénon--Heiles (unconstrained, two degrees of freedom; a configuration-
dependent mass matrix, as in the double pendulum, doubles every compilation), the Cartesian
pendulum with a nonlinear spring (holonomically constrained; ``tests/helpers.py``) and the
nonholonomic particle (``Φ = v_z - y v_x``, for the nonholonomic families).  A family that
accepts two runs its first preset on both.  The clauses:

* shapes and dtypes of the :class:`~vijax.Solution` of a short run with ``save_every > 1``;
* ``jax.jit(simulate)`` equals eager ``simulate`` (the first preset of each code path, below);
* ``jax.vmap`` over three initial conditions equals a Python loop (the first preset of each
  family, on each problem it accepts: batching is family code);
* the gradient (``jax.grad`` of a scalar loss of the final state with respect to initial data
  and a system parameter) against central differences, and forward mode against it
  (``jax.jvp``: :func:`test_forward_mode_equals_reverse_mode`, a test of its own), on the
  first preset of each code path on each problem.  A code
  path is a family with its named options and solver type (:func:`_variant`: the discrete
  gradient, the formulation, the quadrature family, the mode); presets of one path differ
  only in numbers (stages, coefficients), which reach the compiled programs as constants,
  while the jitted gradient program is most of a case's cost;
* a float32 run stays float32, finite and converged (no silent float64, no NaN; the first
  preset of each family, as for vmap);
* one step is symplectic (:func:`vijax.diagnostics.symplecticity_defect`: on ``T^*C`` for the
  constrained problem), for every method whose trait says so; a damped method is caught;
* a system the method cannot take raises :class:`vijax.IncompatibleSystemError` naming a
  method that accepts it.

The default suite runs the first preset of each family on every problem it accepts (every
clause); the other presets and code paths of a family are marked ``extended``: ``make
test-extended`` runs them, and CI runs it after the default suite, so every preset is still
checked on every change.

Cost is compilation (every run takes milliseconds), so each case is one test whose clauses
share its compilations: the eager run (one compilation of ``simulate``'s scan, reused by the
Python loop and the finite differences) and one jitted program that returns the Solution with
the loss, its gradient and its directional derivative (read by the jit, AD-mode and
finite-difference clauses).  One test per case keeps them in one process under pytest-xdist,
which distributes tests, not fixtures; XLA's optimisation passes are off for this module.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import SpringPendulum

import vijax as vj

N_STEPS, SAVE_EVERY, DT = 4, 2, 0.05
N_SAVES = N_STEPS // SAVE_EVERY
REGISTRY = vj.integrators.registry()


# --------------------------------------------------------------------------------------------
# Problems: parameters x = (a datum of q0, a datum of v0, a system parameter)
# --------------------------------------------------------------------------------------------
def _henon_heiles(x):
    q0 = jnp.stack([x[0], jnp.asarray(0.1, x.dtype)])
    v0 = jnp.stack([jnp.asarray(0.2, x.dtype), x[1]])
    return vj.systems.HenonHeiles(lam=x[2]), q0, v0


def _spring_pendulum(x):
    theta, omega, length = x[0], x[1], x[2]
    q0 = length * jnp.stack([jnp.sin(theta), -jnp.cos(theta)])
    v0 = length * omega * jnp.stack([jnp.cos(theta), jnp.sin(theta)])
    return SpringPendulum(k=5.0, l=length), q0, v0


def _heavy_top(x):
    tilt, spin, mass = x[0], x[1], x[2]
    zero = jnp.zeros((), x.dtype)
    g0 = vj.lie.SO3().exp(jnp.stack([tilt, zero, zero]))
    xi0 = jnp.stack([jnp.asarray(0.3, x.dtype), jnp.asarray(-0.2, x.dtype), spin])
    return vj.systems.HeavyTop(mass=mass), g0, xi0


def _unicycle(x):
    x0, v1, m = x[0], x[1], x[2]
    g0 = vj.systems.Unicycle.element(x0, 0.2, 0.3).astype(x.dtype)
    xi0 = jnp.stack([v1, jnp.zeros((), x.dtype), jnp.asarray(0.8, x.dtype)])   # on φ = v2 = 0
    return vj.systems.Unicycle(m=m), g0, xi0


def _nonholonomic_particle(x):
    y0, vx, k = x[0], x[1], x[2]
    q0 = jnp.stack([jnp.asarray(0.2, x.dtype), y0, jnp.asarray(0.0, x.dtype)])
    v0 = jnp.stack([vx, jnp.asarray(0.5, x.dtype), y0 * vx])   # on Φ = v_z - y v_x = 0
    return vj.systems.NonholonomicParticle(k=k), q0, v0


class Problem(NamedTuple):
    name: str
    make: Callable          # x -> (system, q0, v0); consistent initial data for every x
    x: tuple                # base parameters
    batch: tuple            # three parameter vectors differing in the initial data only
    loss_weights: tuple     # the loss is w_q . q_N + w_p . p_N

    @property
    def system(self):
        return self.make(jnp.asarray(self.x))[0]


# Bounded orbits (energy below the escape energy 1/6 for lam = 1).
HENON_HEILES = Problem("henon_heiles", _henon_heiles, (0.3, 0.25, 1.0),
                       ((0.3, 0.25, 1.0), (0.1, -0.2, 1.0), (-0.2, 0.3, 1.0)),
                       ((1.0, -0.5), (0.3, 0.8)))
SPRING_PENDULUM = Problem("spring_pendulum", _spring_pendulum, (1.0, 0.5, 1.2),
                          ((1.0, 0.5, 1.2), (0.4, -0.8, 1.2), (1.5, 0.1, 1.2)),
                          ((1.0, -0.5), (0.3, 0.8)))
NONHOLONOMIC_PARTICLE = Problem("nonholonomic_particle", _nonholonomic_particle,
                                (1.0, 1.0, 1.2), ((1.0, 1.0, 1.2), (0.5, -0.7, 1.2),
                                                  (-0.4, 0.6, 1.2)),
                                ((1.0, -0.5), (0.3, 0.8)))
# On Lie groups: the heavy top on SO(3) (unconstrained) and the unicycle on SE(2)
# (nonholonomic); q is the group element (the loss reads its first row).
HEAVY_TOP = Problem("heavy_top", _heavy_top, (0.4, 1.5, 1.2),
                    ((0.4, 1.5, 1.2), (0.2, -1.0, 1.2), (0.7, 2.0, 1.2)),
                    ((1.0, -0.5), (0.3, 0.8)))
UNICYCLE = Problem("unicycle", _unicycle, (1.0, 0.5, 1.2),
                   ((1.0, 0.5, 1.2), (0.6, -0.3, 1.2), (1.3, 0.9, 1.2)),
                   ((1.0, -0.5), (0.3, 0.8)))
PROBLEMS = (HENON_HEILES, SPRING_PENDULUM, NONHOLONOMIC_PARTICLE, HEAVY_TOP, UNICYCLE)


def _variant(integ):
    """What selects an integrator's code path: its family, its named options (string fields:
    the discrete gradient, the formulation, the quadrature family, the mode) and the types of
    its components (the root solver).  Presets of one variant differ only in numbers (stage
    counts, tableau coefficients, node counts), which the compiled programs take as
    constants."""
    key = [type(integ)]
    for field in dataclasses.fields(integ):
        value = getattr(integ, field.name)
        if isinstance(value, str):
            key.append((field.name, value))
        elif not isinstance(value, (int, float, np.ndarray, jax.Array)):
            key.append((field.name, type(value)))
    return tuple(key)


def _cases():
    """(preset, problem, first, new_variant) cases: every accepted problem for the first
    preset of a family, the constrained one only (when accepted) for the others.  Presets that
    are the same method (``VPRK.midpoint()`` and ``VPRK.gauss(1)``, ...) form one case, named
    by all their calls.  ``new_variant``: the first preset of its code path
    (:func:`_variant`)."""
    names = {}
    for call, integ in REGISTRY:
        names.setdefault(integ, []).append(call)
    cases, seen, variants = [], set(), set()
    for integ, calls in names.items():
        accepted = [p for p in PROBLEMS if integ.accepts(p.system)]
        family = type(integ)
        if family in seen and len(accepted) > 1:
            accepted = [p for p in accepted
                        if isinstance(p.system, (vj.HolonomicSystem, vj.NonholonomicSystem))]
        first = family not in seen
        seen.add(family)
        for p in accepted:
            variant = (_variant(integ), p.name)
            cases.append((" | ".join(calls), integ, p, first, variant not in variants))
            variants.add(variant)
    return cases


CASES = _cases()


def _run(problem, integ, x):
    system, q0, v0 = problem.make(x)
    return vj.simulate(system, integ, q0=q0, v0=v0, dt=DT, n_steps=N_STEPS,
                       save_every=SAVE_EVERY)


def _loss(problem, q, p):
    """``w_q . q_N + w_p . p_N`` from the final ``q``, ``p`` (traced or numpy; a group
    element is read row by row)."""
    wq, wp = problem.loss_weights
    q = q.reshape(-1)
    return sum(w * q[i] for i, w in enumerate(wq)) + sum(w * p[i] for i, w in enumerate(wp))


def _eager_loss(problem, sol):
    return float(_loss(problem, np.asarray(sol.q)[-1], np.asarray(sol.p)[-1]))


class Jitted(NamedTuple):
    sol: vj.Solution
    loss: jax.Array
    grad: jax.Array


DIRECTION = (0.3, -0.7, 0.5)


def _loss_and_sol(problem, integ, x):
    sol = _run(problem, integ, x)
    return _loss(problem, sol.q[-1], sol.p[-1]), sol


def _jitted_program(problem, integ):
    """The case's jitted program: ``x -> (Solution, loss, grad)``."""

    def program(x):
        (value, sol), grad = jax.value_and_grad(
            lambda y: _loss_and_sol(problem, integ, y), has_aux=True)(x)
        return Jitted(sol, value, grad)

    return jax.jit(program)


class Case:
    """One preset on one problem; its eager run and its jitted program are computed once and
    shared by the clauses."""

    def __init__(self, call, integ, problem, first=True, new_variant=True):
        self.call, self.integ, self.problem, self.first = call, integ, problem, first
        self.new_variant = new_variant
        self.x = jnp.asarray(problem.x)
        self.system = problem.make(self.x)[0]

    def run(self, x):
        return _run(self.problem, self.integ, x)

    @functools.cached_property
    def sol(self) -> vj.Solution:
        """Eager ``simulate`` at ``x``."""
        return self.run(self.x)

    @functools.cached_property
    def jitted(self) -> Jitted:
        return _jitted_program(self.problem, self.integ)(self.x)


def _assert_same_solution(a, b, what):
    """Two runs of one program under different transformations (jit, vmap): ``t, q, v, p``
    to 1e-12; the solver statistics identical (the residual, a round-off-level number, to
    1e-8), except the iteration counts, which may differ by 2 + 25 %: a fixed-point solve stops at
    the round-off floor once its increments stop shrinking, and when that happens depends on
    round-off, which differs between compiled programs (seen with JAX 0.11 on the
    constrained methods' default solver: 10 against 8, 18 against 14 updates in a block, identical
    trajectories); the states' internal fields (stage values, multipliers) to 1e-10: the
    stage multipliers of the high-order constrained schemes amplify round-off (measured up to
    7e-12 on GalerkinVI.gauss(4), where q and p agree to 2e-16)."""
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), what
    for (path, la), lb in zip(jax.tree_util.tree_leaves_with_path(a),
                              jax.tree_util.tree_leaves(b)):
        name = jax.tree_util.keystr(path)
        la, lb = np.asarray(la), np.asarray(lb)
        assert la.dtype == lb.dtype and la.shape == lb.shape, (what, name)
        if name in (".stats.iterations", ".stats.max_iterations"):
            diff = np.abs(la.astype(int) - lb.astype(int))
            assert np.all(diff <= 2 + 0.25 * np.abs(lb)), (what, name, la, lb)
            continue
        if not np.issubdtype(la.dtype, np.floating):
            np.testing.assert_array_equal(la, lb, err_msg=f"{what}: {name}")
            continue
        tol = (1e-12 if name in (".t", ".q", ".v", ".p") else
               1e-8 if name == ".stats.residual" else 1e-10)
        np.testing.assert_allclose(la, lb, rtol=tol, atol=tol, err_msg=f"{what}: {name}")


_symplectic_forms = eqx.filter_jit(vj.diagnostics.symplectic_forms)


# XLA's optimisation passes off (tests/conftest.py): the cost of this module is compiling about
# 150 small programs (each run takes milliseconds), and the clauses compare programs with each
# other and with finite differences, which optimisation changes only by round-off.
pytestmark = pytest.mark.fast_compile


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------
def test_registry_covers_every_family_and_its_calls_build_the_presets():
    families = {type(m) for _, m in REGISTRY}
    assert families >= {vj.VPRK, vj.HolonomicVPRK, vj.GalerkinVI, vj.DGVI, vj.CGVI,
                        vj.NonholonomicVPRK, vj.DiscreteGradient, vj.DiscreteLagrangeDAlembert,
                        vj.GroupVPRK}
    for call, integ in REGISTRY:
        assert eval(f"vj.{call}") == integ, call
    assert len({c for c, _ in REGISTRY}) == len(REGISTRY)
    # every preset runs on at least one problem below
    assert {c for calls, *_ in CASES for c in calls.split(" | ")} == {c for c, _ in REGISTRY}


# --------------------------------------------------------------------------------------------
# The contract, per case
# --------------------------------------------------------------------------------------------
def check_solution_shapes_and_dtypes(case):
    sol, integ = case.sol, case.integ
    _, q0, v0 = case.problem.make(case.x)
    n, f64 = v0.shape[0], jnp.float64
    assert sol.n_steps == N_STEPS
    assert sol.t.shape == (N_SAVES + 1,) and sol.t.dtype == f64
    np.testing.assert_allclose(sol.t, DT * SAVE_EVERY * np.arange(N_SAVES + 1), rtol=1e-15)
    assert sol.q.shape == (N_SAVES + 1,) + q0.shape and sol.q.dtype == f64
    for field in (sol.v, sol.p):
        assert field.shape == (N_SAVES + 1, n) and field.dtype == f64
    np.testing.assert_array_equal(sol.q[0], q0)
    np.testing.assert_allclose(sol.v[0], v0, rtol=1e-13, atol=1e-13)
    expected = {"iterations": jnp.int32, "max_iterations": jnp.int32, "residual": f64,
                "converged": jnp.bool_, "failed_step": jnp.int32}
    for name, dtype in expected.items():
        field = getattr(sol.stats, name)
        assert field.shape == (N_SAVES,) and field.dtype == dtype, name
    assert np.all(np.asarray(sol.stats.converged))
    np.testing.assert_array_equal(sol.stats.failed_step, -1)
    iters, most = np.asarray(sol.stats.iterations), np.asarray(sol.stats.max_iterations)
    assert np.all(most >= 1) and np.all(iters >= most) and np.all(iters <= SAVE_EVERY * most)
    # the saved states: the init state's leaves with a leading axis of N_SAVES + 1
    init = jax.eval_shape(lambda: integ.init(case.system, jnp.zeros((), f64), q0, v0))
    assert jax.tree_util.tree_structure(sol.states) == jax.tree_util.tree_structure(init)
    for leaf, ref in zip(jax.tree_util.tree_leaves(sol.states), jax.tree_util.tree_leaves(init)):
        assert leaf.shape == (N_SAVES + 1,) + ref.shape and leaf.dtype == ref.dtype
    np.testing.assert_array_equal(sol.states.t, sol.t)
    np.testing.assert_array_equal(sol.states.q, sol.q)
    np.testing.assert_array_equal(sol.states.p, sol.p)
    for leaf in jax.tree_util.tree_leaves(sol):
        if np.issubdtype(leaf.dtype, np.floating):
            assert np.all(np.isfinite(np.asarray(leaf)))


def check_jit_equals_eager(case):
    if not case.new_variant:
        return
    _assert_same_solution(case.jitted.sol, case.sol, "jax.jit(simulate) != simulate")


def check_loss_and_gradient_of_the_jitted_program(case):
    """The jitted program's loss is the eager run's; its gradient is finite and not zero."""
    if not case.new_variant:
        return
    out = case.jitted
    grad = np.asarray(out.grad)
    assert np.all(np.isfinite(grad)) and np.max(np.abs(grad)) > 1e-2
    np.testing.assert_allclose(float(out.loss), _eager_loss(case.problem, case.sol), rtol=1e-12)


def check_gradient_against_central_differences(case):
    """d loss / d(datum of q0, datum of v0, system parameter) against central differences
    of eager runs (h = 1e-6), 1e-6 relative."""
    if not case.new_variant:
        return
    grad = np.asarray(case.jitted.grad)
    eps = 1e-6
    fd = np.array([(_eager_loss(case.problem, case.run(case.x + eps * e))
                    - _eager_loss(case.problem, case.run(case.x - eps * e))) / (2 * eps)
                   for e in np.eye(case.x.shape[0])])
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6 * np.max(np.abs(fd)))


def check_vmap_equals_python_loop(case):
    """jax.vmap over three initial conditions (the system parameter shared).  Batching is a
    property of the family's code, which its presets share (they differ in coefficients
    only): run on the first preset of each family, on every problem it accepts."""
    if not case.first:
        return
    xs = jnp.asarray(case.problem.batch)
    data, param = xs[:, :2], case.x[2:]
    batched = jax.jit(jax.vmap(lambda a: case.run(jnp.concatenate([a, param]))))(data)
    for i in range(xs.shape[0]):
        row = jax.tree_util.tree_map(lambda a, i=i: a[i], batched)
        _assert_same_solution(row, case.run(xs[i]), f"vmap row {i} != simulate")


def check_one_step_is_symplectic(case):
    """max |B^T (J^T Omega J - Omega) B| <= 1e-12 at the state after the run, in the variables
    the step map uses (AbstractState.step_momenta: p, or p_z for the constrained DG
    scheme); B = I without constraints, a basis of the tangent space of T^*C with them."""
    if not case.integ.symplectic or isinstance(case.system, vj.NonholonomicSystem):
        return  # the trait makes no claim (nonholonomic flows are not symplectic)
    forms = _symplectic_forms(case.system, case.integ, case.sol.final_state, DT)
    pulled_back, original = np.asarray(forms.pulled_back), np.asarray(forms.original)
    defect = np.max(np.abs(pulled_back - original))
    assert np.max(np.abs(original)) > 0.1  # a non-degenerate restriction
    assert defect <= 1e-12, defect


def check_float32_run_stays_float32(case):
    """float32 q0, v0 (and system parameter): every floating array of the Solution is
    float32, finite, every solve converged, and q, p are within 100 eps(float32) of the
    float64 run (measured: at most 4e-7 = 3 eps).  The working dtype is set by the family's
    code (coefficients are cast where the step builds them, whatever preset made them): run
    on the first preset of each family, on every problem it accepts."""
    if not case.first:
        return
    sol = case.run(case.x.astype(jnp.float32))
    for leaf in jax.tree_util.tree_leaves(sol):
        assert leaf.dtype != jnp.float64, "a float64 array in a float32 run"
    assert sol.q.dtype == sol.v.dtype == sol.p.dtype == sol.t.dtype == jnp.float32
    assert sol.stats.residual.dtype == jnp.float32
    for field in (sol.q, sol.v, sol.p):
        assert np.all(np.isfinite(np.asarray(field)))
    assert np.all(np.asarray(sol.stats.converged))
    for a, b in ((sol.q, case.sol.q), (sol.p, case.sol.p)):
        np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=0,
                                   atol=100 * np.finfo(np.float32).eps)


CLAUSES = (check_solution_shapes_and_dtypes, check_jit_equals_eager,
           check_loss_and_gradient_of_the_jitted_program,
           check_gradient_against_central_differences,
           check_vmap_equals_python_loop, check_one_step_is_symplectic,
           check_float32_run_stays_float32)


def _params(cases, in_default=lambda case: case[3]):
    """The cases as pytest parameters: those ``in_default`` keeps (by default the first preset
    of each family, on every problem it accepts) in the default suite, the others marked
    ``extended`` (``make test-extended``, which CI runs after the default suite)."""
    return [pytest.param(*case, id=f"{case[0]}-{case[2].name}",
                         marks=() if in_default(case) else pytest.mark.extended)
            for case in cases]


@pytest.mark.parametrize("call, integ, problem, first, new_variant", _params(CASES))
def test_contract(call, integ, problem, first, new_variant):
    """Every clause on one case; all failing clauses are reported, by name.  One test per case
    keeps its compilations in one process (pytest-xdist distributes tests, not fixtures)."""
    case = Case(call, integ, problem, first, new_variant)
    failures = []
    for clause in CLAUSES:
        try:
            clause(case)
        except Exception as err:  # noqa: BLE001 - collected and reported below, clause by clause
            name = clause.__name__.removeprefix("check_")
            failures.append(f"[{name}] {type(err).__name__}: {err}")
    if failures:
        pytest.fail(f"{call} on the {problem.name}:\n" + "\n".join(failures), pytrace=False)


FORWARD_CASES = [case for case in CASES if case[4]]


@pytest.mark.parametrize("call, integ, problem, first, new_variant",
                         _params(FORWARD_CASES, in_default=lambda case: False))
def test_forward_mode_equals_reverse_mode(call, integ, problem, first, new_variant):
    """``jax.jvp`` along a direction equals ``jax.grad`` dotted with it, to 1e-12 (both through
    the implicit function theorem), on the first preset of each code path.  The extended tier
    only: compiling the forward-mode program costs as much as the reverse-mode one, and the
    default suite already checks forward mode on every family (``test_forced_contract``: the
    derivative along a direction against central differences)."""
    case = Case(call, integ, problem, first, new_variant)
    d = jnp.asarray(DIRECTION)
    _, along = jax.jit(lambda x: jax.jvp(
        lambda y: _loss_and_sol(problem, integ, y)[0], (x,), (d,)))(case.x)
    grad = np.asarray(case.jitted.grad)
    np.testing.assert_allclose(float(along), grad @ np.asarray(DIRECTION), rtol=1e-12,
                               atol=1e-12 * np.max(np.abs(grad)))


# --------------------------------------------------------------------------------------------
# Forcing and controls: every preset
# --------------------------------------------------------------------------------------------
class _Forcing(vj.ForcedSystem):
    """``F = -c v + u e_1 + 0.1 sin(t) e_2`` (damping, a control on the first coordinate and an
    explicit time dependence), mixed into each problem's system below."""

    c: float = 0.0
    control_dim = 1

    def force(self, t, q, v, u):
        e = jnp.eye(v.shape[0], dtype=v.dtype)
        return -self.c * v + u[0] * e[0] + 0.1 * jnp.sin(t) * e[1]


class ForcedHenonHeiles(_Forcing, vj.systems.HenonHeiles):
    pass


class ForcedSpringPendulum(_Forcing, SpringPendulum):
    pass


class ForcedNonholonomicParticle(_Forcing, vj.systems.NonholonomicParticle):
    pass


class ForcedHeavyTop(_Forcing, vj.systems.HeavyTop):
    pass


class ForcedUnicycle(_Forcing, vj.systems.Unicycle):
    pass


FORCED = {HENON_HEILES.name: ForcedHenonHeiles, SPRING_PENDULUM.name: ForcedSpringPendulum,
          NONHOLONOMIC_PARTICLE.name: ForcedNonholonomicParticle,
          HEAVY_TOP.name: ForcedHeavyTop, UNICYCLE.name: ForcedUnicycle}
FORCED_CASES = [(call, integ, problem, first) for call, integ, problem, first, _ in CASES
                if first or isinstance(problem.system, vj.HolonomicSystem)]


def _forced_run(problem, integ, x, c, U):
    """The problem's run with damping ``c`` and stage controls ``U`` (``U = 0``, ``c = 0``
    keeps only the ``0.1 sin t`` drive)."""
    system, q0, v0 = problem.make(x)
    forced = FORCED[problem.name](c=c, **{f.name: getattr(system, f.name)
                                          for f in dataclasses.fields(system)})
    return vj.simulate(forced, integ, q0=q0, v0=v0, dt=DT, n_steps=N_STEPS,
                       save_every=SAVE_EVERY, controls=U)


@pytest.mark.parametrize("call, integ, problem, first", _params(FORCED_CASES))
def test_forced_contract(call, integ, problem, first):
    """Every preset with a :class:`vijax.ForcedSystem` (damping, an explicit time dependence
    and stage controls, one per force node): the run converges and stays finite; damping
    takes energy out (``c`` up: final energy down); and, for the first preset of each family
    on each problem it accepts (the forcing code is the family's, its presets differ in
    coefficients only), the derivative with respect to the initial data, the damping
    coefficient and the controls (forward mode, through the implicit function theorem)
    matches central differences of eager runs to 1e-6 relative."""
    x = jnp.asarray(problem.x)
    k = len(integ.force_nodes())
    U = 0.3 * jnp.cos(jnp.arange(N_STEPS * k, dtype=x.dtype)).reshape(N_STEPS, k, 1)
    c = jnp.asarray(0.2, x.dtype)

    def loss(x, c, U):
        sol = _forced_run(problem, integ, x, c, U)
        return _loss(problem, sol.q[-1], sol.p[-1])

    sol = _forced_run(problem, integ, x, c, U)
    assert np.all(np.asarray(sol.stats.converged))
    for field in (sol.q, sol.v, sol.p):
        assert np.all(np.isfinite(np.asarray(field)))
    system = problem.make(x)[0]
    energy = lambda sol: float(system.energy(sol.q[-1], sol.v[-1]))  # noqa: E731
    assert energy(_forced_run(problem, integ, x, c + 1.0, U)) < energy(sol)
    if not first:
        return
    dx, dU = jnp.asarray(DIRECTION), jnp.sin(1.0 + jnp.arange(U.size, dtype=x.dtype)).reshape(U.shape)
    dc = jnp.asarray(0.4, x.dtype)
    _, along = jax.jit(lambda *a: jax.jvp(loss, (x, c, U), a))(dx, dc, dU)
    eps = 1e-6
    fd = (float(loss(x + eps * dx, c + eps * dc, U + eps * dU))
          - float(loss(x - eps * dx, c - eps * dc, U - eps * dU))) / (2 * eps)
    np.testing.assert_allclose(float(along), fd, rtol=1e-6, atol=1e-8)


# --------------------------------------------------------------------------------------------
# Refused systems and the negative control
# --------------------------------------------------------------------------------------------
REFUSED = [(call, integ, p) for call, integ in REGISTRY for p in PROBLEMS
           if not integ.accepts(p.system)]


@pytest.mark.parametrize("call, integ, problem", REFUSED,
                         ids=[f"{c}-{p.name}" for c, _, p in REFUSED])
def test_refused_system_names_a_method_that_accepts_it(call, integ, problem):
    x = jnp.asarray(problem.x)
    system = problem.system
    accepting = [c for c, m in REGISTRY if m.accepts(system)]
    assert accepting
    for run in (lambda: _run(problem, integ, x), lambda: jax.jit(lambda y: _run(problem, integ, y))(x)):
        with pytest.raises(vj.IncompatibleSystemError) as err:
            run()
        msg = str(err.value)
        assert any(f"vijax.{c}" in msg for c in accepting), msg
        assert integ.name in msg


class Damped(vj.AbstractIntegrator):
    """A method followed by ``p -> 0.99 p`` (projected back onto the hidden constraint for
    a constrained system): not symplectic, the negative control of the symplecticity check."""

    inner: vj.AbstractIntegrator

    @property
    def order(self):
        return self.inner.order

    @property
    def stages(self):
        return self.inner.stages

    def init(self, system, t0, q0, v0):
        return self.inner.init(system, t0, q0, v0)

    def force_nodes(self):
        return self.inner.force_nodes()

    def step(self, system, state, h, u=None):
        new, stats = self.inner.step(system, state, h, u)
        p = 0.99 * new.p
        if isinstance(system, vj.HolonomicSystem):
            p = vj.constraints.project_momentum(system, new.q, p)
        return eqx.tree_at(lambda s: s.p, new, p), stats

    def velocity(self, system, state):
        return self.inner.velocity(system, state)


@pytest.mark.parametrize("integ, problem", [(vj.VPRK.gauss(2), HENON_HEILES),
                                            (vj.GalerkinVI.gauss(2), SPRING_PENDULUM)],
                         ids=["VPRK.gauss(2)-henon_heiles", "GalerkinVI.gauss(2)-spring_pendulum"])
def test_symplecticity_check_catches_a_damped_method(integ, problem):
    """The negative control of the symplecticity clause (where the undamped method passes
    at the same state)."""
    x = jnp.asarray(problem.x)
    system = problem.make(x)[0]
    state = _run(problem, integ, x).final_state
    defect = eqx.filter_jit(vj.diagnostics.symplecticity_defect)(system, Damped(integ), state, DT)
    assert float(defect) > 1e-3, float(defect)


