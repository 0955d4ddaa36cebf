"""Butcher tableaus, symplectic-conjugate pairs and order-condition checks.

Quadrature rules and Lagrange interpolation matrices live in :mod:`vijax.quadrature`.

Tableaus are *computed, not typed in*. Each family is generated from its
nodes in extended precision -- Python's ``decimal`` with at least 50 significant digits, exact
integers where possible -- and cast to float64 only at the end. Every stored coefficient is
therefore the correctly rounded float of the exact value, up to a vanishing chance of a tie.

The pipeline (Martín de Diego & Sato Martín de Almagro (2022), eq. (41)):

1. Node polynomial with exact integer coefficients, e.g. the shifted Legendre polynomial
   ``P_s(2x-1)``.
2. Float64 root estimates from ``numpy.polynomial.legendre``, refined by Newton's method in
   ``Decimal``.
3. Lagrange basis polynomials on the nodes, by exact polynomial arithmetic in ``Decimal``.
4. Exact integration: ``a_ij = ∫_0^{c_i} l_j`` and ``b_j = ∫_0^1 l_j``.

Conventions: a tableau ``(A, b, c)`` defines ``k_i = f(t + c_i h, y + h Σ_j a_ij k_j)`` and
``y_1 = y + h Σ_i b_i k_i``. Quadrature rules and nodes live on ``[0, 1]``.

Every result is cached (``functools.lru_cache``, keyed on the stage count), so the second
``gauss(3)`` costs nothing. Tableaus are immutable, so sharing them is safe.
"""

from __future__ import annotations

import decimal
import functools
import math
import operator
from collections.abc import Callable, Sequence
from decimal import Decimal
from fractions import Fraction

import equinox as eqx
import numpy as np

__all__ = [
    "ButcherTableau",
    "PartitionedTableau",
    "gauss",
    "lobatto_iiia",
    "lobatto_iiib",
    "lobatto_iiic",
    "radau_iia",
    "symplectic_conjugate",
    "symplectic_pair",
    "lobatto_iiia_iiib",
    "residual_B",
    "residual_C",
    "residual_D",
    "satisfies_B",
    "satisfies_C",
    "satisfies_D",
    "simplifying_orders",
    "stability_function",
    "stability_at_infinity",
]

#: Moved to :mod:`vijax.quadrature`; still importable from here, with a DeprecationWarning.
_MOVED = ("gauss_quadrature", "lobatto_quadrature", "lagrange_extrapolation_matrix",
          "lagrange_derivative_matrix")


def __getattr__(name):
    if name in _MOVED:
        import warnings

        from . import quadrature

        warnings.warn(f"vijax.tableaus.{name} moved to vijax.quadrature.{name}",
                      DeprecationWarning, stacklevel=2)
        return getattr(quadrature, name)
    raise AttributeError(f"module 'vijax.tableaus' has no attribute {name!r}")


# --------------------------------------------------------------------------------------------
# Tableau containers
# --------------------------------------------------------------------------------------------


