"""Dense output (``simulate(..., dense=True)``, ``Solution.evaluate``) for every family that has
it: the polynomials pass through the node values, agree whatever ``save_every``, and converge
at the order of the step polynomial (measured against a DOP853 dense reference)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import vijax as vj
from helpers import fitted_order
from vijax.diagnostics import euler_lagrange_rhs

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py

PEND = vj.systems.Pendulum()
CART = vj.systems.CartesianPendulum()
PARTICLE = vj.systems.NonholonomicParticle()
T_END = 2.0


def dense_presets():
    """The first preset of every family with dense output (the polynomial code is one per
    family; the contract test runs every preset), on the constrained pendulum too where the
    family accepts it."""
    out, seen = [], set()
    for call, integ in vj.integrators.registry():
        family = type(integ)
        if not isinstance(integ, vj.AbstractDenseIntegrator) or family in seen:
            continue
        seen.add(family)
        if vj.NonholonomicSystem in integ.required:
            systems = [PARTICLE]
        elif vj.HolonomicSystem in integ.required:
            systems = [CART]
        elif vj.HolonomicSystem in integ.supported:
            systems = [PEND, CART]
        else:
            systems = [PEND]
        out += [pytest.param(integ, system, id=f"{call}-{type(system).__name__}")
                for system in systems]
    return out


def initial(system):
    if system is PARTICLE:
        return PARTICLE.initial_conditions()
    if system is CART:
        th = 1.0
        return jnp.array([np.sin(th), -np.cos(th)]), 0.5 * jnp.array([np.cos(th), np.sin(th)])
    return jnp.array([1.0]), jnp.array([0.5])


@pytest.mark.parametrize("integ,system", dense_presets())
def test_dense_output_passes_through_the_nodes_and_ignores_save_every(integ, system):
    """At the grid points the node-valued variables equal the saved node values; between them
    the run saved every 4th step gives the same polynomials as the run saved at every step."""
    q0, v0 = initial(system)
    h, n = 0.1, 8
    every = vj.simulate(system, integ, q0=q0, v0=v0, dt=h, n_steps=n, dense=True)
    sparse = vj.simulate(system, integ, q0=q0, v0=v0, dt=h, n_steps=n, save_every=4,
                         dense=True)
    grid = every.evaluate(every.t)
    np.testing.assert_allclose(grid.q, every.q, rtol=0, atol=1e-14)
    layout = integ.dense_layout(system)
    if layout["p"][1] == "node":
        np.testing.assert_allclose(grid.p, every.p, rtol=0, atol=1e-14)
    if "v" in layout:
        np.testing.assert_allclose(grid.v, every.v, rtol=0, atol=1e-13)
    ts = jnp.linspace(0.0, h * n, 23)
    a, b = every.evaluate(ts), sparse.evaluate(ts)
    for x, y in zip(a, b):
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-14)
    # the interpolation rebuilt from states saved at every step is the same object
    c = integ.interpolation(system, every.states, h).evaluate(ts)
    np.testing.assert_allclose(c.q, a.q, rtol=0, atol=1e-14)
    np.testing.assert_allclose(c.p, a.p, rtol=0, atol=1e-14)
    assert a.q.shape == (23, q0.shape[0]) and a.q.dtype == q0.dtype


def dense_reference(system, q0, v0, ts):
    rhs = euler_lagrange_rhs(system)
    n = q0.shape[0]
    f = jax.jit(lambda y: jnp.concatenate(rhs(y[:n], y[n:])))
    out = solve_ivp(lambda t, y: np.asarray(f(jnp.asarray(y))), (0.0, T_END),
                    np.concatenate([q0, v0]), method="DOP853", t_eval=ts, rtol=3e-14,
                    atol=1e-16)
    q, v = out.y[:n].T, out.y[n:].T
    p = np.asarray(jax.vmap(system.momentum)(jnp.asarray(q), jnp.asarray(v)))
    return q, v, p


# (integrator, expected orders of q, v, p of the dense output away from the nodes).  The step
# polynomial of an s-stage Gauss method has degree s and stage order s: q is O(h^(s+1))
# uniformly, its derivative O(h^s) (for s = 1 the velocity is the linear interpolant of the
# node velocities, O(h^2)); the Galerkin configuration polynomial of degree s likewise.  In the
# Lobatto IIIA-IIIB pair the stage velocities come from the IIIB stage momenta, whose stage
# order is s - 2: q is O(h^s) and v, p O(h^(s-1)).
# (integrator, orders of q, v, p, in the default run).  Default run: one Gauss, one Lobatto and
# one Galerkin case (the interpolation code is the family's, the stage count a number); the
# others with -m slow.
_ORDERS = [
    (vj.VPRK.midpoint(), 2, 2, 2, False),
    (vj.VPRK.gauss(2), 3, 2, 2, True),
    (vj.VPRK.gauss(3), 4, 3, 3, False),
    (vj.VPRK.lobatto(3), 3, 2, 2, True),
    (vj.VPRK.lobatto(4), 4, 3, 3, False),
    (vj.GalerkinVI.gauss(2), 3, 2, 2, True),
    (vj.GalerkinVI.gauss(3), 4, 3, 3, False),
]
ORDERS = [pytest.param(i, oq, ov, op, id=i.name, marks=[] if default else [pytest.mark.slow])
          for i, oq, ov, op, default in _ORDERS]


@pytest.mark.parametrize("integ,oq,ov,op", ORDERS)
def test_dense_output_order(integ, oq, ov, op):
    q0, v0 = jnp.array([1.2]), jnp.array([0.3])
    ts = np.linspace(0.0, T_END, 137)[1:-1]  # not on any grid below
    q_ref, v_ref, p_ref = dense_reference(PEND, np.asarray(q0), np.asarray(v0), ts)
    hs, eq, ev, ep = [], [], [], []
    for n in (20, 28, 40, 56):
        sol = vj.simulate(PEND, integ, q0=q0, v0=v0, dt=T_END / n, n_steps=n, save_every=n,
                          dense=True)
        d = sol.evaluate(jnp.asarray(ts))
        hs.append(T_END / n)
        eq.append(np.max(np.abs(np.asarray(d.q) - q_ref)))
        ev.append(np.max(np.abs(np.asarray(d.v) - v_ref)))
        ep.append(np.max(np.abs(np.asarray(d.p) - p_ref)))
    for name, errs, expected in (("q", eq, oq), ("v", ev, ov), ("p", ep, op)):
        order = fitted_order(hs, errs)
        assert abs(order - expected) <= 0.3, (integ.name, name, order, errs)


def test_errors_name_the_fix():
    q0, v0 = initial(PEND)
    sol = vj.simulate(PEND, vj.VPRK.gauss(2), q0=q0, v0=v0, dt=0.1, n_steps=2)
    with pytest.raises(ValueError, match="dense=True"):
        sol.evaluate(0.05)
    # a PRK whose q-tableau is not a collocation method has no collocation polynomial
    lobatto_b = vj.VPRK(vj.tableaus.symplectic_pair(vj.tableaus.lobatto_iiib(3)))
    with pytest.raises(ValueError, match="collocation"):
        vj.simulate(PEND, lobatto_b, q0=q0, v0=v0, dt=0.1, n_steps=2, dense=True)


def test_evaluate_refuses_times_outside_the_run():
    """Dense output does not extrapolate: times before t0, after the last step, or NaN are an
    error (eagerly and under jit), not the clamped end value; a 2-D array of times too."""
    sol = vj.simulate(vj.systems.Pendulum(), vj.VPRK.gauss(3), q0=jnp.array([1.0]),
                      v0=jnp.array([0.0]), dt=0.1, n_steps=10, dense=True)
    for t in (100.0, -1.0, float("nan"), jnp.array([0.5, 1.5])):
        with pytest.raises(ValueError, match="does not extrapolate"):
            sol.evaluate(t)
    with pytest.raises(Exception, match="does not extrapolate"):
        jax.block_until_ready(jax.jit(lambda t: sol.evaluate(t).q)(1.5))
    with pytest.raises(ValueError, match="1-D array of times"):
        sol.evaluate(jnp.zeros((2, 2)))
    ends = sol.evaluate(jnp.array([0.0, 1.0]))   # the ends themselves are in the run
    np.testing.assert_allclose(ends.q, sol.q[jnp.array([0, -1])], atol=1e-14)
