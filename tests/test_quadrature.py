"""Tests for vijax.quadrature: quadrature rules on [0, 1], Lagrange interpolation and
integration matrices, polynomial bases."""

import warnings
from decimal import Decimal, localcontext
from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vijax import quadrature as Q
from vijax import tableaus as T

S_RANGE = range(1, 9)


def sqrt(n: int) -> Decimal:
    """√n to 60 significant digits; only use it inside `localcontext(prec=60)`."""
    return Decimal(n).sqrt()


def F(*xs):
    """Correctly rounded floats of exact fractions given as strings."""
    return [float(Fraction(x)) for x in xs]


# ----------------------------------------------------------------------------------------------
# Quadrature rules on [0, 1]
# ----------------------------------------------------------------------------------------------


def _monomial_errors(rule, degrees):
    x, w = rule
    return [abs(w @ x**k - 1.0 / (k + 1)) for k in degrees]


@pytest.mark.parametrize("n", S_RANGE)
def test_gauss_quadrature_exactness(n):
    rule = Q.gauss_quadrature(n)
    assert max(_monomial_errors(rule, range(2 * n))) <= 1e-14
    assert _monomial_errors(rule, [2 * n])[0] > 1e-10


@pytest.mark.parametrize("n", range(2, 9))
def test_lobatto_quadrature_exactness_and_weight_formula(n):
    x, w = rule = Q.lobatto_quadrature(n)
    assert max(_monomial_errors(rule, range(2 * n - 2))) <= 1e-14
    assert _monomial_errors(rule, [2 * n - 2])[0] > 1e-10
    assert x[0] == 0.0 and x[-1] == 1.0
    assert np.array_equal(w, w[::-1])  # symmetric, bit for bit (rounded once from exact values)
    # Closed form: weights on [−1, 1] are 2 / (n (n−1) P_{n−1}(x_i)^2); halve on [0, 1].
    p = np.polynomial.legendre.Legendre.basis(n - 1)(2 * x - 1)
    np.testing.assert_allclose(w, 1.0 / (n * (n - 1) * p**2), rtol=1e-14)


def test_quadrature_closed_forms():
    with localcontext(prec=60):
        r5, r21 = sqrt(5), sqrt(21)
        lob4 = [0.0, float((5 - r5) / 10), float((5 + r5) / 10), 1.0]
        lob5 = [0.0, float((7 - r21) / 14), 0.5, float((7 + r21) / 14), 1.0]
    expected = {
        2: ([0.0, 1.0], F("1/2", "1/2")),
        3: ([0.0, 0.5, 1.0], F("1/6", "2/3", "1/6")),
        4: (lob4, F("1/12", "5/12", "5/12", "1/12")),
        5: (lob5, F("1/20", "49/180", "16/45", "49/180", "1/20")),
    }
    for n, (nodes, weights) in expected.items():
        x, w = Q.lobatto_quadrature(n)
        assert x.tolist() == nodes and w.tolist() == weights
    x, w = Q.gauss_quadrature(1)
    assert x.tolist() == [0.5] and w.tolist() == [1.0]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 8),
    data=st.data(),
)
def test_gauss_quadrature_integrates_polynomials(n, data):
    coeffs = np.array(
        data.draw(st.lists(st.floats(-10, 10), min_size=1, max_size=2 * n)), dtype=np.float64
    )
    x, w = Q.gauss_quadrature(n)
    exact_integral = np.sum(coeffs / np.arange(1, coeffs.size + 1))
    approx = w @ np.polynomial.polynomial.polyval(x, coeffs)
    assert abs(approx - exact_integral) <= 1e-13 * (1.0 + np.sum(np.abs(coeffs)))


# ----------------------------------------------------------------------------------------------
# Interpolation
# ----------------------------------------------------------------------------------------------


