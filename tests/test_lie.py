"""The Lie groups of ``vijax.lie``: property tests (hypothesis) of the group axioms, the
retractions and their trivialised tangents, the closed forms against their definitions by
autodiff, and the Taylor branches at and around ``ξ = 0``.

Every check of a group is one jitted function (compiled once per group, called on every
hypothesis example) that returns the errors of several identities; the references are the
definitions themselves (``jax.jvp`` of ``τ``, ``vee(g ξ̂ g^{-1})``, commutators), the power
series ``exp(X) = Σ X^k/k!`` and ``d^L exp_ξ = Σ (-ad_ξ)^k/(k+1)!`` (polynomials, so exact under
autodiff at any order), and the general matrix formulas of the Cayley map.
"""

import functools
import math
from fractions import Fraction

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import vijax as vj
from vijax.lie import (SE2, SE3, SO2, SO3, AbstractMatrixLieGroup, Cayley, Exp, ProductGroup,
                       Rn)

jax.config.update("jax_enable_x64", True)

pytestmark = pytest.mark.fast_compile

SETTINGS = settings(max_examples=25, deadline=None, database=None, derandomize=True)


# -- a small group that is not a Cayley group: the affine group of the line -------------------
class Aff1(AbstractMatrixLieGroup):
    """``{[[a, b], [0, 1]] : a > 0}``, algebra ``(α, β)``, ``hat = [[α, β], [0, 0]]``; generic
    ``Ad``, ``ad``, ``dexp`` of :class:`AbstractMatrixLieGroup`, no Cayley map."""

    @property
    def dim(self):
        return 2

    def identity(self, dtype=None):
        return jnp.eye(2, dtype=dtype)

    def project(self, g):
        return g.at[1].set(jnp.array([0.0, 1.0], dtype=g.dtype))

    def distance(self, g):
        return jnp.abs(g[1, 0]) + jnp.abs(g[1, 1] - 1.0)

    def hat(self, xi):
        return jnp.stack([xi, jnp.zeros_like(xi)])

    def vee(self, X):
        return X[0]

    @staticmethod
    def _phi(a):  # (e^a - 1)/a
        small = jnp.abs(a) < 1e-3
        a_safe = jnp.where(small, jnp.ones_like(a), a)
        return jnp.where(small, 1.0 + a / 2 + a * a / 6 + a ** 3 / 24, jnp.expm1(a_safe) / a_safe)

    def exp(self, xi):
        a, b = xi[0], xi[1]
        return jnp.stack([jnp.stack([jnp.exp(a), b * self._phi(a)]),
                          jnp.stack([jnp.zeros_like(a), jnp.ones_like(a)])])

    def log(self, g):
        a = jnp.log(g[0, 0])
        return jnp.stack([a, g[0, 1] / self._phi(a)])


GROUPS = {
    "Rn3": Rn(3),
    "SO2": SO2(),
    "SO3": SO3(),
    "SE2": SE2(),
    "SE3": SE3(),
    "SO3xR2": ProductGroup(SO3(), Rn(2)),
    "SE2xR1": ProductGroup(SE2(), Rn(1)),
}
MATRIX = [k for k, G in GROUPS.items() if isinstance(G, AbstractMatrixLieGroup)]
RETRACTIONS = {"exp": Exp(), "cay": Cayley()}

#: the block of the algebra vector whose norm is the rotation angle θ (the Taylor switch is at
#: θ² = 1); None where there is no branch
ROTATION_BLOCKS = {"Rn3": None, "SO2": None, "SO3": slice(0, 3), "SE2": slice(2, 3),
                   "SE3": slice(3, 6), "SO3xR2": slice(0, 3), "SE2xR1": slice(2, 3)}


def vectors(d, bound, n=1):
    vec = hnp.arrays(np.float64, (d,), elements=st.floats(-bound, bound, width=64))
    return st.tuples(*([vec] * n))


def max_err(a, b):
    """Largest absolute difference over the leaves of two pytrees."""
    errs = jax.tree_util.tree_map(lambda x, y: jnp.max(jnp.abs(x - y)), a, b)
    return functools.reduce(jnp.maximum, jax.tree_util.tree_leaves(errs))


def finite(tree):
    return functools.reduce(jnp.logical_and,
                            [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)])


