"""The symplectic Lie-group methods on ``T*G`` of Bogfjellmo & Marthinsen (2016): VRKMK
(their eq. (16)) and VCG (their eq. (18)), on the rigid-body systems of
:mod:`vijax.systems.rigid`.

Independent references:

* on the abelian group ``R^n`` both families are the symplectic partitioned Runge--Kutta method
  ``(a, b; â, b)``: the same steps as :class:`vijax.VPRK` on the same Lagrangian (§§4.1, 4.2);
* the midpoint VRKMK and the midpoint VCG are the same method (Example 3.3), and a VCG
  composition is the composition of its steps (Lemma 5.4);
* one step of every method of Tables 1 and 2 on the dipole on a stick (§6.1, gravity sign
  ``κ = −1``) against values from an independent implementation of eqs. (16) and (18);
* measured orders at ``t = 0.5`` (Fig. 2) against the sixth-order VRKMK at a small step, the
  order bounds of Thm 5.3 / Prop. 3.1;
* energy over long times (Fig. 3), exact Noether conservation, symplecticity in canonical
  exponential coordinates, symmetry, gradients, forcing and bad input.

Runs go through one compiled runner per (method, system class) (:func:`_runner`), with the
step size and step counts as run-time arguments, so that every test reuses its compilation.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from vijax import tableaus as tb
from vijax.integrators.tstar import (VCG, VRKMK, bernoulli, composition_tableau,
                                     dexp_star, dexpinv_truncated, dexpinv_truncated_vjp,
                                     kutta3_tableau, spatial_field, sprk_order, vcg_order,
                                     vcg_order_conditions, vrkmk_order)
from vijax.systems.rigid import DipoleOnStick, FreeRigidBody, HeavyTop
from helpers import assert_no_drift

SO3 = vj.lie.SO3()
pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py

# --------------------------------------------------------------------------------------------
# Methods and runners
# --------------------------------------------------------------------------------------------

METHODS = {
    "VRKMK.midpoint": lambda: VRKMK.midpoint(),
    "VRKMK.kutta3": lambda: VRKMK.kutta3(),
    "VRKMK.gauss2": lambda: VRKMK.gauss(2),
    "VRKMK.gauss3": lambda: VRKMK.gauss(3),
    "VRKMK.gauss2.r0": lambda: VRKMK.gauss(2, r=0),
    "VRKMK.gauss2.r1": lambda: VRKMK.gauss(2, r=1),
    "VCG.midpoint": lambda: VCG.midpoint(),
    "VCG.triple_jump": lambda: VCG.triple_jump(),
    "VCG.yoshida6": lambda: VCG.yoshida6(),
}
_INTEGRATORS: dict = {}
_RUNNERS: dict = {}
MAXB = 128  # block buffer of a run


def integrator(key):
    if key not in _INTEGRATORS:
        _INTEGRATORS[key] = METHODS[key]()
    return _INTEGRATORS[key]


def spatial(q, p):
    """Spatial momentum ``μ = Ad*_{q⁻¹} μ̄ = q μ̄`` on SO(3)."""
    return q @ p


def _runner(key, system_type):
    """``run(system, state, h, n_blocks, n_inner)``: ``n_blocks · n_inner`` steps (both at run
    time); per block the extremes of ``E − E0`` and ``max |μ − μ0|`` (spatial momentum, per
    component) over its steps; the largest iteration count, and whether every solve
    converged.  One compilation per (method, system class)."""
    if (key, system_type) in _RUNNERS:
        return _RUNNERS[key, system_type]
    integ = integrator(key)

    @jax.jit
    def run(system, state, h, n_blocks, n_inner):
        G = system.group
        energy = lambda s: system.energy(s.q, integ.velocity(system, s))  # noqa: E731
        J = lambda s: G.Ad_star(G.inverse(s.q), s.p)  # noqa: E731
        e0, j0 = energy(state), J(state)
        dtype = state.p.dtype

        def inner(_, c):
            st, emax, emin, jdev, it, ok = c
            st, stats = integ.step(system, st, h)
            de = energy(st) - e0
            return (st, jnp.maximum(emax, de), jnp.minimum(emin, de),
                    jnp.maximum(jdev, jnp.abs(J(st) - j0)), jnp.maximum(it, stats.iterations),
                    ok & stats.converged)

        def outer(k, c):
            st, bmax, bmin, bj, it, ok = c
            init = (st, jnp.asarray(-jnp.inf, dtype), jnp.asarray(jnp.inf, dtype),
                    jnp.zeros_like(j0), it, ok)
            st, emax, emin, jdev, it, ok = jax.lax.fori_loop(0, n_inner, inner, init)
            return (st, bmax.at[k].set(emax), bmin.at[k].set(emin), bj.at[k].set(jdev), it, ok)

        init = (state, jnp.full(MAXB, jnp.nan, dtype), jnp.full(MAXB, jnp.nan, dtype),
                jnp.full((MAXB,) + j0.shape, jnp.nan, dtype), jnp.asarray(0, jnp.int32),
                jnp.asarray(True))
        return jax.lax.fori_loop(0, n_blocks, outer, init)

    _RUNNERS[key, system_type] = run
    return run


def advance(key, system, state, h, n, blocks=1):
    """``blocks · n`` steps of size ``h`` from ``state``; asserts every solve converged."""
    assert blocks <= MAXB
    out = _runner(key, type(system))(system, state, h, blocks, n)
    assert bool(out[5]), f"{key}: a stage solve did not converge (h = {h})"
    return out


def dipole_start(key, system=None):
    system = DipoleOnStick() if system is None else system
    g0, w0 = system.initial()
    return system, integrator(key).init(system, 0.0, g0, w0)


def err(state, ref):
    """``‖Δμ‖₂ + ‖Δg‖₂`` (spatial momentum, spectral norm): the error of §6.1, Fig. 2."""
    dmu = np.linalg.norm(np.asarray(spatial(state.q, state.p) - spatial(ref.q, ref.p)))
    return dmu + np.linalg.norm(np.asarray(state.q - ref.q), 2)


def slope(hs, errs):
    return np.polyfit(np.log(hs), np.log(errs), 1)[0]


# --------------------------------------------------------------------------------------------
# Building blocks: conventions, truncated dexp⁻¹, tableaus
# --------------------------------------------------------------------------------------------


def test_right_trivialised_dexp_is_the_group_dexp_at_minus_x():
    """The paper's dexp is right-trivialised, ``d/dε exp(x + εv) = (dexp_x v)·exp(x)``, with
    ``+½ ad_x`` as first-order term; in vijax's left-trivialised convention it is
    ``group.dexp(-x)``, and :func:`dexp_star` is its transpose."""
    x = jnp.array([0.3, -0.5, 0.2])
    v = jnp.array([0.1, 0.7, -0.4])
    E = SO3.exp(x)
    dE = jax.jvp(SO3.exp, (x,), (v,))[1]
    right = SO3.vee(dE @ E.T)                                       # (d/dε exp)·exp(x)⁻¹
    np.testing.assert_allclose(right, SO3.dexp(-x) @ v, atol=1e-15)
    assert np.max(np.abs(right - SO3.dexp(x) @ v)) > 1e-2        # not the left one
    # first-order term +½ ad_x
    eps = 1e-6
    lin = (SO3.dexp(-eps * x) - jnp.eye(3)) / eps
    np.testing.assert_allclose(lin, 0.5 * SO3.ad(x), atol=1e-6)
    w = jnp.array([0.2, 0.1, 0.3])
    np.testing.assert_allclose(dexp_star(SO3, x, w), SO3.dexp(-x).T @ w, atol=0)
    # dexp_x ∘ dexp⁻¹_{−x} = Ad_{exp x}  (the identity of §4.1)
    np.testing.assert_allclose(SO3.dexp(-x) @ jnp.linalg.inv(SO3.dexp(x)), E, atol=1e-14)


@pytest.mark.parametrize("r", [0, 1, 2, 3, 4, 6])
def test_truncated_dexpinv_and_its_derivative(r):
    """``dexp⁻¹_(r)`` against the closed forms on SO(3) (``x̂³ = −θ² x̂``), ``r = 2k`` and
    ``2k + 1`` the same, and ``P*_(r)`` by ``jax.vjp`` against the series of eq. (15)."""
    x = jnp.array([0.3, -0.5, 0.2])
    xi = jnp.array([0.1, 0.7, -0.4])
    w = jnp.array([-0.3, 0.2, 0.9])
    X = SO3.hat(x)
    th2 = float(x @ x)
    coeff2 = {0: None, 1: 0.0, 2: 1 / 12, 3: 1 / 12, 4: 1 / 12 + th2 / 720,
              6: 1 / 12 + th2 / 720 + th2**2 / 30240}[r]
    want = (jnp.eye(3) if r == 0 else jnp.eye(3) - 0.5 * X + coeff2 * X @ X) @ xi
    np.testing.assert_allclose(dexpinv_truncated(SO3, r, x, xi), want, atol=1e-15)
    # P*_(r)(x, ξ) = ½ ad*_ξ − Σ_{k=2}^{r} (B_k/k!) Σ_{i=0}^{k−1} ad*_{ad_x^i ξ} (ad*_x)^{k−i−1}
    ad_s = lambda v: SO3.ad(v).T  # noqa: E731
    if r == 0:
        P = jnp.zeros((3, 3))
    else:
        P = 0.5 * ad_s(xi)
        for k in range(2, r + 1):
            c = float(bernoulli(k)) / math.factorial(k)
            for i in range(k):
                P = P - c * ad_s(jnp.linalg.matrix_power(SO3.ad(x), i) @ xi) @ \
                    jnp.linalg.matrix_power(ad_s(x), k - i - 1)
    Pw, Dw = dexpinv_truncated_vjp(SO3, r, x, xi, w)
    np.testing.assert_allclose(Pw, P @ w, atol=1e-15)
    np.testing.assert_allclose(Dw, jax.jacfwd(lambda v: dexpinv_truncated(SO3, r, x, v))(xi).T @ w,
                               atol=1e-15)
    # the exact dexp⁻¹ is the limit r → ∞ (a different method, not the one used)
    exact = jnp.linalg.inv(SO3.dexp(-x)) @ xi
    assert np.max(np.abs(dexpinv_truncated(SO3, 12, x, xi) - exact)) < 1e-12


def test_tableau_traits_and_validators():
    """Table 1 and 2: the conjugate of Kutta3 (eq. (16) notes), the SPRK and VRKMK orders
    (Thm 5.3 with the order barrier of Prop. 3.1), the VCG order-3 conditions of §5.2 (hold
    for Table 2(b), (c), fail for Gauss and Kutta3), the composition tableau of Lemma 5.4."""
    k3 = kutta3_tableau()
    np.testing.assert_allclose(
        tb.symplectic_conjugate(k3).a,
        [[1 / 6, -4 / 3, 7 / 6], [1 / 6, 2 / 3, -1 / 3], [1 / 6, 2 / 3, 1 / 6]], atol=1e-15)
    assert sprk_order(k3, 6) == 3 and sprk_order(tb.gauss(3), 8) == 6
    orders = {(s, r): vrkmk_order(tb.gauss(s), r) for s, r in
              [(1, 0), (2, 0), (2, 1), (2, 2), (2, 3), (3, 2), (3, 3), (3, 4)]}
    assert orders == {(1, 0): 2, (2, 0): 2, (2, 1): 3, (2, 2): 4, (2, 3): 4, (3, 2): 5,
                      (3, 3): 5, (3, 4): 6}
    assert [VRKMK.midpoint().order, VRKMK.kutta3().order, VRKMK.gauss(2).order,
            VRKMK.gauss(3).order] == [2, 3, 4, 6]
    assert [VCG.midpoint().order, VCG.triple_jump().order, VCG.yoshida6().order] == [2, 4, 6]
    for m in (VCG.triple_jump(), VCG.yoshida6()):
        assert max(abs(d) for d in vcg_order_conditions(m.tableau).values()) <= 2e-15
    for t in (tb.gauss(2), tb.gauss(3), k3):
        d = vcg_order_conditions(t)   # the RK and SPRK conditions hold, the CG ones do not
        assert max(abs(d[k]) for k in d if "RK" in k) < 1e-15
        assert abs(d["order 3 (CG): sum b c beta = 1/3"]) > 5e-3
        assert abs(d["order 3: sum b^3 = 0"]) > 0.1
        assert vcg_order(t) == 2 and VCG(t).order == 2
    # Table 2(b) as printed
    g1 = 1 / (2 - 2 ** (1 / 3))
    g2 = -2 ** (1 / 3) / (2 - 2 ** (1 / 3))
    tj = VCG.triple_jump().tableau
    np.testing.assert_allclose(tj.a, [[g1 / 2, 0, 0], [g1, g2 / 2, 0], [g1, g2, g1 / 2]],
                               atol=1e-15)
    np.testing.assert_allclose(tj.c, [g1 / 2, 0.5, 1 - g1 / 2], atol=1e-15)
    # Lemma 5.4 for two different tableaus
    t = composition_tableau([tb.gauss(2), k3], [0.3, 0.7])
    assert t.stages == 5
    np.testing.assert_allclose(t.a[2:, :2], np.broadcast_to(0.3 * tb.gauss(2).b, (3, 2)))
    np.testing.assert_allclose(t.a[:2, :2], 0.3 * tb.gauss(2).a)
    np.testing.assert_allclose(t.a[2:, 2:], 0.7 * k3.a)
    np.testing.assert_allclose(t.b, np.concatenate([0.3 * tb.gauss(2).b, 0.7 * k3.b]))
    # symmetry traits
    assert VRKMK.midpoint().symmetric and VCG.midpoint().symmetric
    assert VCG.triple_jump().symmetric and VCG.yoshida6().symmetric
    assert not VRKMK.kutta3().symmetric and not VRKMK.gauss(2).symmetric
    # presets listed for the contract test
    calls = [c for c, _ in VRKMK.presets() + VCG.presets()]
    assert "VRKMK.gauss(2)" in calls and "VCG.yoshida6()" in calls


# --------------------------------------------------------------------------------------------
# The dipole on a stick: f, initial data, one-step regression, orders
# --------------------------------------------------------------------------------------------


def test_dipole_initial_data_and_f():
    """§6.1: μ(0) = (0, mα², 0), f1(g(0), μ(0)) = e2, H(0) = −0.046239253715916528 and
    f2 = (−1.0712…, 0, 0) for κ = −1 ((0.9287…, 0, 0) for the printed κ = +1); ``f`` (eqs.
    (4)--(5)) against direct autodiff of the right-trivialised Lagrangian."""
    system = DipoleOnStick()
    g0, w0 = system.initial()
    np.testing.assert_allclose(w0, [0.0, 0.0, -1.0])
    mu0 = spatial(g0, system.momentum(g0, w0))
    np.testing.assert_allclose(mu0, [0.0, 0.01, 0.0], atol=1e-17)
    assert abs(float(system.energy(g0, w0)) + 0.046239253715916528) < 1e-16
    field = jax.jit(spatial_field)
    f1, f2 = field(system, g0, mu0)
    np.testing.assert_allclose(f1, [0.0, 1.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(f2, [-1.071232221838545, 0.0, 0.0], atol=1e-14)
    _, f2p = field(DipoleOnStick(kappa=1.0), g0, mu0)
    np.testing.assert_allclose(f2p, [0.928767778161455, 0.0, 0.0], atol=1e-14)

    # f2 = ∇_η ℓ_R(exp(η) q, ξ_s) with ℓ_R(q, ξ_s) = ℓ(q, Ad_{q⁻¹} ξ_s), at a generic point
    q = SO3.exp(jnp.array([0.4, 0.1, -0.3])) @ g0
    mu = jnp.array([0.3, -0.2, 0.05])
    ell_R = lambda qq, xs: system.lagrangian(qq, qq.T @ xs)  # noqa: E731
    xs = q @ system.velocity(q, q.T @ mu)
    np.testing.assert_allclose(jax.grad(ell_R, argnums=1)(q, xs), mu, atol=1e-15)
    f2_ad = jax.grad(lambda eta: ell_R(SO3.exp(eta) @ q, xs))(jnp.zeros(3))
    f1, f2 = field(system, q, mu)
    np.testing.assert_allclose(f1, xs, atol=1e-15)
    np.testing.assert_allclose(f2, f2_ad, rtol=1e-13, atol=1e-15)


#: μ1 (spatial) after one step h = 0.1 from the §6.1 initial data (κ = −1), from an
#: independent implementation of eqs. (16) and (18) solved to 1e-16.
ONE_STEP = {
    "VRKMK.midpoint": (-0.1071441831502937, 0.009757651465007599),
    "VRKMK.kutta3": (-0.1071299326153020, 0.009742487189148046),
    "VRKMK.gauss2": (-0.1071310385030157, 0.009741506883990555),
    "VRKMK.gauss3": (-0.1071310180738336, 0.009741501414017426),
    "VCG.midpoint": (-0.1071441831502937, 0.009757651465007599),
    "VCG.triple_jump": (-0.1071316615877347, 0.009742159426961088),
    "VCG.yoshida6": (-0.1071310206137936, 0.009741504624374705),
}
Q1_MIDPOINT = np.array([
    [0.9951319240840227, 0.09855169308054866, -1.321354915757324e-4],
    [-6.538319076375284e-4, 0.005261354256079902, -0.9999859452288460],
    [-0.09854961274742459, 0.9951180241269623, 0.005300177825628219]])


@pytest.mark.parametrize("key", list(ONE_STEP))
def test_one_step_regression(key):
    """One step of each method of Tables 1 and 2 (h = 0.1, κ = −1) to 1e-12; the midpoint
    ``q1`` too.  Stays on SO(3) and conserves μ3 = 0."""
    system, st = dipole_start(key)
    new = advance(key, system, st, 0.1, 1)[0]
    mu1 = np.asarray(spatial(new.q, new.p))
    np.testing.assert_allclose(mu1[:2], ONE_STEP[key], rtol=0, atol=1e-12)
    assert abs(mu1[2]) < 1e-16
    assert float(SO3.distance(new.q)) < 1e-14
    if key.endswith("midpoint"):
        np.testing.assert_allclose(np.asarray(new.q), Q1_MIDPOINT, rtol=0, atol=1e-12)


def test_midpoint_vrkmk_equals_midpoint_vcg_and_compositions_compose():
    """Example 3.3: the midpoint VRKMK (r = 0) and the midpoint VCG are one method (1e-13 per
    step, from several states); Lemma 5.4: a VCG step of Table 2(b) is three midpoint VCG steps
    with γ1 h, γ2 h, γ1 h, and Table 2(c) seven with Yoshida's weights."""
    from vijax.integrators.tstar import TRIPLE_JUMP, YOSHIDA6
    system, a = dipole_start("VRKMK.midpoint")
    _, b = dipole_start("VCG.midpoint")
    for _ in range(3):
        a1 = advance("VRKMK.midpoint", system, a, 0.05, 1)[0]
        b1 = advance("VCG.midpoint", system, eqx.tree_at(lambda s: (s.q, s.p), b, (a.q, a.p)),
                     0.05, 1)[0]
        assert np.max(np.abs(np.asarray(a1.q - b1.q))) < 1e-13
        assert np.max(np.abs(np.asarray(a1.p - b1.p))) < 1e-13
        a, b = a1, b1
    h = 0.1
    for key, gammas in (("VCG.triple_jump", TRIPLE_JUMP), ("VCG.yoshida6", YOSHIDA6)):
        _, st = dipole_start(key)
        whole = advance(key, system, st, h, 1)[0]
        sub = dipole_start("VCG.midpoint")[1]
        for gam in gammas:
            sub = advance("VCG.midpoint", system, sub, h * float(gam), 1)[0]
        assert np.max(np.abs(np.asarray(whole.q - sub.q))) < 1e-13
        assert np.max(np.abs(np.asarray(whole.p - sub.p))) < 1e-13


