"""Long-horizon gradients: ``simulate(..., adjoint=...)``.

* ``"checkpointed"`` and ``"reversible"`` give the derivatives of ``"store_all"`` (to
  round-off) with respect to a system parameter, the initial data and per-node controls, for
  an unconstrained forced system (Gauss and Lobatto IIIA--IIIB, whose per-node controls the
  backward step takes in reversed order) and the constrained families (RATTLE, the Galerkin
  VI in its time-reversible projected mode).
* Memory of reverse mode, read from the compiled program (XLA's temporary buffers of
  ``jax.grad`` of a loss of the final state, ``save_every = n_steps`` so that no saved states
  count): ``store_all`` grows with the step count ``N``; ``checkpointed`` like ``sqrt(N)``;
  ``reversible`` not at all.  Measured on the double pendulum with ``VPRK.gauss(2)``,
  N = 10^3 / 1.6 10^4 / 10^5: 0.095 / 1.42 / 8.8 MB (88 B per step, less than one state:
  each step is rematerialised in the backward pass from its input state and stage-solve
  root), 0.014 / 0.029 / 0.058 MB, 0.007 MB each.
* Bad input: the reversible adjoint of a non-symmetric method names the methods that allow
  it; with dense output, and an unknown adjoint, the error names the fix.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from helpers import RelativisticParticle

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py


class ForcedDoublePendulum(vj.ForcedSystem, vj.systems.DoublePendulum):
    """Damped double pendulum with a torque on the first joint and a time-dependent drive."""

    c: float = 0.1
    control_dim = 1

    def force(self, t, q, v, u):
        return -self.c * v + jnp.stack([u[0], 0.1 * jnp.sin(t)])


class DampedCartesianPendulum(vj.ForcedSystem, vj.systems.CartesianPendulum):
    c: float = 0.1

    def force(self, t, q, v, u):
        return -self.c * v + jnp.stack([0.3 * jnp.cos(t), 0.0 * t])


N, SAVE = 40, 20
TH = 1.0


def _problem(name):
    if name == "double_pendulum":
        return ForcedDoublePendulum(), jnp.array([1.0, 0.5]), jnp.array([0.0, 0.3])
    q0 = jnp.array([np.sin(TH), -np.cos(TH)])
    return DampedCartesianPendulum(), q0, 0.5 * jnp.array([np.cos(TH), np.sin(TH)])


# compile-bound (three gradient programs each): two cases in the default suite, two slow
CASES = [("VPRK.gauss(2)", vj.VPRK.gauss(2), "double_pendulum", "nodes"),
         pytest.param("VPRK.lobatto(3)", vj.VPRK.lobatto(3), "double_pendulum", "held",
                      marks=pytest.mark.slow),
         ("HolonomicVPRK.rattle()", vj.HolonomicVPRK.rattle(), "cartesian_pendulum", None),
         pytest.param("GalerkinVI.gauss(2)", vj.GalerkinVI.gauss(2), "cartesian_pendulum", None,
                      marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, integ, problem, controls", CASES,
                         ids=["VPRK.gauss(2)", "VPRK.lobatto(3)", "HolonomicVPRK.rattle()",
                              "GalerkinVI.gauss(2)"])
def test_adjoints_give_the_same_gradient(name, integ, problem, controls):
    system, q0, v0 = _problem(problem)
    k = len(integ.force_nodes())
    U = (None if controls is None else
         0.2 * jnp.cos(jnp.arange(N * k, dtype=q0.dtype)).reshape(N, k, 1) if controls == "nodes"
         else 0.2 * jnp.cos(jnp.arange(N, dtype=q0.dtype)).reshape(N, 1))

    def loss(args, adjoint):
        c, x, U = args
        sol = vj.simulate(eqx.tree_at(lambda s: s.c, system, c), integ, q0=q0, v0=v0 * x, dt=0.02, n_steps=N,
                          save_every=SAVE, controls=U, adjoint=adjoint)
        # every saved state enters the loss: the backward pass injects their cotangents
        return jnp.sum(sol.q[-1] ** 2) + jnp.sum(sol.p[-1]) + 0.1 * jnp.sum(sol.q[:, 0])

    args = (jnp.asarray(0.1, q0.dtype), jnp.asarray(1.3, q0.dtype), U)
    grads = {a: jax.jit(jax.grad(loss), static_argnums=1)(args, a)
             for a in ("store_all", "checkpointed", "reversible")}
    ref = grads["store_all"]
    assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree_util.tree_leaves(ref))
    assert float(jnp.abs(ref[0])) > 1e-3  # the damping matters
    for adjoint in ("checkpointed", "reversible"):
        for a, b in zip(jax.tree_util.tree_leaves(grads[adjoint]), jax.tree_util.tree_leaves(ref)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12 * float(jnp.max(jnp.abs(b))),
                                       err_msg=f"{name}: {adjoint}")


# the three forms of VPRK's stage equations: force (constant mass), velocity (configuration-
# dependent mass), momentum (a general Lagrangian)
RETRACED = [("force form", vj.VPRK.gauss(2), vj.systems.Kepler(),
             jnp.array([0.5, 0.0]), jnp.array([0.0, 1.7])),
            ("velocity form", vj.VPRK.gauss(2), vj.systems.DoublePendulum(),
             jnp.array([1.0, 1.5]), jnp.array([0.0, 0.0])),
            ("velocity form, Lobatto", vj.VPRK.lobatto(3), vj.systems.DoublePendulum(),
             jnp.array([1.0, 1.5]), jnp.array([0.0, 0.0])),
            ("momentum form", vj.VPRK.gauss(3), RelativisticParticle(),
             jnp.array([1.0, 0.0]), jnp.array([0.0, 0.6]))]
_CHAOTIC = vj.systems.ChaoticNonholonomic()
RETRACED += [(f"nonholonomic, {form}", vj.NonholonomicVPRK.lobatto(3, form=form), _CHAOTIC,
              _CHAOTIC.initial_conditions()[0][3], _CHAOTIC.initial_conditions()[1][3])
             for form in ("lagrangian", "hamiltonian")]
RETRACED += [(f"holonomic, {name}", integ, vj.systems.CartesianPendulum(),
              jnp.array([np.sin(TH), -np.cos(TH)]), 0.5 * jnp.array([np.cos(TH), np.sin(TH)]))
             for name, integ in (("RATTLE", vj.HolonomicVPRK.rattle()),
                                 ("Lobatto(3)", vj.HolonomicVPRK.lobatto(3)))]


RETRACED += [(f"Galerkin, {integ.name}", integ, vj.systems.CartesianPendulum(),
              jnp.array([np.sin(TH), -np.cos(TH)]), 0.5 * jnp.array([np.cos(TH), np.sin(TH)]))
             for integ in (vj.GalerkinVI.gauss(2), vj.GalerkinVI.lobatto(3))]


RETRACED += [(f"discrete gradient, {integ.name}", integ, _CHAOTIC,
              _CHAOTIC.initial_conditions()[0][3], _CHAOTIC.initial_conditions()[1][3])
             for integ in (vj.DiscreteGradient.gonzalez(), vj.DiscreteGradient.avf())]


def _reversed_root(integ, back, h):
    """The carried unknowns of the step that retraces the step back which reached ``back``
    (a step of ``-h``)."""
    if isinstance(integ, vj.DiscreteGradient):
        # the step back's rate: the retraced step's root is where the step back started
        n = back.q.shape[0]
        return {"q": back.q + h * back.zdot[:n], "rho": back.rho + h * back.zdot[n:]}
    if isinstance(integ, vj.GalerkinVI):
        # control points (q^v - q^0) / h of the polynomial in reverse
        return {"controls": back.controls[-1][None, :] - back.controls[::-1]}
    second = "forces" if isinstance(integ, vj.VPRK) else "lams"
    return {"stages": back.stages[::-1], second: getattr(back, second)[::-1]}


@pytest.mark.parametrize("name, integ, system, q0, v0", RETRACED,
                         ids=[r[0] for r in RETRACED])
def test_retraced_step_starts_at_its_root(name, integ, system, q0, v0):
    """The reversible adjoint re-takes each step from the state the step back reached, with
    ``integrator.retracing()``: the step back's stage values in reverse order are the root
    (symmetric coefficients; checked against the root the plain step finds from its
    predictor; for the discrete gradients the step back's own start, from the rate it
    carries), which VPRK, NonholonomicVPRK and the discrete gradients take as found and the
    holonomic families,
    whose node velocity or first multiplier is not carried, finish in two updates; either
    way the step returns to where the step back started."""
    h = 0.02
    step = jax.jit(lambda integ, state, h: integ.step(system, state, h))
    state = integ.init(system, 0.0, q0, v0)
    for _ in range(20):
        state, _ = step(integ, state, h)
    retraced, plain = [], []
    for _ in range(6):   # each step back extrapolates the steps back before it
        after = state
        state, _ = step(integ, state, -h)
        again, stats = step(integ.retracing(), state, h)
        other, other_stats = step(integ, state, h)
        assert bool(stats.converged), (name, stats)
        retraced.append(int(stats.iterations))
        plain.append(int(other_stats.iterations))
        # the root the plain step finds from its predictor is the step back's stage values
        # reversed
        for x, expected in _reversed_root(integ, state, h).items():
            scale = float(jnp.max(jnp.abs(getattr(other, x))))
            np.testing.assert_allclose(getattr(other, x), expected, rtol=0,
                                       atol=1e-12 * scale, err_msg=f"{name}: {x}")
        # and the step returns where the step back started, as the plain step does
        for x in ("q", "p"):
            scale = float(jnp.max(jnp.abs(getattr(after, x))))
            for y in (again, other):
                np.testing.assert_allclose(getattr(y, x), getattr(after, x), rtol=0,
                                           atol=1e-14 * scale, err_msg=f"{name}: {x}")
    # (the plain step: 2-4 updates for Gauss(2), 7 for the general Lagrangian's Gauss(3), 6
    # for the nonholonomic Lobatto(3), 3 in its Hamiltonian form, 5-6 for the holonomic
    # mode, 5-9 for the Galerkin VI; its node velocity or multiplier starts O(h^2) off)
    expected = 2 if isinstance(integ, (vj.HolonomicVPRK, vj.GalerkinVI)) else 0
    assert max(retraced) <= expected and np.mean(plain) >= np.mean(retraced) + 1, (
        name, retraced, plain)


def test_retraced_discrete_gradient_step_changes_frame():
    """A discrete-gradient step whose frame's reflector signs differ from those the state's
    ``ρ`` is expressed in (a constraint row whose leading entry changes sign) re-expresses
    the retraced root in its own frame, and returns where the step back started.  The
    catalogue's constraint rows keep their leading sign, so the state is rewritten in the
    other frame by hand."""
    from vijax.integrators.discrete_gradients import ReducedForm

    system, h = _CHAOTIC, 0.05
    q0, v0 = _CHAOTIC.initial_conditions()[0][3], _CHAOTIC.initial_conditions()[1][3]
    integ = vj.DiscreteGradient.gonzalez()
    step = jax.jit(lambda integ, state, h: integ.step(system, state, h))
    after = integ.init(system, 0.0, q0, v0)
    for _ in range(10):
        after, _ = step(integ, after, h)
    back, _ = step(integ, after, -h)
    # the step back and its start in the frame of the flipped signs
    other = ReducedForm(system, -back.signs, "qr")
    z_back = jnp.concatenate([back.q, other.rho(back.q, back.p)])
    z_start = jnp.concatenate([after.q, other.rho(after.q, after.p)])
    flipped = eqx.tree_at(lambda s: (s.signs, s.rho, s.zdot), back,
                          (-back.signs, z_back[q0.shape[0]:], (z_back - z_start) / -h))
    again, stats = step(integ.retracing(), flipped, h)
    plain, plain_stats = step(integ, flipped, h)
    assert bool(stats.converged) and int(stats.iterations) == 0
    assert bool(plain_stats.converged) and int(plain_stats.iterations) >= 2
    for x in ("q", "p", "rho"):
        scale = float(jnp.max(jnp.abs(getattr(after, x))))
        for y in (again, plain):
            np.testing.assert_allclose(getattr(y, x), getattr(after, x), rtol=0,
                                       atol=1e-13 * scale, err_msg=x)


def _released_pendulum_gradient(integ, angles, n, save_every, adjoint, **kwargs):
    """``d/dx |q_n|²`` of the double pendulum released at rest from ``x * angles``, dt =
    0.01, at x = 1 (compiled)."""
    def loss(x):
        sol = vj.simulate(vj.systems.DoublePendulum(), integ, q0=x * jnp.array(angles),
                          v0=jnp.zeros(2), dt=0.01, n_steps=n, save_every=save_every,
                          adjoint=adjoint, **kwargs)
        return jnp.sum(sol.q[-1] ** 2)

    return float(jax.jit(jax.grad(loss))(1.0))


class _FailingBackwards(vj.VPRK):
    """VPRK whose steps with a negative step size report a failed solve."""

    def step(self, system, state, h, u=None):
        new, stats = super().step(system, state, h, u)
        return new, eqx.tree_at(lambda s: s.converged, stats, stats.converged & (h > 0))


def test_reversible_gradient_is_nan_where_a_solve_fails():
    """A solve that does not converge makes the reversible adjoint's gradient NaN, never a
    number: a step back (before, the re-taken step converged from wherever the failed step
    back had left it and the gradient was a number) and a forward step (``throw=False``)."""
    def grad(integ, adjoint, throw=True):
        return _released_pendulum_gradient(integ, (1.0, 1.5), 20, 5, adjoint, throw=throw)

    ref = grad(vj.VPRK.gauss(2), "store_all")
    np.testing.assert_allclose(grad(vj.VPRK.gauss(2), "reversible"), ref, rtol=1e-12)
    failing = _FailingBackwards(vj.VPRK.gauss(2).tableau)
    np.testing.assert_allclose(grad(failing, "store_all"), ref, rtol=1e-12)
    assert np.isnan(grad(failing, "reversible"))
    capped = vj.VPRK.gauss(2, solver=vj.solvers.FixedPoint(max_steps=2))   # fails forwards
    assert np.isnan(grad(capped, "store_all", throw=False))
    assert np.isnan(grad(capped, "reversible", throw=False))


def test_reversible_adjoint_is_anchored_at_the_saves():
    """The reversible adjoint rebuilds each block between two saves from the saved state, so
    round-off grows over ``save_every`` steps, not the whole run: on the chaotic double
    pendulum from (2, 2) rad, 3000 steps (T = 30, the trajectory's sensitivity about 1e16),
    the gradient with one save is off by 11 (relative; measured), with a save every 100 steps
    it is store_all's to 4e-13."""
    n = 3000

    def grad(adjoint, every):
        return _released_pendulum_gradient(vj.VPRK.gauss(2), (2.0, 2.0), n, every, adjoint)

    ref = grad("store_all", n)
    assert abs(grad("reversible", n) / ref - 1.0) > 1e-2   # the run is that sensitive
    np.testing.assert_allclose(grad("reversible", 100), ref, rtol=1e-10)


@pytest.mark.parametrize("save_every", [1, 4, 16])
def test_adjoints_agree_whatever_the_saves(save_every):
    """The checkpointed layout depends on how far apart the saves are (64 steps: saves at
    most 8 steps apart grouped into checkpointed chunks of about 8 steps; further apart, each
    save's steps in checkpointed segments), the reversible adjoint rebuilds each block from
    its save: every loss of the saved states gets store_all's gradient."""
    system = ForcedDoublePendulum()
    n = 64
    U = 0.2 * jnp.cos(jnp.arange(n, dtype=jnp.float64)).reshape(n, 1)

    def grad(adjoint):
        def loss(args):
            c, x = args
            sol = vj.simulate(eqx.tree_at(lambda s: s.c, system, c), vj.VPRK.gauss(2),
                              q0=jnp.array([1.0, 0.5]), v0=x * jnp.array([0.0, 0.3]),
                              dt=0.02, n_steps=n, save_every=save_every, controls=U,
                              adjoint=adjoint)
            return jnp.sum(sol.q[-1] ** 2) + 0.1 * jnp.sum(sol.q[:, 0] * sol.p[:, 1])

        return np.asarray(jax.jit(jax.grad(loss))((jnp.asarray(0.1), jnp.asarray(1.3))))

    ref = grad("store_all")
    for adjoint in ("checkpointed", "reversible"):
        np.testing.assert_allclose(grad(adjoint), ref, rtol=1e-11, err_msg=adjoint)


def _temp_bytes(n, adjoint):
    system = vj.systems.DoublePendulum()

    def loss(q0):
        sol = vj.simulate(system, vj.VPRK.gauss(2), q0=q0, v0=jnp.zeros(2), dt=0.01, n_steps=n,
                          save_every=n, adjoint=adjoint)
        return jnp.sum(sol.q[-1] ** 2) + jnp.sum(sol.p[-1])

    compiled = jax.jit(jax.grad(loss)).lower(jnp.array([1.0, 0.5])).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_reverse_mode_memory_against_the_step_count():
    small, large = 1_000, 16_000   # 16x the steps
    store = _temp_bytes(large, "store_all") / _temp_bytes(small, "store_all")
    # store_all keeps at most one state per step (each step is rematerialised in the
    # backward pass from its input state and stage-solve root), not the step's
    # linearisation: measured 88 B per step against a 104-byte state (t, q, p and the two
    # stages' velocities and forces); 780 B per step while the stage solve's linearisation
    # was stored
    state = vj.VPRK.gauss(2).init(vj.systems.DoublePendulum(), 0.0, jnp.array([1.0, 0.5]),
                                  jnp.zeros(2))
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state))
    per_step = (_temp_bytes(large, "store_all") - _temp_bytes(small, "store_all")) / (large - small)
    assert per_step <= state_bytes, (per_step, state_bytes)
    check = _temp_bytes(large, "checkpointed") / _temp_bytes(small, "checkpointed")
    rev = _temp_bytes(large, "reversible") / _temp_bytes(small, "reversible")
    assert store > 12, store         # linear: 16
    assert check < 6, check          # square root: 4 (plus constants)
    assert rev < 1.1, rev            # independent of the step count


