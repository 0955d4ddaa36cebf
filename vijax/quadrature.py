"""Quadrature rules and polynomial bases on the scaled step ``[0, 1]``.

One home for the numerical tools every collocation and Galerkin family shares:

* :func:`gauss_quadrature`, :func:`lobatto_quadrature` -- nodes and weights, computed in
  extended precision by the tableau pipeline of :mod:`vijax.tableaus`;
* :class:`Quadrature` -- a rule as a static value (Gauss--Legendre or the composite rectangle
  rule), as the continuous-time integrators take it;
* :func:`lagrange_extrapolation_matrix`, :func:`lagrange_derivative_matrix` (numpy, static)
  and :func:`lagrange_basis` (JAX, traced points), :func:`integration_matrix`;
* :class:`PolynomialBasis` -- Lagrange, Legendre or monomial bases written in nodal form.
"""

from __future__ import annotations

import functools
from typing import Optional

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .tableaus import _check_stages, _gauss, _lobatto_iiia

__all__ = [
    "gauss_quadrature",
    "lobatto_quadrature",
    "Quadrature",
    "as_quadrature",
    "lagrange_extrapolation_matrix",
    "lagrange_derivative_matrix",
    "lagrange_basis",
    "integration_matrix",
    "PolynomialBasis",
    "BASES",
    "gauss_basis",
    "lobatto_basis",
    "mixed_matrix",
]

BASES = ("lagrange", "legendre", "monomial")
_RECT_RULES = {"left": 0.0, "mid": 0.5, "right": 1.0}


# --------------------------------------------------------------------------------------------
# Nodes and weights
# --------------------------------------------------------------------------------------------


def gauss_quadrature(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(nodes, weights)`` of the n-point Gauss–Legendre rule on [0, 1].

    The rule has order 2n, so it is exact for degree ≤ 2n − 1. The nodes and weights are those of
    `gauss` (n), computed in extended precision.
    """
    t = _gauss(_check_stages(n, 1, "gauss_quadrature"))
    return t.c, t.b


def lobatto_quadrature(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(nodes, weights)`` of the n-point Gauss–Lobatto rule on [0, 1], n ≥ 2.

    The nodes include 0 and 1. The rule has order 2n − 2, so it is exact for degree ≤ 2n − 3.
    The weights equal ``1 / (n (n − 1) P_{n−1}(2x_i − 1)²)``.
    """
    t = _lobatto_iiia(_check_stages(n, 2, "lobatto_quadrature"))
    return t.c, t.b


# --------------------------------------------------------------------------------------------
# Rules as values
# --------------------------------------------------------------------------------------------


class Quadrature(eqx.Module):
    """A quadrature rule on the scaled step ``τ ∈ [0, 1]`` (nodes and weights, static).

    Build it with :meth:`gauss` or :meth:`rectangle`.  ``degree`` is the largest polynomial
    degree integrated exactly; the global order it allows is ``degree + 1``.
    """

    nodes_: tuple = eqx.field(static=True)
    weights_: tuple = eqx.field(static=True)
    name: str = eqx.field(static=True)
    degree: int = eqx.field(static=True)

    def __repr__(self) -> str:
        return f"Quadrature({self.name!r})"

    @property
    def nodes(self) -> np.ndarray:
        return np.array(self.nodes_, dtype=np.float64)

    @property
    def weights(self) -> np.ndarray:
        return np.array(self.weights_, dtype=np.float64)

    @property
    def size(self) -> int:
        return len(self.nodes_)

    @property
    def order(self) -> int:
        """The order in ``h`` of the rule's error per unit time (``degree + 1``)."""
        return self.degree + 1

    @classmethod
    def gauss(cls, k: int) -> "Quadrature":
        """``k``-point Gauss--Legendre rule: exact for polynomials of degree ``2k - 1``."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"Gauss quadrature needs an integer number of points k >= 1, got "
                             f"{k!r}; e.g. Quadrature.gauss(4).")
        c, b = gauss_quadrature(int(k))
        return cls(tuple(float(x) for x in c), tuple(float(x) for x in b), f"Gauss({int(k)})",
                   2 * int(k) - 1)

    @classmethod
    def rectangle(cls, rule: str = "left", *, width: Optional[float] = None,
                  h: Optional[float] = None, n: Optional[int] = None) -> "Quadrature":
        """Composite rectangle rule with ``n`` equal rectangles per step, evaluated at the
        left end, the midpoint or the right end of each rectangle (Muehlebach et al. (2016),
        §6.1, use width 1e-4 s without naming the point; the left rule reproduces their numbers).

        Give either ``n`` (rectangles per step) or the physical ``width`` together with the
        step size ``h`` it is meant for (``n = h / width``, which must be an integer).  The
        rule lives on the scaled step, so a different step size rescales the width.
        It is a first-order rule (second order for ``"mid"``): use it only to reproduce the
        paper's numbers (Muehlebach et al. (2016), §6.1-6.2: left rule, width 1e-4 s,
        T = 0.3 s).
        """
        if rule not in _RECT_RULES:
            raise ValueError(f"unknown rectangle rule {rule!r}; use 'left', 'mid' or 'right', "
                             f"e.g. Quadrature.rectangle('left', width=1e-4, h=0.3).")
        if n is None:
            if width is None or h is None:
                raise ValueError(
                    "the rectangle rule needs its width: pass width= (seconds) and the step "
                    "size h= it is used with, e.g. Quadrature.rectangle('left', width=1e-4, "
                    "h=0.3), or the number of rectangles per step n=3000.")
            if not (width > 0 and h > 0):
                raise ValueError(f"width and h must be positive, got width={width}, h={h}.")
            ratio = float(h) / float(width)
            n = int(round(ratio))
            if n < 1 or abs(ratio - n) > 1e-6 * max(ratio, 1.0):
                raise ValueError(f"the step h = {h} is not a multiple of the rectangle width "
                                 f"{width} (h / width = {ratio:.6g}); choose a width that "
                                 f"divides h, or pass n= rectangles per step.")
        elif isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n (rectangles per step) must be a positive integer, got {n!r}.")
        n = int(n)
        nodes = (np.arange(n) + _RECT_RULES[rule]) / n
        return cls(tuple(float(x) for x in nodes), (1.0 / n,) * n, f"Rectangle-{rule}({n})",
                   1 if rule == "mid" else 0)


def as_quadrature(rule, default_points: int, what: str) -> Quadrature:
    """A :class:`Quadrature` from a user's ``rule`` (None, an int, 'gauss', 'gauss-k' or a rule)."""
    if rule is None:
        return Quadrature.gauss(default_points)
    if isinstance(rule, Quadrature):
        return rule
    if isinstance(rule, (int, np.integer)) and not isinstance(rule, bool):
        return Quadrature.gauss(int(rule))
    if isinstance(rule, str):
        key = rule.lower().replace("_", "-")
        if key == "gauss":
            return Quadrature.gauss(default_points)
        if key.startswith("gauss-") and key[6:].isdigit():
            return Quadrature.gauss(int(key[6:]))
        if key.startswith("rectangle") or key in _RECT_RULES:
            rule = key.split("-", 1)[1] if "-" in key else "left"
            raise ValueError(
                f"{what}={rule!r}: the rectangle rule needs its width; pass "
                f"Quadrature.rectangle({rule!r}, width=1e-4, h=0.3) (or n= rectangles per "
                f"step) instead of a string.")
    raise ValueError(f"unknown {what} {rule!r}; use None (Gauss with {default_points} points), "
                     f"an int k (k-point Gauss), 'gauss', 'gauss-k', Quadrature.gauss(k) or "
                     f"Quadrature.rectangle(rule, width=..., h=...).")