@pytest.fixture(scope="module")
def reference():
    """Gauss3, r = 4, h = 1e-3 at t = 0.5 (the reference of Fig. 2)."""
    system, st = dipole_start("VRKMK.gauss3")
    ref = advance("VRKMK.gauss3", system, st, 1e-3, 500)[0]
    # the reference of the paper description, to its printed digits
    np.testing.assert_allclose(np.asarray(ref.q), [
        [0.923750566, 0.382994572, -2.21448834e-4], [-0.0509087573, 0.122214510, -0.991197211],
        [-0.379596088, 0.915630259, 0.132393500]], atol=2e-9)
    np.testing.assert_allclose(np.asarray(spatial(ref.q, ref.p)),
                               [-0.536187018, 3.78062033e-3, 0.0], atol=2e-9)
    return ref


def _errors(key, Ns, ref):
    system, st = dipole_start(key)
    return np.array([err(advance(key, system, st, 0.5 / N, N)[0], ref) for N in Ns])


#: (method, step counts N (h = 0.5/N), expected order, tolerance on the slope, errors of the
#: independent implementation at those N (Fig. 2 reproduction), relative agreement)
ORDERS = [
    ("VRKMK.midpoint", [10, 20, 40, 80], 2, 0.15, [9.226e-4, 2.319e-4, 5.804e-5, 1.451e-5]),
    ("VRKMK.kutta3", [80, 160, 320, 640], 3, 0.25, [4.645e-8, 6.421e-9, 8.414e-10, 1.076e-10]),
    ("VRKMK.gauss2", [5, 10, 20, 40], 4, 0.15, [1.255e-5, 7.785e-7, 4.854e-8, 3.032e-9]),
    ("VRKMK.gauss3", [5, 10, 20], 6, 0.15, [7.848e-9, 1.180e-10, 1.818e-12]),
    ("VCG.midpoint", [10, 20, 40, 80], 2, 0.15, [9.226e-4, 2.319e-4, 5.804e-5, 1.451e-5]),
    ("VCG.triple_jump", [5, 10, 20, 40], 4, 0.15, [6.128e-4, 4.173e-5, 2.668e-6, 1.677e-7]),
    ("VCG.yoshida6", [5, 10, 20, 40], 6, 0.15, [2.382e-6, 4.087e-8, 6.541e-10, 1.026e-11]),
]


