"""Tests for vijax.tableaus: Butcher tableaus and order conditions.

References: Martín de Diego & Sato Martín de Almagro (2022), App. A (collocation tableaus,
simplifying assumptions (43)–(45), CĈ and DD̂) and §4.3 (hypotheses H1–H3, H1′–H2′); Gauss and
Gauss–Lobatto quadrature on [0, 1].
"""

from decimal import Decimal, localcontext
from fractions import Fraction
from math import factorial

import jax
import numpy as np
import pytest

from vijax import tableaus as T

S_RANGE = range(1, 9)


def exact(x) -> float:
    """The correctly rounded float64 of an exact value (Fraction / Decimal)."""
    return float(x)


def sqrt(n: int) -> Decimal:
    """√n to 60 significant digits; only use it inside `localcontext(prec=60)`."""
    return Decimal(n).sqrt()


# ----------------------------------------------------------------------------------------------
# Simplifying assumptions B(p), C(q), D(r): hold at theory, fail one order above
# ----------------------------------------------------------------------------------------------

# family -> (constructor, minimum s, (p, q, r) as functions of s)
FAMILIES = {
    "gauss": (T.gauss, 1, lambda s: (2 * s, s, s)),
    "lobatto_iiia": (T.lobatto_iiia, 2, lambda s: (2 * s - 2, s, s - 2)),
    "lobatto_iiib": (T.lobatto_iiib, 2, lambda s: (2 * s - 2, s - 2, s)),
    "lobatto_iiic": (T.lobatto_iiic, 2, lambda s: (2 * s - 2, s - 1, s - 1)),
    "radau_iia": (T.radau_iia, 1, lambda s: (2 * s - 1, s, s - 1)),
}
FAMILY_CASES = [
    (name, s) for name, (_, smin, _) in FAMILIES.items() for s in S_RANGE if s >= smin
]


@pytest.mark.parametrize("family,s", FAMILY_CASES)
def test_simplifying_assumptions_hold_at_theoretical_orders(family, s):
    make, _, orders = FAMILIES[family]
    t = make(s)
    p, q, r = orders(s)
    assert t.stages == s
    assert T.residual_B(t, p) <= 1e-13
    assert T.residual_C(t, q) <= 1e-13
    assert T.residual_D(t, r) <= 1e-13
    assert T.satisfies_B(t, p) and T.satisfies_C(t, q) and T.satisfies_D(t, r)


@pytest.mark.parametrize("family,s", FAMILY_CASES)
def test_simplifying_assumptions_fail_one_order_above(family, s):
    make, _, orders = FAMILIES[family]
    t = make(s)
    p, q, r = orders(s)
    # The smallest genuine residual (Gauss(8), B(17)) is 3.6e-10; round-off is ~1e-16.
    assert T.residual_B(t, p + 1) > 1e-10
    assert T.residual_C(t, q + 1) > 1e-10
    assert T.residual_D(t, r + 1) > 1e-10
    assert not T.satisfies_B(t, p + 1)
    assert T.simplifying_orders(t) == (p, q, r)


@pytest.mark.parametrize("s", S_RANGE)
def test_gauss_B_residual_one_order_above_is_the_quadrature_error(s):
    # Error of the s-point Gauss rule on x^(2s) over [0, 1]: (s!)^4 / ((2s+1) ((2s)!)^2).
    expected = factorial(s) ** 4 / ((2 * s + 1) * factorial(2 * s) ** 2)
    t = T.gauss(s)
    err = 1.0 / (2 * s + 1) - t.b @ t.c ** (2 * s)
    assert err == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("family,s", FAMILY_CASES)
def test_metadata_and_consistency(family, s):
    make, _, orders = FAMILIES[family]
    t = make(s)
    p, q, _ = orders(s)
    assert (t.order, t.stage_order) == (p, q)  # classical order = B order for these families
    assert t.a.shape == (s, s) and t.b.shape == (s,) and t.c.shape == (s,)
    assert t.a.dtype == np.float64
    assert np.all(np.diff(t.c) > 0) and t.c[0] >= 0.0 and t.c[-1] <= 1.0
    assert make(s) is t  # cached
    assert repr(t).startswith("ButcherTableau(") and f"order={t.order}" in repr(t)
    hash(t)  # static, hashable: usable as a compile-time constant
    assert jax.tree_util.tree_leaves(t) == []  # no traced leaves
    assert t == make(s)