def _as_tableau_arrays(a, b, c) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Convert ``(a, b, c)`` to float64 arrays and check that they form an s-stage tableau."""
    try:
        a, b, c = (np.asarray(x, dtype=np.float64) for x in (a, b, c))
    except (TypeError, ValueError) as err:
        raise ValueError(f"tableau coefficients must be rectangular real arrays: {err}") from None
    if b.ndim != 1 or b.size == 0:
        raise ValueError(f"b must be a non-empty 1-D array of s weights; got shape {b.shape}")
    s = b.size
    if a.shape != (s, s):
        raise ValueError(f"a must have shape (s, s) = ({s}, {s}) to match b; got {a.shape}")
    if c.shape != (s,):
        raise ValueError(f"c must have shape (s,) = ({s},) to match b; got {c.shape}")
    for label, x in (("a", a), ("b", b), ("c", c)):
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{label} has non-finite entries: {x}")
    return a, b, c


def _floats(x) -> tuple:
    """Nested tuples of Python floats (hashable, usable as static fields) from an array-like."""
    if isinstance(x, (list, tuple, np.ndarray)):
        return tuple(_floats(e) for e in x)
    return float(x)


class ButcherTableau(eqx.Module):
    """An s-stage Runge–Kutta tableau ``(A, b, c)``, in the notation of App. A.3 of
    Martín de Diego & Sato Martín de Almagro (2022).

    The coefficients are stored as nested tuples of Python floats in static fields, so an
    integrator that closes over a tableau bakes them into the compiled code as constants. Read
    them as float64 arrays through the properties ``a``, ``b`` and ``c``. Build a tableau from
    arrays with `ButcherTableau.from_arrays`, or use a family constructor such as `gauss`.

    Attributes:
        a_, b_, c_: the coefficients as nested tuples of floats.
        name: a human-readable name, e.g. ``"Gauss(3)"``.
        order: the classical order of the Runge–Kutta method.
        stage_order: the ``q`` of the simplifying assumption ``C(q)``.
    """

    a_: tuple = eqx.field(static=True)
    b_: tuple = eqx.field(static=True)
    c_: tuple = eqx.field(static=True)
    name: str = eqx.field(static=True)
    order: int = eqx.field(static=True)
    stage_order: int = eqx.field(static=True)

    def __check_init__(self):
        _as_tableau_arrays(self.a_, self.b_, self.c_)

    @classmethod
    def from_arrays(cls, a, b, c, name: str, order: int, stage_order: int | None = None):
        """Build a tableau from array-likes, checking shapes: ``a`` (s, s), ``b`` and ``c`` (s,).

        Args:
            a, b, c: the coefficients; they must be finite.
            name: the display name.
            order: the classical order of the method (this is not checked).
            stage_order: the ``q`` of ``C(q)``. If omitted, it is the largest ``q`` for which
                ``C(q)`` holds numerically (tolerance ``1e-12``).

        Raises:
            ValueError: on inconsistent shapes or non-finite entries.
        """
        a, b, c = _as_tableau_arrays(a, b, c)
        if stage_order is None:
            stage_order = _largest_order(lambda q: _residual_C(a, c, q), 1e-12, a.shape[0] + 1)
        return cls(_floats(a), _floats(b), _floats(c), str(name), int(order), int(stage_order))

    @property
    def a(self) -> np.ndarray:
        """The (s, s) coefficient matrix as a fresh float64 array."""
        return np.array(self.a_, dtype=np.float64)

    @property
    def b(self) -> np.ndarray:
        """The (s,) weights as a fresh float64 array."""
        return np.array(self.b_, dtype=np.float64)

    @property
    def c(self) -> np.ndarray:
        """The (s,) nodes as a fresh float64 array."""
        return np.array(self.c_, dtype=np.float64)

    @property
    def stages(self) -> int:
        """The number of stages s."""
        return len(self.b_)

    def __repr__(self) -> str:
        return f"ButcherTableau({self.name!r}, order={self.order})"


class PartitionedTableau(eqx.Module):
    """A partitioned RK pair: tableau ``q`` for positions and ``p`` for momenta.

    For a symplectic pair (Martín de Diego & Sato Martín de Almagro (2022), Thm 4.2) the
    tableaus satisfy ``b_i â_ij + b̂_j a_ji = b_i b̂_j`` and ``b̂ = b``, where ``(a, b)``
    belong to ``q`` and ``(â, b̂)`` to ``p``.
    """

    q: ButcherTableau
    p: ButcherTableau
    name: str = eqx.field(static=True)
    order: int = eqx.field(static=True)

    def symplectic_defect(self) -> float:
        """``max_ij |b_i â_ij + b̂_j a_ji − b_i b̂_j| + max_i |b_i − b̂_i|``.

        It is zero (to round-off) for a symplectic pair.
        """
        a, b, ah, bh = self.q.a, self.q.b, self.p.a, self.p.b
        cond = b[:, None] * ah + bh[None, :] * a.T - b[:, None] * bh[None, :]
        return float(np.max(np.abs(cond)) + np.max(np.abs(b - bh)))

    def is_symplectic_conjugate(self, tol: float = 1e-13) -> bool:
        """Whether `symplectic_defect` is at most ``tol``."""
        return self.symplectic_defect() <= tol

    def __repr__(self) -> str:
        return f"PartitionedTableau({self.name!r}, order={self.order})"


# --------------------------------------------------------------------------------------------
# Extended-precision polynomial arithmetic. Polynomials are coefficient lists, lowest degree
# first, whose entries are ints, Fractions or Decimals. Decimal arithmetic uses the context that
# `_extended` installs.
# --------------------------------------------------------------------------------------------


def _extended(fn: Callable) -> Callable:
    """Run ``fn(s, ...)`` in a Decimal context with ``50 + 2 s`` significant digits.

    The growth with s more than covers the digits lost to cancellation in the monomial basis
    (about one per stage), so at least ~45 correct digits survive for any s.
    """

    @functools.wraps(fn)
    def wrapper(s, *args):
        with decimal.localcontext(prec=50 + 2 * s):
            return fn(s, *args)

    return wrapper


def _poly_eval(p: Sequence, x):
    """Horner evaluation of ``p`` at ``x``."""
    result = 0
    for coeff in reversed(p):
        result = result * x + coeff
    return result


def _poly_deriv(p: Sequence) -> list:
    return [k * p[k] for k in range(1, len(p))]


def _poly_antideriv(p: Sequence) -> list:
    """The antiderivative of ``p`` that vanishes at 0."""
    return [0] + [coeff / (k + 1) for k, coeff in enumerate(p)]


def _poly_mul_linear(p: Sequence, root) -> list:
    """``p(x) · (x − root)``."""
    return [a - root * b for a, b in zip([0, *p], [*p, 0])]


def _shifted_legendre(n: int) -> list[int]:
    """Exact integer coefficients of ``P_n(2x − 1)``: ``Σ_k (−1)^(n+k) C(n,k) C(n+k,k) x^k``."""
    return [(-1) ** (n + k) * math.comb(n, k) * math.comb(n + k, k) for k in range(n + 1)]


def _refine_roots(p: Sequence[int], guesses: np.ndarray) -> list[Decimal]:
    """Refine float64 root estimates of ``p`` on [0, 1] by Newton's method in Decimal."""
    dp = _poly_deriv(p)
    tol = Decimal(10) ** -(3 * decimal.getcontext().prec // 5)  # Newton squares the error
    roots = []
    for guess in np.sort(np.real(guesses)):
        x = Decimal(float(guess))
        for _ in range(50):
            dx = _poly_eval(p, x) / _poly_eval(dp, x)
            x -= dx
            if abs(dx) <= tol:
                break
        else:
            raise ArithmeticError(f"Newton did not converge to a root near {guess}")
        roots.append(x)
    if any(r1 - r0 <= tol for r0, r1 in zip(roots, roots[1:])):
        raise ArithmeticError("Newton converged to a repeated root; the initial guesses were poor")
    return roots


def _lagrange_basis(nodes: Sequence[Decimal]) -> list[list[Decimal]]:
    """Coefficient lists of the Lagrange basis polynomials ``l_j`` on ``nodes``."""
    basis = []
    for j, cj in enumerate(nodes):
        poly, denom = [Decimal(1)], Decimal(1)
        for k, ck in enumerate(nodes):
            if k != j:
                poly = _poly_mul_linear(poly, ck)
                denom *= cj - ck
        basis.append([coeff / denom for coeff in poly])
    return basis


def _collocation(nodes: Sequence) -> tuple[list[list], list]:
    """``(A, b)`` of the collocation method on ``nodes``.

    ``a_ij = ∫_0^{c_i} l_j`` and ``b_j = ∫_0^1 l_j``: eq. (41) of
    Martín de Diego & Sato Martín de Almagro (2022).
    """
    antiderivs = [_poly_antideriv(ell) for ell in _lagrange_basis(nodes)]
    a = [[_poly_eval(L, ci) for L in antiderivs] for ci in nodes]
    b = [_poly_eval(L, 1) for L in antiderivs]
    return a, b


def _conjugate(a: Sequence[Sequence], b: Sequence) -> list[list]:
    """``â_ij = b_j (1 − a_ji / b_i)``, the solution of ``b_i â_ij + b_j a_ji = b_i b_j``.

    Generic over the number type, so it runs exactly on Fractions or in
    extended precision on Decimals.
    """
    s = len(b)
    # Written as b_j (1 − a_ji / b_i) so that a_ji = b_i gives exactly 0 and a_ji = 0 exactly b_j
    # (hypotheses H1′ and H2′ of Martín de Diego & Sato Martín de Almagro (2022), §4.3, hold
    # exactly, not just to the working precision).
    return [[b[j] * (1 - a[j][i] / b[i]) for j in range(s)] for i in range(s)]


# --------------------------------------------------------------------------------------------
# Nodes in extended precision (cached; Decimal tuples on [0, 1], increasing)
# --------------------------------------------------------------------------------------------


def _to_unit_interval(y: np.ndarray) -> np.ndarray:
    return (1.0 + np.asarray(y)) / 2.0


@functools.lru_cache(maxsize=None)
@_extended
def _gauss_nodes(s: int) -> tuple[Decimal, ...]:
    """Zeros of ``P_s(2x − 1)``."""
    guesses = _to_unit_interval(np.polynomial.legendre.leggauss(s)[0])
    return tuple(_refine_roots(_shifted_legendre(s), guesses))


@functools.lru_cache(maxsize=None)
@_extended
def _lobatto_nodes(s: int) -> tuple[Decimal, ...]:
    """0, the zeros of ``P'_{s−1}(2x − 1)``, and 1: the Lobatto nodes."""
    guesses = _to_unit_interval(np.polynomial.Legendre.basis(s - 1).deriv().roots())
    interior = _refine_roots(_poly_deriv(_shifted_legendre(s - 1)), guesses)
    return (Decimal(0), *interior, Decimal(1))


@functools.lru_cache(maxsize=None)
@_extended
def _radau_right_nodes(s: int) -> tuple[Decimal, ...]:
    """Zeros of ``P_s(2x − 1) − P_{s−1}(2x − 1)``; the last one is 1."""
    guesses = np.sort(np.polynomial.Legendre([0] * (s - 1) + [-1, 1]).roots().real)
    poly = [p - q for p, q in zip(_shifted_legendre(s), [*_shifted_legendre(s - 1), 0])]
    return (*_refine_roots(poly, _to_unit_interval(guesses[:-1])), Decimal(1))


# --------------------------------------------------------------------------------------------
# Tableau families
# --------------------------------------------------------------------------------------------


def _check_stages(s, minimum: int, family: str) -> int:
    try:
        s = operator.index(s)
    except TypeError:
        raise TypeError(f"{family}: the stage count s must be an integer; got {s!r}") from None
    if s < minimum:
        raise ValueError(
            f"{family} needs at least {minimum} stage{'s' if minimum > 1 else ''}; got s={s}"
        )
    return s


def _tableau(a, b, c, name: str, order: int, stage_order: int) -> ButcherTableau:
    """A ButcherTableau from exact / extended-precision coefficients, rounded once to float64."""
    return ButcherTableau(_floats(a), _floats(b), _floats(c), name, order, stage_order)


def gauss(s: int) -> ButcherTableau:
    """The s-stage Gauss–Legendre collocation method; order 2s, stage order s, s ≥ 1.

    Nodes are the zeros of ``P_s(2x − 1)``; ``a_ij = ∫_0^{c_i} l_j`` and ``b_j = ∫_0^1 l_j``
    (Martín de Diego & Sato Martín de Almagro (2022), eq. (41)). It satisfies B(2s), C(s) and
    D(s), is symplectic (self-conjugate), and ``R(∞) = (−1)^s``.
    """
    return _gauss(_check_stages(s, 1, "gauss"))


@functools.lru_cache(maxsize=None)
@_extended
def _gauss(s: int) -> ButcherTableau:
    nodes = _gauss_nodes(s)
    a, b = _collocation(nodes)
    return _tableau(a, b, nodes, f"Gauss({s})", 2 * s, s)


@functools.lru_cache(maxsize=None)
@_extended
def _lobatto_iiia_exact(s: int) -> tuple[tuple[tuple[Decimal, ...], ...], tuple, tuple]:
    """Lobatto IIIA ``(A, b, c)`` in extended precision, shared by IIIA, IIIB and IIIC."""
    nodes = _lobatto_nodes(s)
    a, b = _collocation(nodes)
    return tuple(map(tuple, a)), tuple(b), nodes


def lobatto_iiia(s: int) -> ButcherTableau:
    """The s-stage Lobatto IIIA (continuous collocation) method; order 2s − 2, stage order s.

    Nodes ``c_1 = 0``, ``c_s = 1`` and the zeros of ``P'_{s−1}(2x − 1)``; collocation
    coefficients as in Martín de Diego & Sato Martín de Almagro (2022), eq. (41). It satisfies
    B(2s − 2), C(s), D(s − 2), their hypotheses H1–H3 (§4.3) and ``R(∞) = (−1)^(s−1)``.
    Requires s ≥ 2.
    """
    return _lobatto_iiia(_check_stages(s, 2, "lobatto_iiia"))


@functools.lru_cache(maxsize=None)
def _lobatto_iiia(s: int) -> ButcherTableau:
    return _tableau(*_lobatto_iiia_exact(s), f"Lobatto IIIA({s})", 2 * s - 2, s)


def lobatto_iiib(s: int) -> ButcherTableau:
    """The s-stage Lobatto IIIB method: the symplectic conjugate of Lobatto IIIA.

    ``â_ij = b_j (1 − a_ji / b_i)``, ``b̂ = b``, ``ĉ = c``, computed in extended
    precision from the Lobatto IIIA coefficients. Order 2s − 2, stage order s − 2; it satisfies
    B(2s − 2), C(s − 2), D(s) and the hypotheses H1′, H2′ of
    Martín de Diego & Sato Martín de Almagro (2022), §4.3. Requires s ≥ 2.

    For s = 2 the row sums of ``Â`` are (1/2, 1/2), not ``c = (0, 1)``: C(1) fails, in line with
    stage order 0.
    """
    return _lobatto_iiib(_check_stages(s, 2, "lobatto_iiib"))


@functools.lru_cache(maxsize=None)
@_extended
def _lobatto_iiib(s: int) -> ButcherTableau:
    a, b, c = _lobatto_iiia_exact(s)
    return _tableau(_conjugate(a, b), b, c, f"Lobatto IIIB({s})", 2 * s - 2, s - 2)


def lobatto_iiic(s: int) -> ButcherTableau:
    """The s-stage Lobatto IIIC method; order 2s − 2, stage order s − 1, s ≥ 2.

    Defined by ``a_i1 = b_1`` for all i together with C(s − 1) (Hairer–Wanner, *Solving ODEs II*,
    §IV.5). Write ``L_j`` (j ≥ 2) for the Lagrange basis on ``c_2, …, c_s``. C(s − 1) states that
    row i integrates every polynomial of degree ≤ s − 2 over ``[0, c_i]``, so
    ``a_ij = ∫_0^{c_i} L_j − b_1 L_j(0)``. It is stiffly accurate, L-stable, and ``R(∞) = 0``.
    """
    return _lobatto_iiic(_check_stages(s, 2, "lobatto_iiic"))


@functools.lru_cache(maxsize=None)
@_extended
def _lobatto_iiic(s: int) -> ButcherTableau:
    _, b, nodes = _lobatto_iiia_exact(s)
    antiderivs = [_poly_antideriv(ell) for ell in _lagrange_basis(nodes[1:])]
    a = [[b[0]] + [_poly_eval(L, ci) - b[0] * L[1] for L in antiderivs] for ci in nodes]
    # L[1] is the constant term of the basis polynomial, i.e. its value at 0.
    return _tableau(a, b, nodes, f"Lobatto IIIC({s})", 2 * s - 2, s - 1)


def radau_iia(s: int) -> ButcherTableau:
    """The s-stage Radau IIA collocation method; order 2s − 1, stage order s, s ≥ 1.

    Nodes are the zeros of ``P_s(2x − 1) − P_{s−1}(2x − 1)``, with ``c_s = 1``. It satisfies
    B(2s − 1), C(s), D(s − 1), is stiffly accurate, and ``R(∞) = 0``. ``radau_iia(1)`` is
    backward Euler.
    """
    return _radau_iia(_check_stages(s, 1, "radau_iia"))


@functools.lru_cache(maxsize=None)
@_extended
def _radau_iia(s: int) -> ButcherTableau:
    nodes = _radau_right_nodes(s)
    a, b = _collocation(nodes)
    return _tableau(a, b, nodes, f"Radau IIA({s})", 2 * s - 1, s)


# --------------------------------------------------------------------------------------------
# Symplectic conjugates and partitioned pairs
# --------------------------------------------------------------------------------------------


def symplectic_conjugate(t: ButcherTableau) -> ButcherTableau:
    """The symplectic conjugate ``(Â, b, c)`` of a tableau, with ``â_ij = b_j − b_j a_ji / b_i``.

    This solves ``b_i â_ij + b_j a_ji = b_i b_j``, the symplecticity condition of
    Martín de Diego & Sato Martín de Almagro (2022), Thm 4.2. ``ĉ = c``, so that
    ``(t, conjugate)`` is a partitioned pair with shared stage times. The arithmetic is exact
    (Fractions on the stored binary values), rounded once to float64. The result keeps
    ``t.order``; its stage order is the largest q with C(q) satisfied numerically. For the
    Lobatto IIIA family, `lobatto_iiib` gives the same tableau computed from the nodes.

    Raises:
        ValueError: if some weight ``b_i`` is zero.
    """
    zero = [i for i, bi in enumerate(t.b_) if bi == 0.0]
    if zero:
        raise ValueError(
            "the symplectic conjugate needs all weights b_i nonzero; "
            + ", ".join(f"b[{i}] = 0" for i in zero)
        )
    a = [[Fraction(x) for x in row] for row in t.a_]
    b = [Fraction(x) for x in t.b_]
    a_hat = np.array(_floats(_conjugate(a, b)))
    return ButcherTableau.from_arrays(a_hat, t.b, t.c, f"{t.name}*", t.order)


def symplectic_pair(t: ButcherTableau) -> PartitionedTableau:
    """The symplectic partitioned pair ``(t, symplectic_conjugate(t))``.

    Use it with a variational PRK (Martín de Diego & Sato Martín de Almagro (2022), Thm 4.2).
    """
    conj = symplectic_conjugate(t)
    self_conjugate = np.max(np.abs(conj.a - t.a)) <= 4 * np.finfo(np.float64).eps
    name = t.name if self_conjugate else f"{t.name}–{conj.name}"
    return PartitionedTableau(t, conj, name, t.order)


def lobatto_iiia_iiib(s: int) -> PartitionedTableau:
    """The s-stage Lobatto IIIA–IIIB pair; order 2s − 2, s ≥ 2.

    It satisfies the hypotheses H1–H3 and H1′–H2′ of
    Martín de Diego & Sato Martín de Almagro (2022), §4.3, where the pair is called "Lobatto-s".
    """
    s = _check_stages(s, 2, "lobatto_iiia_iiib")
    name = f"Lobatto IIIA–IIIB({s})"
    return PartitionedTableau(lobatto_iiia(s), lobatto_iiib(s), name, 2 * s - 2)


# --------------------------------------------------------------------------------------------
# Order conditions B, C, D: Martín de Diego & Sato Martín de Almagro (2022), eqs. (43)–(45)
# --------------------------------------------------------------------------------------------


def _check_order(k: int) -> int:
    k = operator.index(k)
    if k < 0:
        raise ValueError(f"order must be non-negative; got {k}")
    return k


def _residual_B(b: np.ndarray, c: np.ndarray, p: int) -> float:
    k = np.arange(1, p + 1)
    return float(np.max(np.abs(c[None, :] ** (k[:, None] - 1) @ b - 1.0 / k), initial=0.0))


def _residual_C(a: np.ndarray, c: np.ndarray, q: int) -> float:
    k = np.arange(1, q + 1)
    lhs = a @ c[:, None] ** (k[None, :] - 1)  # (s, q)
    return float(np.max(np.abs(lhs - c[:, None] ** k / k), initial=0.0))


def _residual_D(a: np.ndarray, b: np.ndarray, c: np.ndarray, r: int) -> float:
    k = np.arange(1, r + 1)
    lhs = (b[:, None] * c[:, None] ** (k[None, :] - 1)).T @ a  # (r, s)
    rhs = b[None, :] * (1.0 - c[None, :] ** k[:, None]) / k[:, None]
    return float(np.max(np.abs(lhs - rhs), initial=0.0))


def residual_B(t: ButcherTableau, p: int) -> float:
    """``max_{k ≤ p} |Σ_i b_i c_i^(k−1) − 1/k|``, the residual of B(p) (eq. (43))."""
    return _residual_B(t.b, t.c, _check_order(p))


def residual_C(t: ButcherTableau, q: int) -> float:
    """``max_{i, k ≤ q} |Σ_j a_ij c_j^(k−1) − c_i^k / k|``, the residual of C(q) (eq. (44))."""
    return _residual_C(t.a, t.c, _check_order(q))


def residual_D(t: ButcherTableau, r: int) -> float:
    """``max_{j, k ≤ r} |Σ_i b_i c_i^(k−1) a_ij − b_j (1 − c_j^k) / k|``, the residual of D(r).

    B, C and D are eqs. (43)–(45) of Martín de Diego & Sato Martín de Almagro (2022).
    """
    return _residual_D(t.a, t.b, t.c, _check_order(r))


def satisfies_B(t: ButcherTableau, order: int, tol: float = 1e-12) -> bool:
    """Whether B(order) holds to ``tol``."""
    return residual_B(t, order) <= tol


def satisfies_C(t: ButcherTableau, order: int, tol: float = 1e-12) -> bool:
    """Whether C(order) holds to ``tol``."""
    return residual_C(t, order) <= tol


def satisfies_D(t: ButcherTableau, order: int, tol: float = 1e-12) -> bool:
    """Whether D(order) holds to ``tol``."""
    return residual_D(t, order) <= tol


def _largest_order(residual: Callable[[int], float], tol: float, max_order: int) -> int:
    """The largest ``k ≤ max_order`` with ``residual(k) ≤ tol`` (0 if none).

    The conditions are nested, so the search stops at the first failure.
    """
    k = 0
    while k < max_order and residual(k + 1) <= tol:
        k += 1
    return k


def simplifying_orders(
    t: ButcherTableau, tol: float = 1e-12, max_order: int = 30
) -> tuple[int, int, int]:
    """The largest ``(p, q, r)`` (up to ``max_order``) such that B(p), C(q), D(r) hold to ``tol``.

    The detection is numerical: once the residual of the first failing condition drops below
    ``tol``, the order is overestimated. For example, Gauss(12) misses B(25) by only 5e-16.
    """
    a, b, c = t.a, t.b, t.c
    return (
        _largest_order(lambda k: _residual_B(b, c, k), tol, max_order),
        _largest_order(lambda k: _residual_C(a, c, k), tol, max_order),
        _largest_order(lambda k: _residual_D(a, b, c, k), tol, max_order),
    )


# --------------------------------------------------------------------------------------------
# Linear stability
# --------------------------------------------------------------------------------------------


def stability_function(t: ButcherTableau, z):
    """Stability function ``R(z) = 1 + z bᵀ (I − z A)^(−1) 𝟙``, scalar or array, real or complex z.

    The result has the shape of ``z``, and dtype float64 or complex128.
    See Martín de Diego & Sato Martín de Almagro (2022), App. A.3.
    """
    a, b = t.a, t.b
    z = np.asarray(z)
    zz = z.astype(np.result_type(z.dtype, np.float64)).reshape(-1)
    m = np.eye(t.stages) - zz[:, None, None] * a
    rhs = np.ones((zz.size, t.stages, 1), dtype=m.dtype)
    x = np.linalg.solve(m, rhs)[..., 0]
    return (1.0 + zz * (x @ b)).reshape(z.shape)


def stability_at_infinity(t: ButcherTableau) -> float:
    """``R(∞) = lim_{z→∞} R(z)``.

    Expected values: Gauss ``(−1)^s``; Lobatto IIIA/IIIB ``(−1)^(s−1)``; Lobatto IIIC and
    Radau IIA ``0``.

    With ``w = 1/z``, ``R(1/w) = 1 − g(w)`` where ``g(w) = bᵀ (A − w I)^(−1) 𝟙``. If A is
    invertible, ``R(∞) = 1 − bᵀ A^(−1) 𝟙``. If A is singular (Lobatto IIIA has a zero first
    row), ``g`` may still have a removable singularity at 0. Then ``g(0)`` is the mean of g over
    a circle ``|w| = ρ`` that encloses no other pole. This is Cauchy's formula, and the
    trapezoidal rule on the circle converges exponentially. If the Laurent coefficients of
    negative powers do not vanish (e.g. explicit methods), R is unbounded and ``inf`` is
    returned. For Lobatto IIIA/IIIB the error is ~1e-15 for s ≤ 10 and ~1e-11 at s = 30,
    because ``A − wI`` becomes ill-conditioned.
    """
    a, b = t.a, t.b
    ones = np.ones(t.stages)
    if np.linalg.cond(a) < 1e10:
        return float(1.0 - b @ np.linalg.solve(a, ones))
    eig = np.abs(np.linalg.eigvals(a))
    scale = float(np.abs(a).max()) or 1.0
    is_zero = eig <= 1e-6 * scale
    rho = 0.25 * (float(eig[~is_zero].min()) if not np.all(is_zero) else scale)
    w = rho * np.exp(2j * np.pi * (np.arange(64) + 0.5) / 64)
    g = np.linalg.solve(a[None] - w[:, None, None] * np.eye(t.stages), ones[None, :, None])
    g = g[..., 0] @ b
    # A pole at 0 has order at most the multiplicity of the zero eigenvalue. Compare the size
    # of each Laurent term on the circle, |c_{-k}| / rho^k, with the size of g.
    pole_order = max(1, int(np.sum(is_zero)))
    laurent_negative = [abs(np.mean(g * w**k)) / rho**k for k in range(1, pole_order + 1)]
    if max(laurent_negative) > 1e-8 * max(1.0, float(np.abs(g).max())):
        return float("inf")
    return float(1.0 - np.mean(g).real)