# --------------------------------------------------------------------------------------------
# Lagrange interpolation
# --------------------------------------------------------------------------------------------


def lagrange_extrapolation_matrix(nodes_from, nodes_to) -> np.ndarray:
    """``E[i, j] = l_j(nodes_to[i])``, where ``l_j`` is the Lagrange basis on ``nodes_from``.

    ``E @ values_at(nodes_from)`` evaluates the interpolating polynomial at ``nodes_to``. Use it,
    for example, for stage predictors from the previous step's continuous output (the
    collocation polynomial of Martín de Diego & Sato Martín de Almagro (2022), App. A.1).
    """
    xf = np.asarray(nodes_from, dtype=np.float64)
    xt = np.asarray(nodes_to, dtype=np.float64)
    if xf.ndim != 1 or xf.size == 0 or xt.ndim != 1:
        raise ValueError(
            f"nodes must be 1-D (nodes_from non-empty); got shapes {xf.shape} and {xt.shape}"
        )
    n = xf.size
    diff = xf[:, None] - xf[None, :] + np.eye(n)  # diagonal set to 1
    if np.any(diff == 0.0):
        raise ValueError(f"nodes_from must be distinct; got {xf}")
    num = np.broadcast_to((xt[:, None] - xf[None, :])[:, None, :], (xt.size, n, n)).copy()
    num[:, np.arange(n), np.arange(n)] = 1.0
    return np.prod(num, axis=-1) / np.prod(diff, axis=-1)[None, :]


def lagrange_derivative_matrix(nodes_from, nodes_to) -> np.ndarray:
    """``D[i, j] = l_j'(nodes_to[i])`` for the Lagrange basis ``l_j`` on ``nodes_from``.

    Built from the barycentric differentiation matrix at the nodes (stable for any distinct
    nodes) and interpolated to ``nodes_to``: ``l_j'`` has degree ``n - 2``, so it equals its
    interpolant on the ``n`` nodes.
    """
    xf = np.asarray(nodes_from, dtype=np.float64)
    n = xf.size
    if n == 1:
        return np.zeros((np.asarray(nodes_to).size, 1))
    diff = xf[:, None] - xf[None, :] + np.eye(n)
    w = 1.0 / np.prod(diff, axis=1)  # barycentric weights
    with np.errstate(divide="ignore"):
        d = (w[None, :] / w[:, None]) / (xf[:, None] - xf[None, :] + np.eye(n))
    np.fill_diagonal(d, 0.0)
    np.fill_diagonal(d, -d.sum(axis=1))
    return lagrange_extrapolation_matrix(xf, nodes_to) @ d