def assert_small(errs, tol, context=""):
    errs = {k: float(v) for k, v in errs.items()}
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"{context}: {bad} (tolerance {tol:g}; all: {errs})"


# -- references ---------------------------------------------------------------------------------
def _power_series(A, coeff, terms):
    """``Σ_{k<terms} c_k A^k`` with ``c_k / c_{k-1} = coeff(k)`` and ``c_0 = 1`` (a
    ``lax.fori_loop``: one small program however many terms)."""
    eye = jnp.eye(A.shape[0], dtype=A.dtype)

    def body(k, carry):
        term, out = carry
        term = term @ A * coeff(k.astype(A.dtype))
        return term, out + term
    return jax.lax.fori_loop(1, terms, body, (eye, eye))[1]


def exp_series(G, xi, terms=30):
    """``Σ hat(ξ)^k/k!`` (matrix groups), factor by factor on products, ``ξ`` on ``R^n``."""
    if isinstance(G, ProductGroup):
        return tuple(exp_series(f, x, terms) for f, x in zip(G.factors, G.split(xi)))
    if isinstance(G, Rn):
        return xi
    return _power_series(G.hat(xi), lambda k: 1.0 / k, terms)


def dexp_series(G, xi, terms=30):
    """``d^L exp_ξ = (1 - e^{-ad_ξ})/ad_ξ = Σ (-ad_ξ)^k/(k+1)!``."""
    return _power_series(-G.ad(xi), lambda k: 1.0 / (k + 1.0), terms)


def tangent_at_identity(G, w):
    """The ambient tangent vector at the identity of the algebra vector ``w``."""
    return jax.jvp(G.exp, (jnp.zeros_like(w),), (w,))[1]


def ddtau_fd(R, G, xi, eta, Pi, dxi, h=1e-5):
    """``<Π, (dτ_ξ)^{-1} ∂_ξ(dτ_ξ η) δξ>`` by a central difference."""
    d = (R.dtau(G, xi + h * dxi) @ eta - R.dtau(G, xi - h * dxi) @ eta) / (2 * h)
    return Pi @ (R.dtau_inv(G, xi) @ d)


# -- the jitted checks, compiled once per group ---------------------------------------------------
@functools.lru_cache(maxsize=None)
def axioms_check(name):
    G = GROUPS[name]

    @jax.jit
    def check(a, b, c):
        g, h, k = G.exp(a), G.exp(b), G.exp(c)
        e = G.identity(a.dtype)
        return dict(
            assoc=max_err(G.compose(G.compose(g, h), k), G.compose(g, G.compose(h, k))),
            left_id=max_err(G.compose(e, g), g), right_id=max_err(G.compose(g, e), g),
            left_inv=max_err(G.compose(G.inverse(g), g), e),
            right_inv=max_err(G.compose(g, G.inverse(g)), e),
            on_group=G.distance(g),
        )
    return check


@functools.lru_cache(maxsize=None)
def round_trip_check(name):
    G = GROUPS[name]

    @jax.jit
    def check(xi, zeta):
        g = G.exp(xi)
        out = dict(log_exp=max_err(G.log(g), xi), exp_log=max_err(G.exp(G.log(g)), g))
        c = G.cay(zeta)
        out.update(cayinv_cay=max_err(G.cay_inv(c), zeta) / (1.0 + jnp.dot(zeta, zeta)),
                   cay_cayinv=max_err(G.cay(G.cay_inv(c)), c), cay_on_group=G.distance(c))
        return out
    return check


