"""Every bad input a user can give ``simulate``, with the error each gets -- outside and inside
``jax.jit``.  None may end in an unrelated message or a silent result.

Each case builds the call from keyword overrides of a good pendulum run.  ``jit``: how the same
input behaves when the run is compiled with ``jax.jit`` over (q0, v0, dt, system):

* ``"value"``: a check on values -- it runs in the compiled code and raises at run time with the
  same message fragment;
* ``"static"``: a check on shapes, types or static ints -- ``jax.jit`` raises it while tracing,
  the same exception type and message.

What jit does not see: a too-short ``q0`` for a system that does not declare ``ndim`` (JAX
clamps out-of-range indices), and, inside jit, which coordinates of a singular velocity Hessian
carry no inertia (the message then says "singular" only).
"""

import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj

GAUSS2 = vj.VPRK.gauss(2)
PEND = vj.systems.Pendulum()
CART = vj.systems.CartesianPendulum()


class Degenerate(vj.LagrangianSystem):
    """No inertia in the second coordinate: a singular velocity Hessian."""

    def lagrangian(self, q, v):
        return 0.5 * v[0] ** 2 - q[1] ** 2


class Planar(vj.LagrangianSystem):
    """Two coordinates, no declared ``ndim``."""

    def lagrangian(self, q, v):
        return 0.5 * (v[0] ** 2 + v[1] ** 2) - 0.5 * (q[0] ** 2 + q[1] ** 2)


class Doubled(vj.systems.AbstractCartesianPendulum):
    """Two copies of the same constraint: a rank-deficient constraint Jacobian."""

    ndim = 2

    def holonomic(self, q):
        g = 0.5 * (q @ q - self.l**2)
        return jnp.stack([g, 2 * g])


def good(**overrides):
    args = dict(system=PEND, integrator=GAUSS2, q0=jnp.array([1.0]), v0=jnp.array([0.0]),
                dt=0.1, n_steps=8)
    args.update(overrides)
    return args


def cart(**overrides):
    th = 1.0
    args = dict(system=CART, integrator=vj.HolonomicVPRK.rattle(),
                q0=jnp.array([np.sin(th), -np.cos(th)]),
                v0=0.5 * jnp.array([np.cos(th), np.sin(th)]))
    args.update(overrides)
    return good(**args)


NAN = float("nan")