def test_extended_precision_gauss_8():
    t = T.gauss(8)
    assert T.residual_B(t, 16) <= 1e-14
    assert T.residual_C(t, 8) <= 1e-14
    assert T.residual_D(t, 8) <= 1e-14


def test_large_stage_counts_are_supported():
    for s in (10, 12):
        t = T.gauss(s)
        assert T.residual_B(t, 2 * s) <= 1e-14
        assert T.residual_C(t, s) <= 1e-14 and T.residual_C(t, s + 1) > 1e-10
        assert T.residual_D(t, s) <= 1e-14 and T.residual_D(t, s + 1) > 1e-10
    # For large s the quadrature error above order 2s is itself below a fixed tolerance
    # (Gauss(12): B(25) misses by 5e-16), so numerical order detection overestimates p.
    assert T.simplifying_orders(T.gauss(12), tol=1e-13)[0] > 24


# ----------------------------------------------------------------------------------------------
# Exact spot values (closed forms). Extended precision + one rounding means the
# stored floats equal the correctly rounded exact values bit for bit.
# ----------------------------------------------------------------------------------------------


def F(*xs):
    return [exact(Fraction(x)) for x in xs]


def test_lobatto_s2_exact():
    t, th = T.lobatto_iiia(2), T.lobatto_iiib(2)
    assert t.c.tolist() == [0.0, 1.0] and t.b.tolist() == [0.5, 0.5]
    assert t.a.tolist() == [[0.0, 0.0], [0.5, 0.5]]
    assert th.a.tolist() == [[0.5, 0.0], [0.5, 0.0]]
    assert th.c.tolist() == [0.0, 1.0] and th.b.tolist() == [0.5, 0.5]


def test_lobatto_s3_exact():
    t, th = T.lobatto_iiia(3), T.lobatto_iiib(3)
    assert t.c.tolist() == F(0, "1/2", 1)
    assert t.b.tolist() == F("1/6", "2/3", "1/6")
    assert t.a.tolist() == [F(0, 0, 0), F("5/24", "1/3", "-1/24"), F("1/6", "2/3", "1/6")]
    assert th.a.tolist() == [F("1/6", "-1/6", 0), F("1/6", "1/3", 0), F("1/6", "5/6", 0)]


def test_lobatto_s4_exact():
    with localcontext(prec=60):
        r = sqrt(5)
        c = [0, (5 - r) / 10, (5 + r) / 10, 1]
        a = [
            [0, 0, 0, 0],
            [(11 + r) / 120, (25 - r) / 120, (25 - 13 * r) / 120, (-1 + r) / 120],
            [(11 - r) / 120, (25 + 13 * r) / 120, (25 + r) / 120, (-1 - r) / 120],
            [Decimal(1) / 12, Decimal(5) / 12, Decimal(5) / 12, Decimal(1) / 12],
        ]
        a_hat = [
            [Decimal(1) / 12, (-1 - r) / 24, (-1 + r) / 24, 0],
            [Decimal(1) / 12, (25 + r) / 120, (25 - 13 * r) / 120, 0],
            [Decimal(1) / 12, (25 + 13 * r) / 120, (25 - r) / 120, 0],
            [Decimal(1) / 12, (11 - r) / 24, (11 + r) / 24, 0],
        ]
    t, th = T.lobatto_iiia(4), T.lobatto_iiib(4)
    to_float = np.vectorize(float)
    assert t.c.tolist() == to_float(c).tolist()
    assert t.b.tolist() == F("1/12", "5/12", "5/12", "1/12")
    assert t.a.tolist() == to_float(a).tolist()
    assert th.a.tolist() == to_float(a_hat).tolist()