@functools.lru_cache(maxsize=None)
def retraction_check(name, rname):
    G, R = GROUPS[name], RETRACTIONS[rname]
    R.check(G)

    @jax.jit
    def check(xi, eta, pi, dxi):
        d, di = R.dtau(G, xi), R.dtau_inv(G, xi)
        eye = jnp.eye(G.dim, dtype=xi.dtype)
        t = R.tau(G, xi)
        Adinv = G.Ad(G.inverse(t))
        # the left-trivialised tangent against its definition
        lhs = jax.jvp(lambda e: G.compose(G.inverse(t), R.tau(G, xi + e * eta)),
                      (jnp.zeros(()),), (jnp.ones(()),))[1]
        out = dict(
            dtau_dtauinv=max_err(d @ di, eye), dtauinv_dtau=max_err(di @ d, eye),
            minus_xi=max_err(R.dtau_inv(G, -xi), di @ Adinv),
            dtau_minus_xi=max_err(R.dtau(G, -xi), G.Ad(t) @ d),
            tau_odd=max_err(R.tau(G, -xi), G.inverse(t)),
            dtau_def=max_err(lhs, tangent_at_identity(G, d @ eta)),
            tau_inv=max_err(R.tau_inv(G, t), xi),
            retract=max_err(R.retract(G, t, eta), G.compose(t, R.tau(G, eta))),
        )
        # ddτ* against central differences of its definition (errors ~ h² ~ 1e-10)
        dd = R.ddtau_star(G, xi, eta, pi) @ dxi
        out["ddtau_star_fd"] = jnp.abs(dd - ddtau_fd(R, G, xi, eta, pi, dxi)) / (1.0 + jnp.abs(dd))
        return out
    return check


@functools.lru_cache(maxsize=None)
def closed_forms_check(name):
    G = GROUPS[name]
    matrix = isinstance(G, AbstractMatrixLieGroup)

    @jax.jit
    def check(xi, eta, mu, a):
        g = G.exp(a)
        ginv = G.inverse(g)
        Ad, ad = G.Ad(g), G.ad(xi)
        # Ad_g ξ = d/dε g exp(εξ) g^{-1}
        lhs = jax.jvp(lambda e: G.compose(G.compose(g, G.exp(e * xi)), ginv),
                      (jnp.zeros(()),), (jnp.ones(()),))[1]
        # ad_ξ = d/dt Ad_{exp(tξ)}
        ad_ref = jax.jacfwd(lambda t: G.Ad(G.exp(t * xi)))(jnp.zeros(()))
        out = dict(
            Ad_def=max_err(lhs, tangent_at_identity(G, Ad @ xi)),
            ad_def=max_err(ad, ad_ref),
            Ad_apply=max_err(G.Ad_apply(g, xi), Ad @ xi),
            Ad_star=max_err(G.Ad_star(g, mu), Ad.T @ mu),
            ad_apply=max_err(G.ad_apply(xi, eta), ad @ eta),
            ad_star=max_err(G.ad_star(xi, mu), ad.T @ mu),
            Ad_hom=max_err(G.Ad(G.compose(g, G.exp(eta))), Ad @ G.Ad(G.exp(eta))),
            dexp_series=max_err(G.dexp(xi), dexp_series(G, xi)),
            dexp_minus=max_err(G.dexp(-xi), G.Ad(G.exp(xi)) @ G.dexp(xi)),
            exp_series=max_err(G.exp(xi), exp_series(G, xi)),
        )
        if matrix:
            X, H = G.hat(xi), G.hat(eta)
            k = X.shape[0]
            eye = jnp.eye(k, dtype=xi.dtype)
            out.update(
                vee_hat=max_err(G.vee(X), xi),
                Ad_matrix=max_err(Ad @ eta, G.vee(g @ H @ ginv)),
                ad_commutator=max_err(ad @ eta, G.vee(X @ H - H @ X)),
                inverse=max_err(ginv, jnp.linalg.inv(g)),
                # the closed forms against the generic autodiff defaults
                dexp_generic=max_err(G.dexp(xi), AbstractMatrixLieGroup.dexp(G, xi)),
                # the general matrix formulas of the Cayley map
                cay_general=max_err(G.cay(xi), jnp.linalg.solve(eye - X / 2, eye + X / 2)),
                dcay_general=max_err(G.hat(G.dcay(xi) @ eta),
                                     jnp.linalg.solve(eye + X / 2, H)
                                     @ jnp.linalg.inv(eye - X / 2)),
                dcay_inv_general=max_err(G.hat(G.dcay_inv(xi) @ eta),
                                         (eye + X / 2) @ H @ (eye - X / 2)),
                cay_inv_general=max_err(
                    G.hat(G.cay_inv(G.cay(xi))),
                    2.0 * jnp.linalg.solve((G.cay(xi) + eye).T, (G.cay(xi) - eye).T).T),
            )
        return out
    return check