# (id, simulate arguments, exception type, message fragments, how jit sees it)
CASES = [
    # failed solves: loud by default
    ("stage solve fails: pendulum dt = 1.5", good(dt=1.5, n_steps=20), vj.ConvergenceError,
     ["did not converge", "Reduce dt", "throw=False"], "value"),
    ("stage solve fails: stiff spring k = 1e6",
     good(system=vj.systems.HarmonicOscillator(k=1e6), dt=0.1, n_steps=20),
     vj.ConvergenceError, ["did not converge", "Newton"], "value"),
    # dt
    ("dt = NaN", good(dt=NAN), ValueError, ["dt must be positive and finite"], "value"),
    ("dt < 0", good(dt=-0.1), ValueError, ["dt must be positive and finite"], "value"),
    ("dt = 0", good(dt=0.0), ValueError, ["dt must be positive and finite"], "value"),
    ("dt not a scalar", good(dt=jnp.array([0.1, 0.2])), ValueError, ["dt must be a scalar"],
     "static"),
    # system parameters
    ("Pendulum(l=nan)", good(system=vj.systems.Pendulum(l=NAN)), ValueError,
     ["Pendulum.l is not finite"], "value"),
    ("Pendulum(g=nan)", good(system=vj.systems.Pendulum(g=NAN)), ValueError,
     ["Pendulum.g is not finite"], "value"),
    ("Pendulum(m=inf)", good(system=vj.systems.Pendulum(m=float("inf"))), ValueError,
     ["Pendulum.m is not finite"], "value"),
    # the Lagrangian
    ("singular velocity Hessian", good(system=Degenerate(), q0=jnp.ones(2), v0=jnp.zeros(2)),
     ValueError, ["singular", "kinetic energy"], "value"),
    ("q0 longer than the system (no ndim declared)",
     good(system=Planar(), q0=jnp.ones(3), v0=jnp.zeros(3)), ValueError,
     ["singular", "coordinates [2] of q0 (length 3)", "declare ndim"], "value"),
    ("q0 length differs from a declared ndim", good(q0=jnp.ones(2), v0=jnp.zeros(2)),
     ValueError, ["q0 has 2 components", "ndim = 1"], "static"),
    # initial data
    ("q0 NaN", good(q0=jnp.array([NAN])), ValueError, ["q0 is not finite"], "value"),
    ("v0 inf", good(v0=jnp.array([float("inf")])), ValueError, ["v0 is not finite"], "value"),
    ("both v0 and p0", good(p0=jnp.array([0.0])), ValueError, ["exactly one of v0", "both"],
     "static"),
    ("neither v0 nor p0", good(v0=None), ValueError, ["exactly one of v0", "neither"], "static"),
    ("v0 shape differs from q0", good(v0=jnp.zeros(2)), ValueError, ["v0 has shape (2,)"],
     "static"),
    ("integer q0", good(q0=jnp.array([1])), TypeError, ["floating-point"], "static"),
    ("stacked initial conditions", good(q0=jnp.ones((3, 1))), ValueError,
     ["1-D array", "jax.vmap"], "static"),
    # static loop sizes
    ("n_steps not positive", good(n_steps=0), ValueError, ["n_steps must be a positive"],
     "static"),
    ("n_steps a float", good(n_steps=8.0), ValueError, ["n_steps must be a positive"], "static"),
    ("n_steps a JAX array", good(n_steps=jnp.asarray(8)), TypeError,
     ["n_steps must be a static Python int", "static_argnames", "filter_jit"], "static"),
    ("save_every a JAX array", good(save_every=jnp.asarray(2)), TypeError,
     ["save_every must be a static Python int"], "static"),
    ("n_steps not a multiple of save_every", good(save_every=3), ValueError,
     ["not a multiple of save_every"], "static"),
    # system and integrator
    ("a class instead of an instance", good(system=vj.systems.Pendulum), TypeError,
     ["instance", "Pendulum()"], "static"),
    ("arguments swapped", good(system=GAUSS2, integrator=PEND), TypeError, ["swapped"],
     "static"),
    ("not an integrator", good(integrator="gauss"), TypeError,
     ["integrator must be a vijax integrator"], "static"),
    ("unconstrained method, constrained system", cart(integrator=GAUSS2),
     vj.IncompatibleSystemError, ["HolonomicSystem", "HolonomicVPRK", "GalerkinVI"], "static"),
    ("constrained method, unconstrained system", good(integrator=vj.HolonomicVPRK.rattle()),
     vj.IncompatibleSystemError, ["needs a HolonomicSystem", "VPRK"], "static"),
    # constrained initial data
    ("q0 off the constraint", cart(q0=1.01 * cart()["q0"]), vj.constraints.InconsistentInitialData,
     ["q0 violates CartesianPendulum.holonomic", "project_position", "project=True"], "value"),
    ("v0 off the hidden constraint", cart(v0=jnp.array([1.0, 1.0])),
     vj.constraints.InconsistentInitialData, ["hidden constraint", "project_velocity"], "value"),
    ("rank-deficient constraints", cart(system=Doubled()), ValueError, ["rank deficiency"],
     "value"),
    ("DG: q0 off the constraint", cart(integrator=vj.DGVI(2), q0=1.01 * cart()["q0"]),
     vj.constraints.InconsistentInitialData, ["project_position"], "value"),
    # dense output
    ("dense output of a non-collocation PRK",
     good(integrator=vj.VPRK(vj.tableaus.symplectic_pair(vj.tableaus.lobatto_iiib(3))),
          dense=True), ValueError, ["collocation"], "static"),
]