@pytest.mark.parametrize("key,Ns,order,tol,paper", ORDERS, ids=[o[0] for o in ORDERS])
def test_orders_on_the_dipole(key, Ns, order, tol, paper, reference):
    """Fig. 2: the error at t = 0.5 against the Gauss3 reference; least-squares log--log
    slope within ``tol`` of the order (Kutta3 fitted for h ≤ 0.0125 only: irregular before),
    and the errors themselves agree with an independent implementation to 3 digits or 1e-12
    (the equations are deterministic); the ``order`` trait is the measured one."""
    errs = _errors(key, Ns, reference)
    hs = 0.5 / np.array(Ns)
    assert abs(slope(hs, errs) - order) <= tol, (key, errs, slope(hs, errs))
    # 3 digits; the two references differ by round-off accumulated over 500 steps (3e-13:
    # references at h = 1e-3 and 5e-4 differ by as much)
    np.testing.assert_allclose(errs, paper, rtol=2e-3, atol=1e-12)
    assert integrator(key).order == order


@pytest.mark.parametrize("key,Ns,order", [
    ("VRKMK.gauss2.r0", [10, 20, 40, 80], 2),
    pytest.param("VRKMK.gauss2.r1", [20, 40, 80, 160], 3, marks=pytest.mark.slow)],
    ids=["r0", "r1"])