#: norms of the algebra vector (or of its rotation block) at which the branches are checked
THETAS = (0.0, 1e-9, 1e-6, 1e-3, 0.5, 1.0 - 1e-12, 1.0, 1.0 + 1e-12, 1.5, 2.0 - 1e-12,
          2.0 + 1e-12, 2.5)


@functools.lru_cache(maxsize=None)
def branches_check(name):
    G = GROUPS[name]
    block = ROTATION_BLOCKS[name]

    def at(u, theta):
        """``θ`` times the direction of ``u`` (of its rotation block); ``ξ = 0`` at ``θ = 0``."""
        if block is None:
            return theta * u / jnp.linalg.norm(u)
        r = u[block]
        xi = u.at[block].set(theta * r / jnp.linalg.norm(r))
        return jnp.where(theta == 0.0, jnp.zeros_like(xi), xi)

    d2 = lambda f: jax.jacfwd(jax.jacfwd(f))  # noqa: E731

    def one(u, theta, eta, pi):
        xi = at(u, theta)
        eye = jnp.eye(G.dim, dtype=xi.dtype)
        dd = {R.name: R.ddtau_star(G, xi, eta, pi) for R in (Exp(), Cayley())}
        d_dd = {R.name: jax.jacfwd(R.ddtau_star, argnums=1)(G, xi, eta, pi)
                for R in (Exp(), Cayley())}
        # at ξ = 0, dτ_ξ η = η - ad_ξ η/2 + O(ξ²) = η + ad_η ξ/2 + O(ξ²) for both retractions,
        # so (ddτ)*(η, Π) = ad*_η Π / 2 there
        at0 = jnp.where(theta == 0.0, 1.0, 0.0)
        d_dexp, Di = jax.jacfwd(G.dexp)(xi), G.dexp_inv(xi)
        return dict(
            dd_exp_at_0=at0 * max_err(dd["exp"], 0.5 * G.ad_star(eta, pi)),
            dd_cay_at_0=at0 * max_err(dd["cayley"], 0.5 * G.ad_star(eta, pi)),
            dcay=max_err(G.dcay_inv(xi) @ G.dcay(xi), eye),
            d2cay=jnp.where(finite(d2(G.cay)(xi)), 0.0, jnp.inf),
            exp=max_err(G.exp(xi), exp_series(G, xi)),
            d2exp=max_err(d2(G.exp)(xi), d2(lambda x: exp_series(G, x))(xi)),
            dexp=max_err(G.dexp(xi), dexp_series(G, xi)),
            d_dexp=max_err(d_dexp, jax.jacfwd(lambda x: dexp_series(G, x))(xi)),
            dexp_inv=max_err(Di @ G.dexp(xi), eye),
            # ∂(D^{-1}) = -D^{-1} (∂D) D^{-1}
            d_dexp_inv=max_err(jax.jacfwd(G.dexp_inv)(xi),
                               -jnp.einsum("ij,jkl,km->iml", Di, d_dexp, Di)),
            log=jnp.where(theta < 3.0, max_err(G.log(G.exp(xi)), xi), 0.0),
            dd_finite=jnp.where(finite((dd, d_dd)), 0.0, jnp.inf),
            d2log=jnp.where(finite(d2(G.log)(G.exp(xi))), 0.0, jnp.inf),
        )

    thetas = jnp.asarray(THETAS)
    return jax.jit(lambda u, eta, pi: jax.vmap(one, in_axes=(None, 0, None, None))(
        u, thetas, eta, pi))


# -- tests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(GROUPS))
def test_group_axioms(name):
    G = GROUPS[name]
    check = axioms_check(name)

    @SETTINGS
    @given(vectors(G.dim, 2.0, 3))
    def run(abc):
        assert_small(check(*map(jnp.asarray, abc)), 1e-12, name)
    run()


@pytest.mark.parametrize("name", list(GROUPS))
def test_exp_log_and_cay_round_trips(name):
    G = GROUPS[name]
    check = round_trip_check(name)

    # components below 1.5: rotation angles below 1.5 √3 < π, where log is the inverse of exp
    @SETTINGS
    @given(vectors(G.dim, 1.5), vectors(G.dim, 3.0))
    def run(xi, zeta):
        assert_small(check(jnp.asarray(xi[0]), jnp.asarray(zeta[0])), 1e-12, name)
    run()