def test_lobatto_s5_values():
    t, th = T.lobatto_iiia(5), T.lobatto_iiib(5)
    with localcontext(prec=60):
        r = sqrt(21)
        c = [0.0, float((7 - r) / 14), 0.5, float((7 + r) / 14), 1.0]
    assert t.c.tolist() == c
    assert t.b.tolist() == F("1/20", "49/180", "16/45", "49/180", "1/20")
    assert abs(t.a[1, 0] - 0.0677284321861569) <= 1e-15
    # A hand-transcribed reference value â12 = −0.0965214641246216 disagrees with the formula
    # â12 = b2 (1 − a21 / b1), which with a21 and b above gives −0.0965214641246320 (also the
    # 60-digit value): the digits "…6216" were a transcription slip (difference 1.04e-14).
    assert abs(th.a[0, 1] - (-0.0965214641246320)) <= 1e-15
    assert abs(th.a[0, 1] - t.b[1] * (1 - t.a[1, 0] / t.b[0])) <= 1e-16


def test_lobatto_iiic_exact():
    assert T.lobatto_iiic(2).a.tolist() == [[0.5, -0.5], [0.5, 0.5]]
    assert T.lobatto_iiic(3).a.tolist() == [
        F("1/6", "-1/3", "1/6"),
        F("1/6", "5/12", "-1/12"),
        F("1/6", "2/3", "1/6"),
    ]


def test_gauss_and_radau_exact():
    with localcontext(prec=60):
        r3, r6, r15 = sqrt(3), sqrt(6), sqrt(15)
        gauss2_c = [float(Decimal(1) / 2 - r3 / 6), float(Decimal(1) / 2 + r3 / 6)]
        gauss3_c = [float(Decimal(1) / 2 - r15 / 10), 0.5, float(Decimal(1) / 2 + r15 / 10)]
        radau3_c = [float((4 - r6) / 10), float((4 + r6) / 10), 1.0]
    assert T.gauss(1).a.tolist() == [[0.5]] and T.gauss(1).b.tolist() == [1.0]
    assert T.gauss(2).c.tolist() == gauss2_c and T.gauss(2).b.tolist() == [0.5, 0.5]
    assert T.gauss(3).c.tolist() == gauss3_c
    assert T.gauss(3).b.tolist() == F("5/18", "8/18", "5/18")
    # Radau IIA(1) is backward Euler; Radau IIA(2) is the classical 3rd-order method.
    assert T.radau_iia(1).a.tolist() == [[1.0]] and T.radau_iia(1).c.tolist() == [1.0]
    assert T.radau_iia(2).a.tolist() == [F("5/12", "-1/12"), F("3/4", "1/4")]
    assert T.radau_iia(2).c.tolist() == F("1/3", 1)
    assert T.radau_iia(3).c.tolist() == radau3_c


# ----------------------------------------------------------------------------------------------
# Symplectic conjugates and the Lobatto IIIA–IIIB pair (Martín de Diego & Sato Martín de
# Almagro (2022), App. A.3.1 and §4.3)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("s", range(2, 9))
def test_lobatto_iiia_iiib_is_symplectic(s):
    pair = T.lobatto_iiia_iiib(s)
    assert pair.order == 2 * s - 2
    assert pair.symplectic_defect() <= 1e-14
    assert pair.is_symplectic_conjugate()
    # Lobatto IIIA alone (paired with itself) is not symplectic.
    iiia = T.lobatto_iiia(s)
    assert T.PartitionedTableau(iiia, iiia, "IIIA–IIIA", 2 * s - 2).symplectic_defect() > 1e-3


@pytest.mark.parametrize("s", S_RANGE)
def test_gauss_is_self_conjugate(s):
    t = T.gauss(s)
    pair = T.symplectic_pair(t)
    assert pair.symplectic_defect() <= 1e-14
    conj = pair.p
    assert np.max(np.abs(conj.a - t.a)) <= 1e-14
    assert np.array_equal(conj.b, t.b) and np.array_equal(conj.c, t.c)
    assert conj.order == t.order and conj.stage_order == s
    assert conj.name == f"Gauss({s})*"