def test_order_bounds_of_the_cutoff(key, Ns, order, reference):
    """Thm 5.3 with Prop. 3.1: Gauss2 with r = 0 has order 2 (the barrier of the one-
    exponential format), with r = 1 order 3, whatever the tableau's order 4."""
    errs = _errors(key, Ns, reference)
    assert abs(slope(0.5 / np.array(Ns), errs) - order) <= 0.2, (key, errs)
    assert integrator(key).order == order


# --------------------------------------------------------------------------------------------
# Long-time behaviour, Noether, group
# --------------------------------------------------------------------------------------------


def _energy_run(key, T, h=0.01, blocks=10):
    system, st = dipole_start(key)
    n = int(round(T / h / blocks))
    st, emax, emin, jdev, _, _ = advance(key, system, st, h, n, blocks)
    de = np.maximum(np.abs(np.asarray(emax[:blocks])), np.abs(np.asarray(emin[:blocks])))
    return st, de, np.asarray(jdev[:blocks])


#: max|H − H0| bands (Fig. 3: 1e-3, 1e-7 and 1e-5 at h = 0.01)
ENERGY_BANDS = {"VRKMK.midpoint": (3e-4, 3e-3), "VRKMK.gauss2": (3e-8, 3e-7),
                "VCG.triple_jump": (3e-6, 3e-5)}