@pytest.mark.parametrize("rname", list(RETRACTIONS))
@pytest.mark.parametrize("name", list(GROUPS))
def test_retraction_identities_and_ddtau_star(name, rname):
    """``dτ dτ^{-1} = I``, ``dτ^{-1}_{-ξ} = dτ^{-1}_ξ Ad^{-1}_{τ(ξ)}``, ``τ(-ξ) = τ(ξ)^{-1}``,
    ``dτ`` against the ``jax.jvp`` definition, ``ddτ*`` against central differences."""
    G = GROUPS[name]
    check = retraction_check(name, rname)

    @SETTINGS
    @given(vectors(G.dim, 1.5, 4))
    def run(v):
        xi, eta, pi, dxi = map(jnp.asarray, v)
        assert_small(check(xi, eta, pi, dxi), 1e-9, f"{name}, {rname}")
    run()


@pytest.mark.parametrize("name", list(GROUPS))
def test_closed_forms_against_definitions(name):
    G = GROUPS[name]
    check = closed_forms_check(name)

    @SETTINGS
    @given(vectors(G.dim, 1.5, 4))
    def run(v):
        assert_small(check(*map(jnp.asarray, v)), 1e-11, name)
    run()


# the products evaluate their factors' code on slices (block structure: see
# test_products_are_block_diagonal_and_keep_rn_free); compiling these second derivatives
# again for them would double the cost of this test
@pytest.mark.parametrize("name", [k for k, G in GROUPS.items()
                                  if not isinstance(G, ProductGroup)])
def test_taylor_branches_and_derivatives_at_zero(name):
    """Values, first and second derivatives of ``exp``, ``dexp``, ``dexp_inv`` at
    ``|ω| = 0, 1e-9, 1e-6, 1e-3`` and on both sides of the switches ``|ω| = 1`` (and ``2``,
    SE(3)) against the power series; second derivatives of ``cay`` and ``log``, ``ddτ*`` of
    both retractions and its derivative (``jax.vjp`` inside ``jax.jacfwd``) finite there, and
    ``ddτ*`` at ``ξ = 0`` exactly equal to ``ad*_η Π / 2``."""
    G = GROUPS[name]
    check = branches_check(name)

    @settings(SETTINGS, max_examples=8)
    @given(vectors(G.dim, 1.0, 3))
    def run(v):
        u, eta, pi = map(jnp.asarray, v)
        block = ROTATION_BLOCKS[name]
        r = u if block is None else u[block]
        if float(jnp.linalg.norm(r)) < 1e-3:
            return
        errs = check(u, eta, pi)
        assert_small({k: jnp.max(e) for k, e in errs.items()}, 1e-10, name)
    run()


# the scalar coefficients, against their series to 30 terms (exact rationals), with the first and
# second derivatives, on both sides of the switch
def _bernoulli(n):
    B = [Fraction(1)]
    for k in range(1, n + 1):
        B.append(-sum(math.comb(k + 1, j) * B[j] for j in range(k)) / Fraction(k + 1))
    return B


_BN = _bernoulli(64)
COEFFICIENTS = {
    "sinc": [Fraction((-1) ** k, math.factorial(2 * k + 1)) for k in range(30)],
    "cos2": [Fraction((-1) ** k, math.factorial(2 * k + 2)) for k in range(30)],
    "sin3": [Fraction((-1) ** k, math.factorial(2 * k + 3)) for k in range(30)],
    "dexpinv_coeff": [abs(_BN[2 * k + 2]) / math.factorial(2 * k + 2) for k in range(30)],
    "halfcot": [Fraction(1)] + [-abs(_BN[2 * k + 2]) / math.factorial(2 * k + 2)
                                for k in range(29)],
    "_q2": [Fraction((-1) ** k, math.factorial(2 * k + 4)) for k in range(30)],
    "_q3": [Fraction((-1) ** k * (k + 1), math.factorial(2 * k + 5)) for k in range(30)],
}