@pytest.mark.parametrize("adjoint", ["store_all", "checkpointed"])
def test_checkpoints_inside_scans_carry_no_cse_barriers(adjoint):
    """Every ``jax.checkpoint`` of simulate's differentiated layout wraps a ``lax.scan`` body,
    where the common-subexpression elimination ``prevent_cse`` guards against cannot reach
    across iterations: the barriers are off (they cost four kernels per step of Kepler's
    backward loop on XLA:CPU, the gradient 0.95x with store_all and 0.80x checkpointed)."""
    if jax.default_backend() != "cpu":
        pytest.skip("the layout that re-runs steps is used on CPU only")
    system = vj.systems.Kepler()

    def final(q0):
        return vj.simulate(system, vj.VPRK.gauss(2), q0=q0, v0=jnp.array([0.0, 1.2]), dt=0.01,
                           n_steps=64, save_every=64, adjoint=adjoint).q[-1]

    q0 = jnp.array([1.0, 0.0])
    jaxpr = jax.make_jaxpr(lambda q: jax.jvp(final, (q,), (jnp.ones(2),)))(q0).jaxpr
    from helpers import equations

    found = [e for e in equations(jaxpr) if e.primitive.name in ("checkpoint", "remat2")]
    assert found, "no checkpoint in the derivative's layout"
    assert all(not eqn.params["prevent_cse"] for eqn in found), [
        eqn.params["prevent_cse"] for eqn in found]


def test_bad_adjoint_input_names_the_fix():
    system, q0, v0 = _problem("cartesian_pendulum")
    kwargs = dict(q0=q0, v0=v0, dt=0.02, n_steps=4)
    with pytest.raises(ValueError, match=r"symmetric method.*VPRK.gauss\(2\)"):
        vj.simulate(system, vj.DGVI(2), adjoint="reversible", **kwargs)
    with pytest.raises(ValueError, match="drop dense=True"):
        vj.simulate(system, vj.GalerkinVI.gauss(2), adjoint="reversible", dense=True, **kwargs)
    with pytest.raises(ValueError, match="adjoint must be one of"):
        vj.simulate(system, vj.GalerkinVI.gauss(2), adjoint="backsolve", **kwargs)