@pytest.mark.parametrize("key", list(ENERGY_BANDS))
def test_energy_error_magnitude_short(key):
    """Fig. 3 at h = 0.01 over t ∈ (0, 20): the energy error has reached its plateau
    (build-up in the first ≈ 10 time units) and is in the band of the paper's value; it is not
    round-off; μ3 (Noether) is conserved to round-off; the rotation stays orthogonal."""
    st, de, jdev = _energy_run(key, 20.0, blocks=2)
    lo, hi = ENERGY_BANDS[key]
    assert lo <= de.max() <= hi, de
    assert np.max(jdev[:, 2]) < 1e-13
    assert float(jnp.linalg.norm(st.q.T @ st.q - jnp.eye(3))) < 1e-13


def test_dipole_gravity_sign():
    """The paper prints the gravity term as ``+m e3ᵀ g e3``; the physical sign (the centre of
    mass is at ``−g e3``) is ``κ = −1``, the default, and only it gives the energy error of
    Fig. 3 (≈ 1e-3 for the midpoint rule at h = 0.01); with the printed sign it is ten times
    smaller.  The initial energy does not depend on the sign."""
    key = "VRKMK.midpoint"
    de = {}
    for kappa in (-1.0, 1.0):
        system, st = dipole_start(key, DipoleOnStick(kappa=kappa))
        g0, w0 = system.initial()
        assert abs(float(system.energy(g0, w0)) + 0.046239253715916528) < 1e-16
        _, emax, emin, _, _, _ = advance(key, system, st, 0.01, 2000)
        de[kappa] = max(abs(float(emax[0])), abs(float(emin[0])))
    assert DipoleOnStick().kappa == -1.0
    assert 3e-4 <= de[-1.0] <= 3e-3 and 3e-5 <= de[1.0] <= 3e-4, de


@pytest.mark.slow
@pytest.mark.parametrize("key", list(ENERGY_BANDS))
def test_energy_error_long_time_no_drift(key):
    """Fig. 3, the cheap variant T = 100, h = 0.01 (10⁴ steps in 125 blocks of 0.8): max|ΔH|
    in the band; no drift after the build-up (t ≥ 20): the linear trend fitted to the blocks'
    mid-ranges of ``H − H0`` is statistically zero (``|t| < 3``) and accumulates less than
    0.3 of max|ΔH| (measured: t = 1.28, 0.43, -0.59 and shares 0.14, 0.05, 0.08 for the
    midpoint rule, Gauss(2), the triple jump; an added drift of 0.4 max|ΔH| over the run
    gives t = 4.3--6.9); ‖gᵀg − I‖ ≤ 1e-12 at the end."""
    system, st = dipole_start(key)
    blocks = 125
    st, emax, emin, jdev, _, _ = advance(key, system, st, 0.01, 80, blocks)
    emax, emin = np.asarray(emax[:blocks]), np.asarray(emin[:blocks])
    de = np.maximum(np.abs(emax), np.abs(emin))
    lo, hi = ENERGY_BANDS[key]
    assert lo <= de.max() <= hi, de
    t = 0.8 * (np.arange(blocks) + 0.5)
    later = t >= 20.0
    assert_no_drift(t[later], 0.5 * (emax + emin)[later], share=0.3, label=key)
    assert np.max(np.asarray(jdev[:blocks])[:, 2]) < 1e-12
    assert float(jnp.linalg.norm(st.q.T @ st.q - jnp.eye(3))) < 1e-12