@pytest.mark.parametrize("fname", list(COEFFICIENTS))
def test_coefficient_branches(fname):
    from vijax.lie import _se3, _so3
    f = getattr(_so3, fname, None) or getattr(_se3, fname)
    c = COEFFICIENTS[fname]

    def series(s, d):
        return sum(float(c[k] * math.perm(k, d)) * s ** (k - d) for k in range(d, len(c)))

    fs = jax.jit(jax.vmap(lambda s: jnp.stack([f(s), jax.grad(f)(s), jax.grad(jax.grad(f))(s)])))
    s = np.array([0.0, 1e-18, 1e-12, 1e-6, 1e-3, 0.25, 1 - 1e-12, 1.0, 1 + 1e-12, 1.2, 2.0,
                  4 - 1e-12, 4.0, 4 + 1e-12, 6.0])
    got = np.asarray(fs(jnp.asarray(s)))
    for d, tol in enumerate((1e-14, 1e-12, 1e-10)):
        ref = np.array([series(x, d) for x in s])
        np.testing.assert_allclose(got[:, d], ref, rtol=tol, atol=0, err_msg=f"{fname}^({d})")


@pytest.mark.parametrize("name", list(GROUPS))
def test_project_and_distance(name):
    G = GROUPS[name]
    @jax.jit
    def check(a, noise):
        g = G.exp(a)
        leaves, tree = jax.tree_util.tree_flatten(g)
        noisy, start = [], 0
        for x in leaves:
            noisy.append(x + noise[start:start + x.size].reshape(x.shape))
            start += x.size
        gn = jax.tree_util.tree_unflatten(tree, noisy)
        return dict(projected=G.distance(G.project(gn)), fixed=max_err(G.project(g), g),
                    on_group=G.distance(g), near=max_err(G.project(gn), g),
                    noisy=G.distance(gn))

    size = sum(x.size for x in jax.tree_util.tree_leaves(G.identity()))

    @SETTINGS
    @given(vectors(G.dim, 2.0), hnp.arrays(np.float64, (size,),
                                           elements=st.floats(-1e-3, 1e-3, width=64)))
    def run(a, noise):
        errs = {k: float(v) for k, v in check(jnp.asarray(a[0]), jnp.asarray(noise)).items()}
        assert errs["projected"] < 1e-12 and errs["fixed"] < 1e-12 and errs["on_group"] < 1e-12
        assert errs["near"] < 1e-2  # the projection moves a perturbed element back near it
        noisy_matrix = name in MATRIX and float(np.max(np.abs(noise))) > 1e-8
        if noisy_matrix:
            assert errs["noisy"] > 0
    run()


def test_distance_of_matrices_off_the_group():
    assert float(SO3().distance(1.1 * jnp.eye(3))) > 0.1
    reflection = jnp.diag(jnp.array([1.0, 1.0, -1.0]))
    assert float(SO3().distance(reflection)) > 1.0  # orthogonal, det -1
    assert float(SO3().distance(SO3().project(reflection))) < 1e-14
    shear = jnp.array([[1.0, 0.3], [0.0, 1.0]])
    assert float(SO2().distance(shear)) > 0.1
    g = SE2().exp(jnp.array([0.1, 0.2, 0.3])).at[2, 0].set(0.1)
    assert float(SE2().distance(g)) > 0.09
    np.testing.assert_allclose(SE2().project(g)[2], [0.0, 0.0, 1.0])
    h = SE3().exp(jnp.linspace(0.1, 0.6, 6)).at[:3, :3].multiply(1.01)
    assert float(SE3().distance(h)) > 0.01
    assert float(SE3().distance(SE3().project(h))) < 1e-14


def test_cayley_needs_every_factor_to_be_a_cayley_group():
    G = ProductGroup(SO3(), Aff1())
    with pytest.raises(TypeError, match=r"vijax\.lie\.Exp\(\)") as info:
        Cayley().check(G)
    assert "Aff1" in str(info.value) and "factor 1" in str(info.value)
    with pytest.raises(TypeError, match=r"vijax\.lie\.Exp\(\)"):
        Cayley().check(Aff1())
    xi = jnp.linspace(0.1, 0.5, 5)
    for method, arg in (("cay", xi), ("cay_inv", G.exp(xi)), ("dcay", xi), ("dcay_inv", xi)):
        with pytest.raises(TypeError, match="factor 1, Aff1"):
            getattr(G, method)(arg)
    # nested products are Cayley groups when all their factors are
    Cayley().check(ProductGroup(ProductGroup(SO3(), Rn(2)), SE2()))
    with pytest.raises(TypeError, match="factor 0"):
        Cayley().check(ProductGroup(ProductGroup(Aff1(), Rn(1)), SE2()))
    # the exponential works on it, with the generic autodiff tangents of the factor
    Exp().check(G)
    np.testing.assert_allclose(G.log(G.exp(xi)), xi, atol=1e-14)
    d = Exp().dtau(G, xi)
    np.testing.assert_allclose(d @ Exp().dtau_inv(G, xi), np.eye(5), atol=1e-13)
    np.testing.assert_allclose(d, dexp_series(G, xi), atol=1e-13)