def integration_matrix(nodes_from, nodes_to) -> np.ndarray:
    """``I[i, j] = ∫_0^{nodes_to[i]} l_j(τ) dτ`` for the Lagrange basis ``l_j`` on
    ``nodes_from`` (exact: Gauss quadrature with enough points on each ``[0, x]``).  For the
    collocation nodes ``c`` of a tableau, ``integration_matrix(c, c)`` is its ``A`` and
    ``integration_matrix(c, [1])`` its ``b``."""
    xf = np.asarray(nodes_from, dtype=np.float64)
    xt = np.asarray(nodes_to, dtype=np.float64)
    g, w = gauss_quadrature(max(xf.size, 1))
    out = np.empty((xt.size, xf.size))
    for i, x in enumerate(xt):
        out[i] = (w * x) @ lagrange_extrapolation_matrix(xf, g * x)
    return out


# --------------------------------------------------------------------------------------------
# Polynomial bases
# --------------------------------------------------------------------------------------------


def lagrange_basis(nodes: np.ndarray, x) -> Array:
    """``L[i, j] = l_j(x_i)`` for the Lagrange basis on the static ``nodes`` at traced ``x``
    (the JAX counterpart of :func:`lagrange_extrapolation_matrix`)."""
    nodes = np.asarray(nodes, dtype=np.float64)
    x = jnp.atleast_1d(x)
    n = nodes.size
    diff = nodes[:, None] - nodes[None, :] + np.eye(n)
    denom = np.prod(diff, axis=1)  # prod_{m != j} (c_j - c_m)
    num = x[:, None, None] - jnp.asarray(nodes, x.dtype)[None, None, :]  # (len, j, m)
    num = jnp.where(jnp.asarray(np.eye(n, dtype=bool))[None], 1.0, num)
    return jnp.prod(num, axis=-1) / jnp.asarray(denom, x.dtype)[None, :]


class PolynomialBasis:
    """``s`` polynomials of degree ``s - 1`` on [0, 1], written as ``φ(τ) = L(τ) T`` with the
    Lagrange basis ``L`` at ``nodes`` and a change-of-basis matrix ``T[j, k] = φ_k(nodes_j)``.

    ``kind``: ``"lagrange"`` (the nodal basis itself), ``"legendre"`` (shifted Legendre
    polynomials) or ``"monomial"``.  Static (numpy) data: build it outside traced code, once.
    """

    def __init__(self, kind: str, nodes: np.ndarray):
        s = nodes.size
        self.kind, self.nodes, self.s = kind, nodes, s
        if kind == "lagrange":
            T = np.eye(s)
        elif kind == "legendre":
            T = np.stack([np.polynomial.legendre.legval(2 * nodes - 1, np.eye(s)[k])
                          for k in range(s)], axis=1)
        elif kind == "monomial":
            T = nodes[:, None] ** np.arange(s)[None, :]
        else:
            raise ValueError(f"unknown basis {kind!r}; use one of {BASES}.")
        self.T = T
        self.Tinv = np.linalg.inv(T)
        self.D = lagrange_derivative_matrix(nodes, nodes)  # D[k, j] = l_j'(c_k)

    # numpy (static) evaluation
    def values(self, tau) -> np.ndarray:
        return lagrange_extrapolation_matrix(self.nodes, np.atleast_1d(tau)) @ self.T

    def derivs(self, tau) -> np.ndarray:
        return lagrange_extrapolation_matrix(self.nodes, np.atleast_1d(tau)) @ self.D @ self.T

    # jnp (traced) evaluation
    def values_jnp(self, tau):
        return lagrange_basis(self.nodes, tau) @ jnp.asarray(self.T, jnp.asarray(tau).dtype)

    def derivs_jnp(self, tau):
        return lagrange_basis(self.nodes, tau) @ jnp.asarray(self.D @ self.T,
                                                             jnp.asarray(tau).dtype)


@functools.lru_cache(maxsize=None)
def gauss_basis(kind: str, s: int) -> PolynomialBasis:
    """``s`` polynomials of degree ``s - 1`` with the Gauss--Legendre nodes (cached)."""
    return PolynomialBasis(kind, gauss_quadrature(s)[0])


@functools.lru_cache(maxsize=None)
def lobatto_basis(r: int) -> PolynomialBasis:
    """The Lagrange basis of degree ``r`` on the ``r + 1`` Gauss--Lobatto nodes (cached)."""
    return PolynomialBasis("lagrange", lobatto_quadrature(r + 1)[0])


def mixed_matrix(bu: PolynomialBasis, bv: PolynomialBasis) -> np.ndarray:
    """``M[k, l] = ∫_0^1 u_k(τ) v_l'(τ) dτ``, exactly (Gauss with enough points)."""
    c, w = gauss_quadrature(max(bu.s + bv.s, 1))
    return (bu.values(c) * w[:, None]).T @ bv.derivs(c)