@pytest.mark.parametrize("key", ["VRKMK.midpoint", "VRKMK.kutta3", "VRKMK.gauss2",
                                 "VRKMK.gauss3", "VCG.triple_jump", "VCG.yoshida6"])
def test_dipole_discrete_noether(key):
    """The dipole's potential is invariant under rotations about e3, so μ3 = e3·μ is a
    momentum map; the discrete Lagrangian inherits the symmetry (the constraints are
    Ad-equivariant) and μ3 is conserved to round-off (1e-13 over 200 steps of h = 0.01, from
    μ3(0) = 0.003), while the energy is not."""
    system = DipoleOnStick()
    g0, _ = system.initial()
    st = integrator(key).init(system, 0.0, g0, jnp.array([0.0, 0.003, -1.0]))
    assert abs(float(spatial(st.q, st.p)[2]) - 0.003) < 1e-17
    _, emax, emin, jdev, _, _ = advance(key, system, st, 0.01, 200)
    assert float(jdev[0, 2]) <= 1e-13
    assert max(abs(float(emax[0])), abs(float(emin[0]))) > 1e-12


@pytest.mark.parametrize("key", ["VRKMK.gauss2", "VCG.triple_jump",
                                 pytest.param("VRKMK.midpoint", marks=pytest.mark.slow),
                                 pytest.param("VRKMK.kutta3", marks=pytest.mark.slow)])
def test_free_rigid_body_discrete_noether(key):
    """The free rigid body (I = diag(1, 2, 3), q0 = exp((0.4, 0.1, −0.3)), μ0 = (0.3, −0.2,
    0.5), h = 0.1, 100 steps): the spatial angular momentum is conserved to 1e-13 (the
    discrete Lagrangian inherits the left invariance), the energy is not."""
    system = FreeRigidBody()
    q0 = SO3.exp(jnp.array([0.4, 0.1, -0.3]))
    mu0 = jnp.array([0.3, -0.2, 0.5])
    xi0 = (q0.T @ mu0) / jnp.array([1.0, 2.0, 3.0])
    st = integrator(key).init(system, 0.0, q0, xi0)
    new, emax, emin, jdev, _, _ = advance(key, system, st, 0.1, 100)
    assert float(jdev[0].max()) <= 1e-13
    assert max(abs(float(emax[0])), abs(float(emin[0]))) > 1e-12      # not conserved
    np.testing.assert_allclose(spatial(new.q, new.p), mu0, atol=1e-13)


# --------------------------------------------------------------------------------------------
# Symplecticity, symmetry, gradients
# --------------------------------------------------------------------------------------------


#: The heavy top of the symplecticity and gradient tests: ``q = exp(x) QHAT``; canonical
#: exponential coordinates ``x = log(q QHAT⁻¹)``, ``p_x = dexp*_x μ`` (right-trivialised
#: dexp, spatial μ) are Darboux coordinates of T*SO(3) near ``QHAT``.
QHAT = SO3.exp(jnp.array([0.05, -0.02, 0.03])) @ SO3.exp(jnp.array([0.3, -0.2, 0.1]))
THETA0 = jnp.array([0.02, -0.01, 0.03, 0.4, -0.3, 0.8, 1.0, 1.5, 2.5])  # (x, Ω0, inertia)
H_JAC = 0.05


def _canonical(q, mu):
    x = SO3.log(q @ QHAT.T)
    return jnp.concatenate([x, SO3.dexp(-x).T @ mu])


def _chart(theta):
    """``(x, Ω0, inertia) -> (x, p_x)`` of the initial point."""
    q = SO3.exp(theta[:3]) @ QHAT
    return _canonical(q, q @ (theta[6:] * theta[3:6]))


def _lie_euler(system, q, mu, h):
    """``q1 = exp(h ξ) q``, ``μ1 = μ + h (f2 − ad*_ξ μ)``: explicit and not symplectic."""
    xi, n = spatial_field(system, q, mu)
    return SO3.exp(h * xi) @ q, mu + h * (n - SO3.ad_star(xi, mu))


_JACOBIANS: dict = {}


def _step_jacobian(key):
    """``(F, jacfwd(F))`` jitted, ``F(theta)`` the canonical coordinates after one step of
    size ``H_JAC`` of the heavy top (gravity 1, inertia ``theta[6:]``) from ``q = exp(x)
    QHAT`` with body velocity ``theta[3:6]``.  Shared by the symplecticity and gradient
    tests (one compilation of the Jacobian program per method)."""
    if key in _JACOBIANS:
        return _JACOBIANS[key]

    def F(theta):
        system = HeavyTop(inertia=theta[6:], gravity=1.0)
        q = SO3.exp(theta[:3]) @ QHAT
        if key == "LieEuler":
            q1, mu1 = _lie_euler(system, q, q @ system.momentum(q, theta[3:6]), H_JAC)
        else:
            integ = integrator(key)
            new, _ = integ.step(system, integ.init(system, 0.0, q, theta[3:6]), H_JAC)
            q1, mu1 = new.q, spatial(new.q, new.p)
        return _canonical(q1, mu1)

    _JACOBIANS[key] = (jax.jit(F), jax.jit(jax.jacfwd(F)))
    return _JACOBIANS[key]


def _symplecticity_defect(key):
    _, jac = _step_jacobian(key)
    J = jac(THETA0)[:, :6] @ jnp.linalg.inv(jax.jacfwd(_chart)(THETA0)[:, :6])
    Om = jnp.block([[jnp.zeros((3, 3)), jnp.eye(3)], [-jnp.eye(3), jnp.zeros((3, 3))]])
    return float(jnp.max(jnp.abs(J.T @ Om @ J - Om)))