def test_products_are_block_diagonal_and_keep_rn_free():
    G = ProductGroup(SO3(), Rn(2))
    assert G.dim == 5 and G.dims == (3, 2) and not G.commutative and not G.vector_space
    assert ProductGroup(Rn(1), Rn(2)).vector_space
    assert ProductGroup(SO2(), Rn(2)).commutative and not ProductGroup(SO2(), Rn(2)).vector_space
    xi = jnp.array([0.1, 0.2, 0.3, 0.4, 0.5])
    g = G.exp(xi)
    assert isinstance(g, tuple) and g[0].shape == (3, 3) and g[1].shape == (2,)
    np.testing.assert_allclose(G.dexp(xi), jsl.block_diag(SO3().dexp(xi[:3]), np.eye(2)))
    np.testing.assert_allclose(G.dcay_inv(xi), jsl.block_diag(SO3().dcay_inv(xi[:3]),
                                                              np.eye(2)))
    np.testing.assert_allclose(G.Ad(g), jsl.block_diag(g[0], np.eye(2)))
    np.testing.assert_allclose(G.ad_star(xi, xi)[3:], 0.0)
    # the second-order terms are block diagonal too: ddτ* of the product is the concatenation
    # of the factors' (at ξ = 0, where it is finite, and at a generic point)
    eta, pi = jnp.linspace(-0.3, 0.7, 5), jnp.linspace(0.2, -0.9, 5)
    for R in (Exp(), Cayley()):
        for x in (jnp.zeros(5), xi):
            dd = R.ddtau_star(G, x, eta, pi)
            assert bool(finite(dd))
            ref = jnp.concatenate([R.ddtau_star(f, a, b, c) for f, a, b, c in
                                   zip(G.factors, G.split(x), G.split(eta), G.split(pi))])
            np.testing.assert_allclose(dd, ref, atol=1e-15)
    G.check_shape(g)
    with pytest.raises(ValueError):
        G.check_shape((jnp.eye(3), jnp.zeros(3)))
    with pytest.raises(TypeError):
        ProductGroup(SO3(), "R2")
    # a product is a pytree with no leaves: it passes through jit as an argument
    assert jax.tree_util.tree_leaves(G) == []
    np.testing.assert_allclose(eqx.filter_jit(lambda G, x: G.log(G.exp(x)))(G, xi), xi)


@SETTINGS
@given(hnp.arrays(np.float64, (4,), elements=st.floats(-1.0, 1.0, width=64)))
def test_quaternions(q):
    q = jnp.asarray(q)
    if float(jnp.linalg.norm(q)) < 0.1:
        return
    errs = _quaternion_check(q)
    assert_small(errs, 1e-13, "quaternions")


@jax.jit
def _quaternion_check(q):
    G = SO3()
    qn = q / jnp.linalg.norm(q)
    R = G.from_quaternion(q)
    back = G.as_quaternion(R)
    # ξ = θ n with q = (cos(θ/2), sin(θ/2) n)
    w, v = qn[0], qn[1:]
    n2 = jnp.dot(v, v)
    nv = jnp.sqrt(jnp.where(n2 > 0, n2, 1.0))
    xi = jnp.where(n2 > 0, 2.0 * jnp.arctan2(nv, w) / nv, 2.0) * v
    return dict(on_group=G.distance(R),
                round_trip=jnp.minimum(max_err(back, qn), max_err(back, -qn)),
                w_nonnegative=jnp.maximum(-back[0], 0.0),
                axis_angle=max_err(R, G.exp(xi)),
                from_axis_angle=jnp.where(
                    n2 > 1e-6, max_err(G.from_axis_angle(v, 2.0 * jnp.arctan2(nv, w)), R), 0.0),
                log=max_err(G.exp(G.log(R)), R))