def _split(args):
    args = dict(args)
    return args.pop("system"), args.pop("integrator"), args


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_outside_jit(case):
    _, args, exc, fragments, _ = case
    system, integrator, kwargs = _split(args)
    with pytest.raises(exc) as info:
        vj.simulate(system, integrator, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_inside_jit(case):
    _, args, exc, fragments, how = case
    system, integrator, kwargs = _split(args)
    arrays = {k: kwargs.pop(k) for k in ("q0", "v0", "p0", "dt")
              if isinstance(kwargs.get(k), (float, jax.Array))}
    if isinstance(system, vj.LagrangianSystem):
        def run(system, arrays):
            return vj.simulate(system, integrator, **arrays, **kwargs)
    else:  # not a system at all: nothing to trace, close over it
        def run(_, arrays, system=system):
            return vj.simulate(system, integrator, **arrays, **kwargs)
    jitted = eqx.filter_jit(run) if not isinstance(system, vj.LagrangianSystem) else jax.jit(run)
    if how == "static":
        with pytest.raises(exc) as info:
            jitted(system if isinstance(system, vj.LagrangianSystem) else None, arrays)
        fragments_to_check = fragments
    else:
        # a run-time check: the message travels inside the runtime error
        with pytest.raises(Exception) as info:
            jax.block_until_ready(jitted(system, arrays))
        # in compiled code the message omits the measured numbers and coordinates
        fragments_to_check = [f for f in fragments if not f.startswith("coordinates")]
    for fragment in fragments_to_check:
        assert fragment in str(info.value), (fragment, str(info.value)[:2000])


def test_one_failed_ensemble_member_fails_the_call():
    """Under vmap one lane whose stage solve fails raises (throw=True); with throw=False the
    lanes' statistics say which."""
    dts = jnp.array([0.05, 1.5, 0.05])

    def run(dt, throw):
        return vj.simulate(PEND, GAUSS2, q0=jnp.array([1.0]), v0=jnp.array([0.0]), dt=dt,
                           n_steps=20, throw=throw)

    with pytest.raises(Exception, match="did not converge"):
        jax.block_until_ready(jax.vmap(lambda dt: run(dt, True).q)(dts))
    ok = jax.vmap(lambda dt: run(dt, False).stats.all_converged)(dts)
    np.testing.assert_array_equal(np.asarray(ok), [True, False, True])


def test_gradient_through_a_failed_run_is_nan():
    """The run at dt = 1.5 does not converge; with throw=False its gradient is NaN, never a
    number (the finite gradient -2.153e+11 of earlier versions was meaningless)."""

    def loss(g, throw=False):
        sol = vj.simulate(vj.systems.Pendulum(g=g), GAUSS2, q0=jnp.array([1.0]),
                          v0=jnp.array([0.0]), dt=1.5, n_steps=20, throw=throw)
        return sol.q[-1, 0] ** 2

    assert np.isnan(float(jax.grad(loss)(9.81)))
    with pytest.raises(vj.ConvergenceError):
        jax.grad(lambda g: loss(g, throw=True))(9.81)
    # a converged run keeps its finite gradient
    ok = jax.grad(lambda g: vj.simulate(vj.systems.Pendulum(g=g), GAUSS2, q0=jnp.array([1.0]),
                                        v0=jnp.array([0.0]), dt=0.05, n_steps=20).q[-1, 0])
    assert np.isfinite(float(ok(9.81)))


def test_inverse_legendre_failure_with_p0_is_named():
    class Stiff(vj.LagrangianSystem):  # D2L(v) = exp(v) - 1 + ... has no v for p0 = -5
        def lagrangian(self, q, v):
            return jnp.sum(jnp.exp(v) - v) - 0.5 * jnp.sum(q**2)

    with pytest.raises(ValueError, match="inverse Legendre map"):
        vj.simulate(Stiff(), GAUSS2, q0=jnp.array([0.1]), p0=jnp.array([-5.0]), dt=0.1,
                    n_steps=2)


def test_float64_input_without_x64_warns_once_naming_the_switch():
    """In a process without x64, NumPy float64 initial data would run in float32 silently."""
    code = (
        "import warnings, numpy as np, jax.numpy as jnp, vijax as vj\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(2):\n"
        "        sol = vj.simulate(vj.systems.Pendulum(), vj.VPRK.gauss(2), q0=np.array([1.0]),\n"
        "                          v0=np.array([0.0]), dt=0.1, n_steps=4)\n"
        "    assert sol.q.dtype == jnp.float32\n"
        "    hits = [x for x in w if issubclass(x.category, vj.PrecisionWarning)]\n"
        "    assert len(hits) == 1, [str(x.message) for x in w]\n"
        "    msg = str(hits[0].message)\n"
        "    assert 'jax_enable_x64' in msg and 'float32' in msg, msg\n"
        "    vj.simulate(vj.systems.Pendulum(), vj.VPRK.gauss(2), q0=np.array([1.0], np.float32),\n"
        "                v0=np.array([0.0], np.float32), dt=0.1, n_steps=4)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