@pytest.mark.parametrize("key", ["VRKMK.gauss2", "VCG.triple_jump",
                                 pytest.param("VRKMK.kutta3", marks=pytest.mark.slow)])
def test_symplectic_in_canonical_exponential_coordinates(key):
    """``JᵀΩJ = Ω`` for the one-step map of the heavy top in canonical exponential
    coordinates of T*SO(3) (``J`` by jax.jacfwd through the step: implicit differentiation
    of the stage solve); the same check catches a Lie--Euler step."""
    assert _symplecticity_defect(key) < 1e-12
    assert _symplecticity_defect("LieEuler") > 1e-4


@pytest.mark.parametrize("key", ["VRKMK.gauss2", "VCG.triple_jump"])
def test_gradients_through_the_step(key):
    """Derivatives of one step of the heavy top with respect to the initial configuration,
    the initial body velocity and the inertia (jax.jacfwd through the step, implicit
    differentiation of the stage solve) against central differences, 1e-6 relative."""
    F, jac = _step_jacobian(key)
    J = np.asarray(jac(THETA0))
    eps = 1e-6
    fd = np.stack([(F(THETA0.at[i].add(eps)) - F(THETA0.at[i].add(-eps))) / (2 * eps)
                   for i in range(THETA0.size)], axis=1)
    np.testing.assert_allclose(J, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("key,symmetric", [("VRKMK.midpoint", True), ("VCG.midpoint", True),
                                           ("VCG.triple_jump", True), ("VCG.yoshida6", True),
                                           ("VRKMK.kutta3", False)])
def test_symmetry(key, symmetric):
    """Φ_{−h} ∘ Φ_h = id to 1e-14 for the midpoint rule and the symmetric compositions
    (Example 3.3, Table 2); not for Kutta3."""
    system, st = dipole_start(key)
    st = advance(key, system, st, 0.05, 3)[0]
    there = advance(key, system, st, 0.05, 1)[0]
    back = advance(key, system, there, -0.05, 1)[0]
    defect = max(float(jnp.max(jnp.abs(back.q - st.q))), float(jnp.max(jnp.abs(back.p - st.p))))
    assert integrator(key).symmetric == symmetric
    if symmetric:
        assert defect < 1e-14, defect
    else:
        assert defect > 1e-8, defect


def test_heavy_top_vertical_momentum():
    """The heavy top conserves e3·(g I Ω) (its potential is invariant under rotations about
    the vertical) but not the horizontal components: one step of VRKMK Gauss2 and of VCG
    triple jump (the programs of the gradient test)."""
    system = HeavyTop(inertia=THETA0[6:], gravity=1.0)
    q0 = SO3.exp(THETA0[:3]) @ QHAT
    mu0 = spatial(q0, system.momentum(q0, THETA0[3:6]))
    assert abs(float(system.vertical_momentum(q0, THETA0[3:6]) - mu0[2])) < 1e-16
    for key in ("VRKMK.gauss2", "VCG.triple_jump"):
        z = _step_jacobian(key)[0](THETA0)
        mu1 = jnp.linalg.solve(SO3.dexp(-z[:3]).T, z[3:])
        assert abs(float(mu1[2] - mu0[2])) < 1e-15
        assert float(jnp.max(jnp.abs(mu1[:2] - mu0[:2]))) > 1e-3


# --------------------------------------------------------------------------------------------
# Forcing, Newton, bad input
# --------------------------------------------------------------------------------------------


class DampedRigidBody(vj.ForcedSystem, FreeRigidBody):
    """A free rigid body with a body-frame damping torque ``−c Ω``."""

    c: float = 0.2

    def force(self, t, g, xi, u):
        return -self.c * xi


NMAX_FORCED = 64


def _forced_run(key, h, T=1.0):
    """Energy and the power ``F·Ω`` at every step point (one compilation per method: the
    step count is a run-time argument); the work by composite Simpson."""
    integ = integrator(key)
    system = DampedRigidBody()
    n = int(round(T / h))
    assert n % 2 == 0 and n <= NMAX_FORCED
    if (key, "forced") not in _RUNNERS:
        @jax.jit
        def run(h, n):
            q0 = SO3.exp(jnp.array([0.4, 0.1, -0.3]))
            st = integ.init(system, 0.0, q0, jnp.array([0.8, -0.6, 0.5]))

            def record(s, E, P, k):
                w = integ.velocity(system, s)
                return (E.at[k].set(system.energy(s.q, w)),
                        P.at[k].set(jnp.dot(system.force(s.t, s.q, w, None), w)))

            def one(k, c):
                s, E, P, ok = c
                s, stats = integ.step(system, s, h)
                E, P = record(s, E, P, k + 1)
                return s, E, P, ok & stats.converged

            E, P = record(st, jnp.zeros(NMAX_FORCED + 1), jnp.zeros(NMAX_FORCED + 1), 0)
            return jax.lax.fori_loop(0, n, one, (st, E, P, jnp.asarray(True)))[1:]
        _RUNNERS[key, "forced"] = run
    E, P, ok = _RUNNERS[key, "forced"](h, n)
    assert bool(ok)
    E, P = np.asarray(E)[:n + 1], np.asarray(P)[:n + 1]
    w = np.ones(n + 1)
    w[1:-1:2], w[2:-1:2] = 4, 2
    return E, h / 3 * np.sum(w * P)


@pytest.mark.parametrize("key,order", [("VRKMK.midpoint", 2), ("VRKMK.gauss2", 4)])
def test_forced_energy_balance(key, order):
    """Lagrange--d'Alembert with a damping torque −cΩ: the energy decreases, and the balance
    E(T) − E(0) = ∫ F·Ω dt (work by Simpson's rule along the numerical solution) holds with a
    defect of the method's order."""
    defects = []
    hs = [0.1, 0.05, 0.025]
    for h in hs:
        E, work = _forced_run(key, h)
        assert E[-1] < 0.8 * E[0] and np.all(np.diff(E) < 0)
        defects.append(abs(E[-1] - E[0] - work))
    assert abs(slope(hs, defects) - order) < 0.3, defects


@pytest.mark.slow
def test_newton_solver_and_large_steps():
    """Newton (``solver=vj.solvers.Newton()``) gives the same step as the fixed point, and
    converges where the fixed point of the paper does not (a free body with the dipole's
    inertia, h = 0.05: ‖I⁻¹‖ = 100)."""
    system = FreeRigidBody(inertia=(1.01, 1.0, 0.01))
    q0 = SO3.exp(jnp.array([0.4, 0.1, -0.3]))
    xi0 = (q0.T @ jnp.array([0.3, -0.2, 0.5])) / jnp.array([1.01, 1.0, 0.01])
    fp = VRKMK.gauss(2)
    nt = VRKMK.gauss(2, solver=vj.solvers.Newton())
    step = jax.jit(lambda m, s, h: m.step(system, s, h), static_argnums=0)
    a, sa = step(fp, fp.init(system, 0.0, q0, xi0), 0.05)
    b, sb = step(nt, nt.init(system, 0.0, q0, xi0), 0.05)
    assert bool(sb.converged)
    assert not bool(sa.converged)
    c, sc = step(fp, fp.init(system, 0.0, q0, xi0), 0.002)
    d, sd = step(nt, nt.init(system, 0.0, q0, xi0), 0.002)
    assert bool(sc.converged) and bool(sd.converged)
    np.testing.assert_allclose(c.q, d.q, atol=1e-14)
    np.testing.assert_allclose(c.p, d.p, atol=1e-14)
    np.testing.assert_allclose(spatial(b.q, b.p), spatial(q0, q0.T @ jnp.array([0.3, -0.2, 0.5])),
                               atol=1e-13)


def test_bad_input():
    """A zero weight (the step equations divide by b_i), a vector-space system, a negative
    cut-off and an inconsistent VCG tableau are refused with messages that say what to do."""
    zero_b = tb.ButcherTableau.from_arrays([[0.0, 0.0], [1.0, 0.0]], [1.0, 0.0], [0.0, 1.0],
                                           "Euler-with-dead-stage", 1)
    with pytest.raises(ValueError, match=r"b\[1\] = 0"):
        VRKMK(zero_b, 0)
    with pytest.raises(ValueError, match="nonzero"):
        VCG(zero_b)
    with pytest.raises(ValueError, match="r must be >= 0"):
        VRKMK(tb.gauss(2), -1)
    with pytest.raises(ValueError, match="not consistent"):
        VCG(tb.ButcherTableau.from_arrays([[0.5]], [0.9], [0.5], "bad", 1))
    pendulum = vj.systems.Pendulum()
    for integ in (VRKMK.midpoint(), VCG.midpoint()):
        with pytest.raises(vj.IncompatibleSystemError, match="LieGroupSystem"):
            integ.init(pendulum, 0.0, jnp.array([0.1]), jnp.array([0.0]))
        assert not integ.accepts(pendulum)
        assert integ.accepts(DipoleOnStick()) and integ.accepts(DampedRigidBody())


# --------------------------------------------------------------------------------------------
# Abelian reduction
# --------------------------------------------------------------------------------------------


class _Kepler(vj.LagrangianSystem):
    quadratic_in_velocity = True

    def lagrangian(self, q, v):
        return 0.5 * jnp.dot(v, v) + 1.0 / jnp.linalg.norm(q)


class _KeplerOnR2(vj.LieGroupSystem):
    quadratic_in_velocity = True

    @property
    def group(self):
        return vj.lie.Rn(2)

    def lagrangian(self, g, xi):
        return 0.5 * jnp.dot(xi, xi) + 1.0 / jnp.linalg.norm(g)


@pytest.mark.parametrize("make,tableau", [
    (lambda: VRKMK(kutta3_tableau(), 1), kutta3_tableau()),
    (lambda: VRKMK(tb.gauss(2), 4), tb.gauss(2)),
    (lambda: VCG(kutta3_tableau()), kutta3_tableau()),
], ids=["VRKMK-kutta3", "VRKMK-gauss2-r4", "VCG-kutta3"])
def test_abelian_reduction_is_the_sprk_method(make, tableau):
    """On R^n (exp = id, ad = 0) VRKMK (any r) and VCG are the symplectic partitioned RK
    method (a, b; â, b): the same steps as vj.VPRK(tableau) on the Kepler problem, ≤ 1e-12."""
    integ = make()
    vprk = vj.VPRK(tableau)
    q0, v0 = jnp.array([0.8, 0.1]), jnp.array([0.2, 1.1])

    @jax.jit
    def both():
        a = integ.init(_KeplerOnR2(), 0.0, q0, v0)
        b = vprk.init(_Kepler(), 0.0, q0, v0)

        def one(c, _):
            a, b = c
            a = integ.step(_KeplerOnR2(), a, 0.1)[0]
            b = vprk.step(_Kepler(), b, 0.1)[0]
            return (a, b), (a.q - b.q, a.p - b.p)

        return jax.lax.scan(one, (a, b), None, length=5)[1]

    dq, dp = both()
    assert float(jnp.max(jnp.abs(dq))) <= 1e-12 and float(jnp.max(jnp.abs(dp))) <= 1e-12