def test_log_near_pi():
    """``log`` is accurate up to ``θ = π`` (through the quaternion), and at ``π`` returns one
    of the two logarithms."""
    G = SO3()
    n = jnp.array([1.0, 2.0, -0.5]) / jnp.linalg.norm(jnp.array([1.0, 2.0, -0.5]))
    for theta in (np.pi - 1e-3, np.pi - 1e-8):
        np.testing.assert_allclose(G.log(G.exp(theta * n)), theta * n, atol=1e-12)
    w = G.log(G.exp(np.pi * n))
    assert float(jnp.minimum(jnp.max(jnp.abs(w - np.pi * n)), jnp.max(jnp.abs(w + np.pi * n)))) \
        < 1e-12
    np.testing.assert_allclose(SE2().log(SE2().exp(jnp.array([0.3, -0.2, np.pi - 1e-3]))),
                               [0.3, -0.2, np.pi - 1e-3], atol=1e-12)


def test_rn_reduces_to_the_vector_space():
    """``R^n``: retractions are the identity, ``g τ(ξ) = g + ξ``, ``Ad = I``, ``ad = 0``."""
    G = Rn(3)
    rng = np.random.default_rng(0)
    g, h, eta = (jnp.asarray(rng.normal(size=3)) for _ in range(3))
    for R in (Exp(), Cayley()):
        R.check(G)
        np.testing.assert_allclose(R.tau(G, h), h)
        np.testing.assert_allclose(R.tau(G, -h), G.inverse(R.tau(G, h)))
        np.testing.assert_allclose(R.retract(G, g, h), g + h)
        np.testing.assert_allclose(R.dtau(G, h), np.eye(3))
        np.testing.assert_allclose(jax.jvp(lambda x: R.tau(G, x), (h,), (eta,))[1],
                                   R.dtau(G, h) @ eta)
        assert float(jnp.max(jnp.abs(R.ddtau_star(G, h, eta, g)))) == 0.0
    assert float(jnp.max(jnp.abs(G.ad(h)))) == 0.0
    np.testing.assert_allclose(G.Ad(g), np.eye(3))
    assert float(jnp.max(jnp.abs(G.ad_star(h, eta)))) == 0.0
    assert G.commutative and G.vector_space
    assert SO2().commutative and not SO2().vector_space and not SO3().commutative
    # the retraction's tangent is the identity exactly where the traits say
    assert Exp().flat(SO2()) and not Cayley().flat(SO2()) and Cayley().flat(G)
    np.testing.assert_allclose(Exp().dtau(SO2(), jnp.array([0.7])), [[1.0]], atol=1e-15)
    assert abs(float(Cayley().dtau(SO2(), jnp.array([0.7]))[0, 0]) - 1 / (1 + 0.49 / 4)) < 1e-15
    assert not Exp().flat(SO3()) and not Exp().flat(SE2())


def test_public_names():
    for name in ("SO2", "SO3", "SE2", "SE3", "ProductGroup", "Rn", "Exp", "Cayley"):
        assert name in vj.lie.__all__ and hasattr(vj.lie, name)


def test_stacked_coefficients_equal_the_separate_functions_with_derivatives():
    """``SeriesStack`` (several coefficient functions of ``θ²`` as one fused array) gives the
    values and first and second derivatives of its functions evaluated one by one, on both
    sides of the Taylor switch and at 0."""
    from vijax.lie._so3 import SeriesStack, cos2, halfcot, sin3, sinc

    stack = SeriesStack(sinc, cos2, sin3, halfcot)
    s = jnp.asarray([0.0, 1e-9, 0.3, 0.999999, 1.0, 1.000001, 2.5, 9.0])
    for d in (lambda f: f, jax.jacfwd, lambda f: jax.jacfwd(jax.jacfwd(f))):
        ours = jax.vmap(d(stack))(s)                                   # (points, functions)
        ref = jnp.stack([jax.vmap(d(f))(s) for f in stack.functions], axis=1)
        assert np.all(np.isfinite(np.asarray(ours)))
        np.testing.assert_allclose(ours, ref, rtol=1e-14, atol=1e-15)