@pytest.mark.parametrize("s", range(2, 9))
def test_generic_conjugate_matches_lobatto_iiib(s):
    conj = T.symplectic_conjugate(T.lobatto_iiia(s))
    iiib = T.lobatto_iiib(s)
    assert np.max(np.abs(conj.a - iiib.a)) <= 1e-15
    assert conj.stage_order == s - 2 and conj.order == 2 * s - 2


def _cc_hat(a, a_hat, c, Q):
    """Residual of CĈ(Q): Σ_jl a_ij â_jl c_l^(k−2) − c_i^k / (k (k−1)), k = 2..Q."""
    return max(
        (np.max(np.abs(a @ a_hat @ c ** (k - 2) - c**k / (k * (k - 1)))) for k in range(2, Q + 1)),
        default=0.0,
    )


def _dd_hat(a, a_hat, b, c, R):
    """Residual of DD̂(R), k = 2..R (App. A.3.1 of Martín de Diego & Sato Martín de Almagro):
    Σ_ij b_i c_i^(k−2) a_ij â_jl − b_l ((k−1) − (k c_l − c_l^k)) / (k (k−1))."""

    def res(k):
        rhs = b * ((k - 1) - (k * c - c**k)) / (k * (k - 1))
        return np.max(np.abs((b * c ** (k - 2)) @ a @ a_hat - rhs))

    return max((res(k) for k in range(2, R + 1)), default=0.0)


@pytest.mark.parametrize("s", range(2, 9))
def test_lobatto_pair_relations(s):
    pair = T.lobatto_iiia_iiib(s)
    a, b, c = pair.q.a, pair.q.b, pair.q.c
    ah, bh = pair.p.a, pair.p.b
    assert np.all(a[0] == 0.0)  # H1
    assert np.linalg.cond(a[1:, 1:]) < 1e6  # H2: Ã invertible
    assert np.array_equal(a[-1], b)  # H3
    assert np.all(ah[:, -1] == 0.0)  # H1′
    assert np.all(ah[:, 0] == bh[0])  # H2′
    # CĈ(s), DD̂(s), ĈC(s−2), D̂D(s−2) (App. A.3.1); each fails one order above.
    assert _cc_hat(a, ah, c, s) <= 1e-13 and _cc_hat(a, ah, c, s + 1) > 1e-8
    assert _dd_hat(a, ah, b, c, s) <= 1e-13 and _dd_hat(a, ah, b, c, s + 1) > 1e-8
    above = max(s - 1, 2)  # k starts at 2, so order 1 is vacuous
    assert _cc_hat(ah, a, c, s - 2) <= 1e-13 and _cc_hat(ah, a, c, above) > 1e-8
    assert _dd_hat(ah, a, b, c, s - 2) <= 1e-13 and _dd_hat(ah, a, b, c, above) > 1e-8


def test_conjugate_of_user_tableau():
    # The 2-stage SDIRK-like tableau with γ = 1/4 (any tableau with nonzero weights works).
    t = T.ButcherTableau.from_arrays([[0.25, 0.0], [0.5, 0.25]], [0.5, 0.5], [0.25, 0.75], "X", 2)
    pair = T.symplectic_pair(t)
    assert pair.is_symplectic_conjugate()
    assert pair.p.name == "X*" and pair.order == 2
    # The conjugate of the conjugate is the tableau itself.
    assert np.max(np.abs(T.symplectic_conjugate(pair.p).a - t.a)) <= 1e-15


def test_conjugate_needs_nonzero_weights():
    t = T.ButcherTableau.from_arrays(
        [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0], [-1.0, 2.0, 0.0]], [1 / 6, 2 / 3, 0.0], [0.0, 0.5, 1.0],
        "Z", 2,
    )
    with pytest.raises(ValueError, match=r"b\[2\] = 0"):
        T.symplectic_conjugate(t)
    with pytest.raises(ValueError, match="nonzero"):
        T.symplectic_pair(t)


# ----------------------------------------------------------------------------------------------
# Linear stability
# ----------------------------------------------------------------------------------------------