def test_lagrange_extrapolation_matrix():
    c = T.gauss(4).c
    # On its own nodes the matrix is the identity.
    np.testing.assert_array_equal(Q.lagrange_extrapolation_matrix(c, c), np.eye(4))
    # It reproduces polynomials of degree < number of nodes, also when extrapolating.
    x_to = np.array([1.0, 1.3, 2.0, -0.5])
    poly = [0.3, -1.0, 2.0, 0.7]
    E = Q.lagrange_extrapolation_matrix(c, x_to)
    assert E.shape == (4, 4)
    np.testing.assert_allclose(E @ np.polynomial.polynomial.polyval(c, poly),
                               np.polynomial.polynomial.polyval(x_to, poly), rtol=1e-12)
    np.testing.assert_allclose(E.sum(axis=1), 1.0, rtol=1e-13)
    with pytest.raises(ValueError, match="distinct"):
        Q.lagrange_extrapolation_matrix([0.0, 0.5, 0.5], [0.2])


def test_lagrange_basis_matches_the_static_matrix_and_differentiates():
    nodes = Q.lobatto_quadrature(5)[0]
    x = np.array([0.0, 0.13, 0.5, 0.91, 1.0, 1.4])
    np.testing.assert_allclose(np.asarray(Q.lagrange_basis(nodes, jnp.asarray(x))),
                               Q.lagrange_extrapolation_matrix(nodes, x), rtol=0, atol=1e-14)
    # the derivative matrix differentiates polynomials of degree < 5 exactly
    poly = [0.3, -1.0, 2.0, 0.7, -0.4]
    D = Q.lagrange_derivative_matrix(nodes, x)
    np.testing.assert_allclose(D @ np.polynomial.polynomial.polyval(nodes, poly),
                               np.polynomial.polynomial.polyval(x, np.polynomial.polynomial.polyder(poly)),
                               rtol=1e-12)


@pytest.mark.parametrize("s", [1, 2, 3, 5])
def test_integration_matrix_rebuilds_the_collocation_tableaus(s):
    """∫_0^{c_i} l_j is Gauss's A and ∫_0^1 l_j its b; the same for Lobatto IIIA."""
    for t in (T.gauss(s),) + ((T.lobatto_iiia(s),) if s >= 2 else ()):
        np.testing.assert_allclose(Q.integration_matrix(t.c, t.c), t.a, rtol=0, atol=1e-14)
        np.testing.assert_allclose(Q.integration_matrix(t.c, [1.0])[0], t.b, rtol=0, atol=1e-14)


@pytest.mark.parametrize("kind", Q.BASES)
def test_polynomial_bases_span_the_same_space(kind):
    basis = Q.gauss_basis(kind, 4)
    lag = Q.gauss_basis("lagrange", 4)
    tau = np.linspace(0.0, 1.0, 7)
    # change of basis: phi(tau) = L(tau) T, and T^{-1} maps back
    np.testing.assert_allclose(basis.values(tau) @ basis.Tinv, lag.values(tau), atol=1e-13)
    np.testing.assert_allclose(np.asarray(basis.values_jnp(jnp.asarray(tau))), basis.values(tau),
                               atol=1e-14)
    with pytest.raises(ValueError, match="unknown basis"):
        Q.PolynomialBasis("chebyshev", lag.nodes)


def test_moved_helpers_still_importable_from_tableaus_with_a_deprecation_warning():
    for name in ("gauss_quadrature", "lobatto_quadrature", "lagrange_extrapolation_matrix",
                 "lagrange_derivative_matrix"):
        with pytest.warns(DeprecationWarning, match=f"vijax.quadrature.{name}"):
            assert getattr(T, name) is getattr(Q, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            T.no_such_name  # noqa: B018


@pytest.mark.parametrize("make,arg,minimum", [(Q.gauss_quadrature, 0, "at least 1 stage"),
                                               (Q.lobatto_quadrature, 1, "at least 2 stages")])
def test_too_few_nodes(make, arg, minimum):
    with pytest.raises(ValueError, match=minimum):
        make(arg)