R_INF = {
    "gauss": lambda s: (-1) ** s,
    "lobatto_iiia": lambda s: (-1) ** (s - 1),
    "lobatto_iiib": lambda s: (-1) ** (s - 1),
    "lobatto_iiic": lambda s: 0,
    "radau_iia": lambda s: 0,
}


@pytest.mark.parametrize("family,s", FAMILY_CASES)
def test_stability_at_infinity(family, s):
    t = FAMILIES[family][0](s)
    assert abs(T.stability_at_infinity(t) - R_INF[family](s)) <= 1e-12
    # Agrees with R(z) for large |z| (the (s−1, s−1) Padé tail is O(1/z)).
    assert abs(T.stability_function(t, -1e7) - R_INF[family](s)) <= 1e-4


def test_stability_at_infinity_unbounded_for_explicit_methods():
    rk4 = T.ButcherTableau.from_arrays(
        [[0, 0, 0, 0], [0.5, 0, 0, 0], [0, 0.5, 0, 0], [0, 0, 1, 0]],
        [1 / 6, 1 / 3, 1 / 3, 1 / 6], [0, 0.5, 0.5, 1], "RK4", 4,
    )
    assert T.stability_at_infinity(rk4) == np.inf
    z = np.array([-1.0, 0.3 + 0.2j])
    taylor = 1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24
    np.testing.assert_allclose(T.stability_function(rk4, z), taylor)


@pytest.mark.parametrize("s", S_RANGE)
def test_gauss_stability_function(s):
    t = T.gauss(s)
    y = np.linspace(-50, 50, 11)
    # |R(iy)| = 1 on the imaginary axis (diagonal Padé approximant).
    assert np.max(np.abs(np.abs(T.stability_function(t, 1j * y)) - 1.0)) <= 1e-12
    z = 0.05
    assert abs(T.stability_function(t, z) - np.exp(z)) <= 10 * z ** (2 * s + 1)  # order 2s
    assert T.stability_function(t, np.zeros((2, 3))).shape == (2, 3)


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,arg,minimum",
    [
        (T.gauss, 0, "at least 1 stage"),
        (T.radau_iia, 0, "at least 1 stage"),
        (T.lobatto_iiia, 1, "at least 2 stages"),
        (T.lobatto_iiib, 1, "at least 2 stages"),
        (T.lobatto_iiic, 1, "at least 2 stages"),
        (T.lobatto_iiia_iiib, 1, "at least 2 stages"),
    ],
)
def test_too_few_stages(make, arg, minimum):
    with pytest.raises(ValueError, match=minimum):
        make(arg)


def test_non_integer_stage_count():
    with pytest.raises(TypeError, match="integer"):
        T.gauss(2.0)
    assert T.gauss(np.int64(3)) is T.gauss(3)


def test_from_arrays_validation():
    with pytest.raises(ValueError, match=r"a must have shape \(s, s\) = \(2, 2\)"):
        T.ButcherTableau.from_arrays([[1.0, 0.0]], [0.5, 0.5], [0.0, 1.0], "bad", 1)
    with pytest.raises(ValueError, match=r"c must have shape"):
        T.ButcherTableau.from_arrays(np.eye(2), [0.5, 0.5], [0.0], "bad", 1)
    with pytest.raises(ValueError, match="1-D"):
        T.ButcherTableau.from_arrays(np.eye(2), np.eye(2), [0.0, 1.0], "bad", 1)
    with pytest.raises(ValueError, match="non-finite"):
        T.ButcherTableau.from_arrays([[np.nan]], [1.0], [0.0], "bad", 1)
    with pytest.raises(ValueError):
        T.ButcherTableau(((1.0, 0.0),), (1.0,), (0.0,), "bad", 1, 0)  # direct construction too
    t = T.ButcherTableau.from_arrays([[0.5]], [1.0], [0.5], "midpoint", 2)
    assert t.stage_order == 1 and t.a_ == ((0.5,),) and isinstance(t.b_[0], float)


def test_residual_functions_reject_negative_orders():
    with pytest.raises(ValueError, match="non-negative"):
        T.residual_C(T.gauss(2), -1)
    assert T.residual_B(T.gauss(2), 0) == 0.0
