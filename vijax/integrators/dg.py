"""Continuous-time discontinuous-Galerkin variational integrators.

Muehlebach, Heimsch & Glocker (2016) derive one-step methods from the *principle of virtual
action* in Hamiltonian form (their eq. (7); equation and section numbers below are theirs),
with ``q`` and ``p`` approximated by piecewise polynomials in time that may jump at the grid
points:

* :class:`DGVI` -- the main-text scheme (§2.4, eqs. (15)-(21)): ``q̃``
  **left-continuous**, ``p̃`` **right-continuous**, ``s`` basis functions (polynomials of
  degree ``s - 1``) per coordinate.  Nodal order ``2s - 1`` (measured; the paper gives no rate).
  With holonomic constraints (§4, eqs. (27)-(38)) a right-continuous
  constraint momentum ``p̃_g`` with ``m_g`` basis functions is added; the gap is then zero
  at every node, without stabilisation.
* :class:`CGVI` -- the Appendix-B variant (eqs. (B.10)-(B.12)):
  continuous ``q̃`` of degree ``r``, ``p̃`` of degree ``r - 1``.  For a constant mass matrix
  it is the Marsden--West Galerkin variational integrator (nodal order ``2r``).

Both schemes are built from a scalar **discrete generating functional** ``G_i`` (our
construction, not in the paper: its gradients are the residuals (19)-(20), resp. (34)): the
step equations are ``jax.grad`` of ``G_i`` with respect to the ansatz coefficients, plus the
boundary condition at ``t_i``.  ``G_i`` is a type-2
generating function ``S(q_i, p_{i+1})`` of the step map, so the map is symplectic for *any*
fixed quadrature rule placed inside ``G_i``; each additive term may use its own rule.  (What
breaks symplecticity is evaluating ``∇_q H`` and ``∇_p H`` of one non-separable term with
different rules; the paper's condition, the same rule in ``A_q`` and ``A_p``, is sufficient.)

Ansatz on the scaled time ``τ = (t - t_i) / h ∈ [0, 1]``.  The default basis is the Lagrange
basis at the ``s`` Gauss--Legendre nodes ``c_j`` (then the coefficients are the values
``q̃(t_i + c_j h)``, which are also what the states store); ``"legendre"`` and
``"monomial"`` bases span the same space and give the same trajectories (eq. (22)),
only the Newton conditioning differs.

Quadrature (:class:`Quadrature`): Gauss--Legendre with ``k`` points (default ``k = 2s``:
exact for polynomial integrands of degree ``<= 4s - 1``, i.e. for quadratic Hamiltonians and
quadratic constraints, which makes the energy-like balance (24)/(40) exact there), or the
rectangle rule (left/mid/right) with a fixed number of rectangles per step, provided only to
reproduce the paper's experiments (it is first order: with width 1e-4 s it adds about 1e-4 rad
to the nodal error of §6.1).  The term ``∫ p̃ᵀ q̃̇ dt`` is a polynomial and
is always integrated exactly.  For a :class:`~vijax.systems.MechanicalSystem` the kinetic part
``½ pᵀ M(q)⁻¹ p`` may use its own rule (``kinetic_quadrature``), as in the paper's §6.1/§6.2
(kinetic integrals analytic, potential by rectangles); the step stays symplectic (one
rule per additive term of ``G_i``, see above).

Non-potential forces and time-dependent Hamiltonians are not supported (vijax systems are
autonomous Lagrangians).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .. import constraints as cons
from .. import tableaus as tb
from ..solvers import AbstractRootSolver, Newton
from ..systems import HolonomicSystem, MechanicalSystem
from ._base import AbstractIntegrator, AbstractState

__all__ = [
    "Quadrature",
    "DGVI",
    "DGState",
    "ConstrainedDGState",
    "CGVI",
    "CGState",
    "DenseOutput",
    "dg_prk_tableau",
    "dg_prk_tableau_formula",
]

_BASES = ("lagrange", "legendre", "monomial")
_RECT_RULES = {"left": 0.0, "mid": 0.5, "right": 1.0}


# ----------------------------------------------------------------------------------------------
# Quadrature rules on [0, 1]
# ----------------------------------------------------------------------------------------------


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
        c, b = tb.gauss_quadrature(int(k))
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


def _as_quadrature(spec, default_points: int, what: str) -> Quadrature:
    if spec is None:
        return Quadrature.gauss(default_points)
    if isinstance(spec, Quadrature):
        return spec
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return Quadrature.gauss(int(spec))
    if isinstance(spec, str):
        key = spec.lower().replace("_", "-")
        if key == "gauss":
            return Quadrature.gauss(default_points)
        if key.startswith("gauss-") and key[6:].isdigit():
            return Quadrature.gauss(int(key[6:]))
        if key.startswith("rectangle") or key in _RECT_RULES:
            rule = key.split("-", 1)[1] if "-" in key else "left"
            raise ValueError(
                f"{what}={spec!r}: the rectangle rule needs its width; pass "
                f"Quadrature.rectangle({rule!r}, width=1e-4, h=0.3) (or n= rectangles per "
                f"step) instead of a string.")
    raise ValueError(f"unknown {what} {spec!r}; use None (Gauss with {default_points} points), "
                     f"an int k (k-point Gauss), 'gauss', 'gauss-k', Quadrature.gauss(k) or "
                     f"Quadrature.rectangle(rule, width=..., h=...).")


# ----------------------------------------------------------------------------------------------
# Polynomial bases on [0, 1]
# ----------------------------------------------------------------------------------------------


def _lagrange_jnp(nodes: np.ndarray, x):
    """``L[i, j] = l_j(x_i)`` for the Lagrange basis on ``nodes`` (traced ``x`` allowed)."""
    x = jnp.atleast_1d(x)
    n = nodes.size
    diff = nodes[:, None] - nodes[None, :] + np.eye(n)
    denom = np.prod(diff, axis=1)  # prod_{m != j} (c_j - c_m)
    num = x[:, None, None] - jnp.asarray(nodes, x.dtype)[None, None, :]  # (len, j, m)
    num = jnp.where(jnp.asarray(np.eye(n, dtype=bool))[None], 1.0, num)
    return jnp.prod(num, axis=-1) / jnp.asarray(denom, x.dtype)[None, :]


class _Basis:
    """``s`` polynomials of degree ``s - 1`` on [0, 1], written as ``φ(τ) = L(τ) T`` with the
    Lagrange basis ``L`` at ``nodes`` and a change-of-basis matrix ``T[j, k] = φ_k(nodes_j)``."""

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
        else:  # pragma: no cover - validated by the integrators
            raise ValueError(kind)
        self.T = T
        self.Tinv = np.linalg.inv(T)
        self.D = tb.lagrange_derivative_matrix(nodes, nodes)  # D[k, j] = l_j'(c_k)

    # numpy (static) evaluation
    def values(self, tau) -> np.ndarray:
        return tb.lagrange_extrapolation_matrix(self.nodes, np.atleast_1d(tau)) @ self.T

    def derivs(self, tau) -> np.ndarray:
        return tb.lagrange_extrapolation_matrix(self.nodes, np.atleast_1d(tau)) @ self.D @ self.T

    # jnp (traced) evaluation
    def values_jnp(self, tau):
        return _lagrange_jnp(self.nodes, tau) @ jnp.asarray(self.T, jnp.asarray(tau).dtype)

    def derivs_jnp(self, tau):
        return _lagrange_jnp(self.nodes, tau) @ jnp.asarray(self.D @ self.T, jnp.asarray(tau).dtype)


@functools.lru_cache(maxsize=None)
def _gauss_basis(kind: str, s: int) -> _Basis:
    return _Basis(kind, tb.gauss_quadrature(s)[0])


@functools.lru_cache(maxsize=None)
def _lobatto_basis(r: int) -> _Basis:
    return _Basis("lagrange", tb.lobatto_quadrature(r + 1)[0])


def _mixed_matrix(bu: _Basis, bv: _Basis) -> np.ndarray:
    """``M[k, l] = ∫_0^1 u_k(τ) v_l'(τ) dτ``, exactly (Gauss with enough points)."""
    c, w = tb.gauss_quadrature(max(bu.s + bv.s, 1))
    return (bu.values(c) * w[:, None]).T @ bv.derivs(c)


def _step_ratio(state, h):
    """``h / h_prev`` for the predictor; 0 on the first step (no previous interval: the
    extrapolation then repeats the initial data)."""
    return jnp.where(state.h > 0, h / jnp.where(state.h > 0, state.h, 1.0), 0.0)


def _extrapolation(nodes: np.ndarray, ratio, at) -> Array:
    """Values at ``1 + ratio * at`` of the polynomial through ``nodes``: predictor matrix."""
    return _lagrange_jnp(nodes, 1.0 + ratio * jnp.asarray(at, ratio.dtype))


# ----------------------------------------------------------------------------------------------
# Hamiltonian pieces
# ----------------------------------------------------------------------------------------------


def _hamiltonian(system, q, p):
    """``H(q, p)``; for a mechanical system ``½ pᵀ M⁻¹ p + V`` directly."""
    if isinstance(system, MechanicalSystem):
        return 0.5 * p @ (system.inverse_mass_matrix(q) @ p) + system.potential(q)
    return system.hamiltonian(q, p)


def _grad_H(system, q, p):
    return jax.grad(_hamiltonian, argnums=(1, 2))(system, q, p)


def _quad_sum(rule: Quadrature, basis_q: _Basis, basis_p: _Basis, Q, P, fn, dtype):
    """``Σ_j w_j fn(q̃(τ_j), p̃(τ_j))`` with basis coefficients ``Q``, ``P``."""
    Bq = jnp.asarray(basis_q.values(rule.nodes), dtype)
    Bp = jnp.asarray(basis_p.values(rule.nodes), dtype)
    vals = jax.vmap(fn)(Bq @ Q, Bp @ P)
    return jnp.asarray(rule.weights, dtype) @ vals


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


class DenseOutput(NamedTuple):
    """Dense values at the requested times: ``q̃``, ``p̃`` and (constrained DG only) ``p̃_g``."""

    q: Array
    p: Array
    pg: Optional[Array] = None


def _locate(t_nodes, t, right: bool, snap):
    """Interval index for each ``t`` (left- or right-continuous convention) and whether ``t``
    is a grid point (within ``snap`` of one; the grid is accumulated in floating point)."""
    n_int = t_nodes.shape[0] - 1
    nearest = jnp.clip(jnp.searchsorted(t_nodes, t), 0, n_int)
    lower = jnp.clip(nearest - 1, 0, n_int)
    d_near = jnp.abs(t_nodes[nearest] - t)
    d_low = jnp.abs(t_nodes[lower] - t)
    node = jnp.where(d_low < d_near, lower, nearest)
    on_node = jnp.minimum(d_near, d_low) <= snap
    idx = jnp.searchsorted(t_nodes, t, side="right" if right else "left") - 1
    # On a grid point the convention decides: right-continuous -> interval starting there,
    # left-continuous -> interval ending there.
    idx = jnp.where(on_node, node if right else node - 1, idx)
    return jnp.clip(idx, 0, n_int - 1), node, on_node


# ----------------------------------------------------------------------------------------------
# The discontinuous-Galerkin scheme (Muehlebach et al. (2016), §2.4 and §4)
# ----------------------------------------------------------------------------------------------


class DGState(AbstractState):
    """Node data ``(t_i, q_i, p_i)`` and the last step's ansatz and diagnostics.

    ``Q``, ``P`` are the values of ``q̃`` and ``p̃`` at the ``s`` Gauss nodes ``t_{i-1} + c_j h``
    of the interval just completed (the dense output; for the ``s``-point Gauss scheme these
    are the PRK stage values of :func:`dg_prk_tableau`).  Diagnostics of that step (zero at
    ``t_0``):

    * ``balance``: residual LHS - RHS of the energy-like balance (24) of Muehlebach et al. (2016);
    * ``jump_q = q̃(t_{i-1}^+) - q_{i-1}`` and ``jump_p = p̃(t_i^-) - p_i``: since ``q̃`` is
      left- and ``p̃`` right-continuous, ``q_{i-1}`` and ``p_i`` are node values, not limits.
    """

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    h: Float[Array, ""]
    Q: Float[Array, "s n"]
    P: Float[Array, "s n"]
    balance: Float[Array, ""]
    jump_q: Float[Array, " n"]
    jump_p: Float[Array, " n"]


class ConstrainedDGState(AbstractState):
    """Node data of the constrained DG scheme (Muehlebach et al. (2016), §4.1, eqs. (35)-(38)).

    ``pz = p_{z,i} = p̃(t_i^+) - W(q_i) p̃_g(t_i^+)`` is the scheme's node variable; its normal
    part ``W(q)``-direction is gauge (adding a multiple of ``W(q_i)`` to ``p_{z,i}`` leaves
    ``q_{i+1}`` and the tangential part of ``p_{z,i+1}`` unchanged) and grows as ``p_g``
    drifts (``ṗ_g`` is the constraint force, whose mean is not zero).  ``p`` is the
    physical momentum: the tangential projection of ``pz`` in the kinetic metric
    (:func:`vijax.constraints.project_momentum`), so ``H(q, p)`` is the energy.
    ``Pg`` holds ``p̃_g`` at the ``m_g`` Gauss nodes of the last interval.  Diagnostics as in
    :class:`DGState`, with ``balance`` the residual of (40), ``jump_p = p̃_z(t_i^-) - p_{z,i}``
    and ``gap = g(q_i)``.
    """

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    pz: Float[Array, " n"]
    h: Float[Array, ""]
    Q: Float[Array, "s n"]
    P: Float[Array, "s n"]
    Pg: Float[Array, "mg nc"]
    balance: Float[Array, ""]
    jump_q: Float[Array, " n"]
    jump_p: Float[Array, " n"]
    gap: Float[Array, " nc"]


class _ContinuousTimeVI(AbstractIntegrator):
    """What :class:`DGVI` and :class:`CGVI` share: the quadrature rules, the solver, the
    integral of ``H`` inside ``G_i`` and the construction from ``(q0, v0)``."""

    quadrature: eqx.AbstractVar[Quadrature]
    kinetic_quadrature: eqx.AbstractVar[Optional[Quadrature]]
    solver: eqx.AbstractVar[AbstractRootSolver]

    symplectic = True

    @staticmethod
    def _rules(points: int, quadrature, kinetic_quadrature, solver):
        """Validated ``(quadrature, kinetic_quadrature, solver)`` (default Gauss ``points``)."""
        quad = _as_quadrature(quadrature, points, "quadrature")
        kin = (None if kinetic_quadrature is None else
               _as_quadrature(kinetic_quadrature, points, "kinetic_quadrature"))
        if solver is not None and not isinstance(solver, AbstractRootSolver):
            raise ValueError(f"solver must be a vijax.solvers root solver such as Newton(), got "
                             f"{type(solver).__name__}.")
        return quad, kin, Newton() if solver is None else solver

    def _order_with_rules(self, nodal_order: int) -> int:
        orders = [nodal_order, self.quadrature.order]
        if self.kinetic_quadrature is not None:
            orders.append(self.kinetic_quadrature.order)
        return min(orders)

    def _label(self, head: str) -> str:
        kin = "" if self.kinetic_quadrature is None else f", kinetic {self.kinetic_quadrature.name}"
        return f"{head}, {self.quadrature.name}{kin})"

    def _H_bases(self):
        """Bases of ``q̃`` and ``p̃`` inside ``∫ H dt``."""
        raise NotImplementedError

    def _H_integral(self, system, Q, P, h):
        """``∫ H(q̃, p̃) dt`` with the chosen rule(s)."""
        bq, bp = self._H_bases()
        dtype = Q.dtype
        if self.kinetic_quadrature is None:
            return h * _quad_sum(self.quadrature, bq, bp, Q, P,
                                 lambda q, p: _hamiltonian(system, q, p), dtype)
        if not isinstance(system, MechanicalSystem):
            raise ValueError(f"kinetic_quadrature splits H = T + V and needs a "
                             f"vijax.MechanicalSystem; {type(system).__name__} is not one. Use a "
                             f"single quadrature= instead.")
        kin = _quad_sum(self.kinetic_quadrature, bq, bp, Q, P,
                        lambda q, p: 0.5 * p @ (system.inverse_mass_matrix(q) @ p), dtype)
        pot = _quad_sum(self.quadrature, bq, bp, Q, P, lambda q, p: system.potential(q), dtype)
        return h * (kin + pot)

    def init(self, system, t0, q0, v0):
        return self.init_from_momentum(system, t0, q0, system.momentum(q0, v0))


class DGVI(_ContinuousTimeVI):
    """Continuous-time discontinuous-Galerkin variational integrator (Muehlebach, Heimsch &
    Glocker (2016), eqs. (19)-(21); constrained: eqs. (34)-(38)).

    ``q̃`` is left-continuous and ``p̃`` right-continuous, as in the paper (the convention is
    part of the scheme).  Step ``i`` solves ``∂G_i/∂(η_q, η_p[, η_pg]) = 0`` and the boundary
    condition ``p̃(t_i^+) = p_i`` (constrained: ``p̃(t_i^+) - W(q_i) p̃_g(t_i^+) = p_{z,i}``,
    eq. (38)) for ``η_q, η_p[, η_pg]`` and ``p_{i+1}`` (``p_{z,i+1}``); then
    ``q_{i+1} = q̃(t_{i+1})``.  ``W`` is taken at the node value ``q_i`` as in (38), not at
    ``q̃(t_i^+)`` as the example's eq. (71) prints it: only ``W(q_i)`` makes ``G_i`` a
    generating function (with ``W(q̃(t_i^+))`` Newton diverged at t ≈ 3.6 s in a reproduction
    of §6.3).

    Generating functional (our construction; its gradients are (19)-(20), resp. (34))::

        G_i = p_{i+1}ᵀ q̃(1) - p̃(0)ᵀ (q̃(0) - q_i) - ∫ p̃ᵀ q̃̇ dt + ∫ H(q̃, p̃) dt
              [+ p̃_g(1⁻)ᵀ g(q_{i+1}) - p̃_g(0)ᵀ g(q_i) - ∫ ṗ̃_gᵀ g(q̃) dt]

    The bracket is the constraint term ``p̃_g(0)ᵀ(g(q̃(0)) - g(q_i)) + ∫ p̃_gᵀ ġ̃ dt`` integrated by
    parts: identical when integrals are exact, and it makes ``g(q_{i+1}) = g(q_i)`` exact for
    *any* quadrature (with the paper's form the node gap is conserved only when ``∫ ġ̃ dt``
    is exact), since the constant test function sees only the boundary terms.
    Holonomic constraints are used whenever the system defines ``holonomic(q)`` (any factor
    convention: ``W = ∂gᵀ/∂q`` is taken from the system's ``g``; only ``p_g`` rescales).

    Parameters
    ----------
    s:
        Basis functions per coordinate (polynomials of degree ``s - 1``), ``s >= 1``.
        ``s = 1`` is symplectic Euler (our derivation).  Nodal order ``2s - 1`` (measured).
    quadrature:
        Rule for ``∫ H dt`` (and the constraint term): ``None`` = Gauss with ``2s`` points,
        an int ``k`` = ``k``-point Gauss, or a :class:`Quadrature`.
    kinetic_quadrature:
        Optional separate rule for ``∫ ½ p̃ᵀ M(q̃)⁻¹ p̃ dt`` (mechanical systems only), e.g.
        ``Quadrature.gauss(s)`` (exact for constant ``M``) with a rectangle rule for the
        potential, as in Muehlebach et al. (2016), §6.1.
    basis:
        ``"lagrange"`` (at the Gauss nodes; default), ``"legendre"`` or ``"monomial"`` in the
        scaled time ``τ`` -- same trajectories (eq. (22)), different conditioning.
    m_g:
        Basis functions of ``p̃_g`` per constraint (default ``s``; must be ``>= 1`` so that the
        constants are included, Assumption 4.1).
    solver:
        Root solver, default :class:`~vijax.solvers.Newton` (exact Jacobian of the residual).
    """

    s: int = eqx.field(static=True)
    quadrature: Quadrature
    kinetic_quadrature: Optional[Quadrature]
    basis: str = eqx.field(static=True)
    m_g: Optional[int] = eqx.field(static=True)
    solver: AbstractRootSolver

    supported = frozenset({HolonomicSystem})

    def __init__(self, s: int = 3, quadrature=None, *, kinetic_quadrature=None,
                 basis: str = "lagrange", m_g: Optional[int] = None,
                 solver: Optional[AbstractRootSolver] = None):
        self.s = _check_int("DGVI: s (basis functions per coordinate, polynomial degree s-1)",
                            s, 1)
        self.quadrature, self.kinetic_quadrature, self.solver = self._rules(
            2 * self.s, quadrature, kinetic_quadrature, solver)
        if basis not in _BASES:
            raise ValueError(f"unknown basis {basis!r}; use one of {_BASES}.")
        self.basis = basis
        self.m_g = None if m_g is None else _check_int(
            "DGVI: m_g (basis functions of p_g; >= 1 so that it contains constants)", m_g, 1)

    @classmethod
    def presets(cls):
        return [(f"DGVI({s})", cls(s)) for s in (1, 2, 3)]

    # -- traits -----------------------------------------------------------------------------
    @property
    def order(self) -> int:
        return self._order_with_rules(2 * self.s - 1)

    @property
    def stages(self) -> int:
        """Basis functions per coordinate (the PRK stage count for ``s``-point Gauss)."""
        return self.s

    @property
    def name(self) -> str:
        return self._label(f"DGVI(s={self.s}")

    @property
    def mg(self) -> int:
        return self.s if self.m_g is None else self.m_g

    def _bases(self):
        return _gauss_basis(self.basis, self.s), _gauss_basis(self.basis, self.mg)

    # -- pieces of G ------------------------------------------------------------------------
    def _H_bases(self):
        bq, _ = self._bases()
        return bq, bq

    def _generating(self, system, X, q_i, h, constrained):
        """Scalar generating functional ``G_i`` (see the class docstring)."""
        bq, bg = self._bases()
        dtype = q_i.dtype
        Q, P = X["Q"], X["P"]
        phi0 = jnp.asarray(bq.values(0.0)[0], dtype)
        phi1 = jnp.asarray(bq.values(1.0)[0], dtype)
        B = jnp.asarray(_mixed_matrix(bq, bq), dtype)  # ∫ φ_k φ_l'
        q0p, p0p, q1 = phi0 @ Q, phi0 @ P, phi1 @ Q
        G = X["p1"] @ q1 - p0p @ (q0p - q_i) - jnp.sum(P * (B @ Q)) + self._H_integral(
            system, Q, P, h)
        if constrained:
            Pg = X["Pg"]
            gphi0 = jnp.asarray(bg.values(0.0)[0], dtype)
            gphi1 = jnp.asarray(bg.values(1.0)[0], dtype)
            rule = self.quadrature
            Bq = jnp.asarray(bq.values(rule.nodes), dtype)
            dBg = jnp.asarray(bg.derivs(rule.nodes), dtype)
            gvals = jax.vmap(system.holonomic)(Bq @ Q)  # (k, nc)
            G = G + (gphi1 @ Pg) @ system.holonomic(q1) - (gphi0 @ Pg) @ system.holonomic(q_i) \
                - jnp.asarray(rule.weights, dtype) @ jnp.sum((dBg @ Pg) * gvals, axis=-1)
        return G

    def residual(self, system, X, q_i, p_i, h):
        """Step equations ``(∂G/∂η_q, ∂G/∂η_p[, ∂G/∂η_pg], BC)`` for the unknowns ``X`` (a dict
        of basis coefficients ``Q``, ``P`` [, ``Pg``] and ``p1`` = ``p_{i+1}`` or
        ``p_{z,i+1}``); ``p_i`` is the node momentum (``p_{z,i}`` when constrained)."""
        constrained = "Pg" in X
        coeffs = {k: v for k, v in X.items() if k != "p1"}

        def G(c):
            return self._generating(system, dict(c, p1=X["p1"]), q_i, h, constrained)

        grads = jax.grad(G)(coeffs)
        bq, bg = self._bases()
        phi0 = jnp.asarray(bq.values(0.0)[0], q_i.dtype)
        bc = phi0 @ X["P"] - p_i
        if constrained:
            gphi0 = jnp.asarray(bg.values(0.0)[0], q_i.dtype)
            W = cons.constraint_jacobian(system, q_i).T  # W at the node value q_i, not q̃(t_i^+)
            bc = bc - W @ (gphi0 @ X["Pg"])
        return grads, bc

    # -- state ------------------------------------------------------------------------------
    def check_initial(self, system, q0, v0, tol):
        """Constrained: ``q0`` must satisfy ``g(q0) = 0`` (the gap is conserved at the nodes,
        not restored).  The velocity need not be tangent: its normal part only shifts the
        gauge part of ``p_z`` (the paper imposes no initial condition on ``p_g``)."""
        if isinstance(system, HolonomicSystem):
            g = np.asarray(system.holonomic(q0))
            if np.max(np.abs(g)) > tol:
                raise cons.InconsistentInitialData(
                    f"q0 violates {type(system).__name__}.holonomic by {np.max(np.abs(g)):.2e}; "
                    f"DGVI conserves g(q_i) = g(q_0) at the nodes, so project it first with "
                    f"vijax.constraints.project_position(system, q0) or simulate(project=True).")

    def init_from_momentum(self, system, t0, q0, p0):
        """State at ``t0`` from ``(q0, p0)``; constrained: ``p_{z,0} = p0`` (Muehlebach et al.
        (2016), after eq. (38)) and ``p`` its tangential projection."""
        dtype = q0.dtype
        n, s = q0.shape[0], self.s
        zero = jnp.zeros((), dtype)
        common = dict(t=jnp.asarray(t0, dtype), q=q0, h=zero,
                      Q=jnp.broadcast_to(q0, (s, n)), P=jnp.broadcast_to(p0, (s, n)),
                      balance=zero, jump_q=jnp.zeros_like(q0), jump_p=jnp.zeros_like(q0))
        if not isinstance(system, HolonomicSystem):
            return DGState(p=p0, **common)
        nc = system.holonomic(q0).shape[0]
        return ConstrainedDGState(p=cons.project_momentum(system, q0, p0), pz=p0,
                                  Pg=jnp.zeros((self.mg, nc), dtype), gap=system.holonomic(q0),
                                  **common)

    def _predictor(self, state, h, constrained, system):
        bq, bg = self._bases()
        dtype = state.q.dtype
        ratio = _step_ratio(state, h)
        Eq = _extrapolation(bq.nodes, ratio, bq.nodes).astype(dtype)
        e1 = _extrapolation(bq.nodes, ratio, np.ones(1)).astype(dtype)[0]
        Tinv = jnp.asarray(bq.Tinv, dtype)
        X = {"Q": Tinv @ (Eq @ state.Q), "P": Tinv @ (Eq @ state.P), "p1": e1 @ state.P}
        if constrained:
            Eg = _extrapolation(bg.nodes, ratio, bg.nodes).astype(dtype)
            g1 = _extrapolation(bg.nodes, ratio, np.ones(1)).astype(dtype)[0]
            X["Pg"] = jnp.asarray(bg.Tinv, dtype) @ (Eg @ state.Pg)
            q1 = e1 @ state.Q
            X["p1"] = X["p1"] - cons.constraint_jacobian(system, q1).T @ (g1 @ state.Pg)
        return X

    def step(self, system, state, h):
        constrained = isinstance(system, HolonomicSystem)
        if constrained != isinstance(state, ConstrainedDGState):
            raise ValueError("DGVI: the state does not match the system (constrained state for an "
                             "unconstrained system or vice versa); build it with init().")
        h = jnp.asarray(h, state.q.dtype)
        q_i = state.q
        p_i = state.pz if constrained else state.p
        X0 = self._predictor(state, h, constrained, system)
        X, stats = self.solver.solve(lambda X: self.residual(system, X, q_i, p_i, h), X0)
        return self._new_state(system, state, X, h, constrained), stats

    def _new_state(self, system, state, X, h, constrained):
        bq, bg = self._bases()
        dtype = state.q.dtype
        q_i = state.q
        Q, P, p1 = X["Q"], X["P"], X["p1"]
        phi0 = jnp.asarray(bq.values(0.0)[0], dtype)
        phi1 = jnp.asarray(bq.values(1.0)[0], dtype)
        dphi0 = jnp.asarray(bq.derivs(0.0)[0], dtype) / h
        dphi1 = jnp.asarray(bq.derivs(1.0)[0], dtype) / h
        Tn = jnp.asarray(bq.T, dtype)  # coefficients -> values at the Gauss nodes
        q0p, p0p, q1, p1m = phi0 @ Q, phi0 @ P, phi1 @ Q, phi1 @ P
        H = functools.partial(_hamiltonian, system)
        common = dict(t=state.t + h, q=q1, h=h, Q=Tn @ Q, P=Tn @ P, jump_q=q0p - q_i)
        if not constrained:
            lhs = (dphi1 @ Q) @ (p1 - p1m) + H(q1, p1m)
            rhs = (dphi0 @ P) @ (q0p - q_i) + H(q0p, p0p)
            return DGState(p=p1, balance=lhs - rhs, jump_p=p1m - p1, **common)
        Pg = X["Pg"]
        gphi1 = jnp.asarray(bg.values(1.0)[0], dtype)
        dgphi0 = jnp.asarray(bg.derivs(0.0)[0], dtype) / h
        W1 = cons.constraint_jacobian(system, q1).T
        pzm = p1m - W1 @ (gphi1 @ Pg)
        g = system.holonomic
        lhs = (dphi1 @ Q) @ (p1 - pzm) + H(q1, p1m)
        rhs = (dphi0 @ P) @ (q0p - q_i) - (dgphi0 @ Pg) @ (g(q0p) - g(q_i)) + H(q0p, p0p)
        return ConstrainedDGState(
            p=cons.project_momentum(system, q1, p1), pz=p1,
            Pg=jnp.asarray(bg.T, dtype) @ Pg, balance=lhs - rhs, jump_p=pzm - p1, gap=g(q1),
            **common)

    def velocity(self, system, state):
        return system.velocity(state.q, state.p)

    # -- dense output -----------------------------------------------------------------------
    def interval(self, state, tau, derivative: bool = False) -> DenseOutput:
        """Raw polynomials of the interval that *ended* at ``state`` at scaled times ``tau``
        (``t = state.t - state.h (1 - tau)``).  At ``tau = 0`` this is the one-sided
        ``q̃(t_i^+)`` (not the node value ``q_i``), at ``tau = 1`` the one-sided ``p̃(t_{i+1}^-)``
        (not ``p_{i+1}``).  ``derivative=True`` returns the time derivatives instead."""
        bq, bg = _gauss_basis("lagrange", self.s), _gauss_basis("lagrange", self.mg)
        tau = jnp.atleast_1d(jnp.asarray(tau, state.q.dtype))
        if derivative:
            Lq, Lg = bq.derivs_jnp(tau) / state.h, bg.derivs_jnp(tau) / state.h
        else:
            Lq, Lg = bq.values_jnp(tau), bg.values_jnp(tau)
        pg = Lg @ state.Pg if isinstance(state, ConstrainedDGState) else None
        return DenseOutput(Lq @ state.Q, Lq @ state.P, pg)

    def dense_output(self, states, t) -> DenseOutput:
        """``q̃(t)``, ``p̃(t)`` (and ``p̃_g(t)``) from the stacked states of a run saved at every
        step (``vj.simulate(..., save_every=1).states``), with the paper's conventions
        (Muehlebach et al. (2016), §2.4): ``q̃`` left-continuous (at a grid point ``t_i`` the node
        value ``q_i``, not ``q̃(t_i^+)``, whose error is far larger),
        ``p̃`` and ``p̃_g`` right-continuous (at ``t_i`` the polynomial of ``[t_i, t_{i+1})``; at
        the last grid point the node momentum ``p_N`` and the left limit of ``p̃_g``).  Times
        within ``1e-9 h`` of a grid point count as that grid point (the grid is accumulated in
        floating point).  Compiled (one compilation per array shape)."""
        return _dense_dg(self, states, jnp.atleast_1d(jnp.asarray(t, states.q.dtype)))

    # -- PRK export -------------------------------------------------------------------------
    def prk_tableau(self) -> tb.PartitionedTableau:
        """The partitioned Runge--Kutta tableau equal to this scheme (Muehlebach et al. (2016),
        Sect. 5, for ``s = 2``; our generalisation to any ``s``): only for ``s``-point Gauss
        quadrature of the whole ``H``."""
        if self.quadrature.name != f"Gauss({self.s})" or self.kinetic_quadrature not in (
                None, self.quadrature):
            raise ValueError(f"the PRK form exists for s-point Gauss quadrature only; build "
                             f"DGVI({self.s}, quadrature={self.s}) (this one uses "
                             f"{self.quadrature.name}).")
        return dg_prk_tableau(self.s)


@functools.lru_cache(maxsize=None)
def dg_prk_tableau(s: int) -> tb.PartitionedTableau:
    """The PRK ``(A, Â, b, c)`` of the DG scheme with ``s`` basis functions and ``s``-point
    Gauss quadrature, derived from the Galerkin equations (as Muehlebach et al. (2016), Sect. 5,
    eqs. (45)-(48), do for ``s = 2``; the general ``s`` is our derivation).

    With the Lagrange basis at the Gauss nodes, ``η_q`` and ``η_p`` are the stage values and
    ``∫ ψ_j f dt = h b_j f(c_j)``.  Row ``A_p = 0`` gives ``(φ(0)φ(0)ᵀ + B)(Q - q_i 1) =
    h diag(b) F`` with ``B_jl = ∫ φ_j φ_l'``, so ``A = (φ(0)φ(0)ᵀ + B)⁻¹ diag(b)``.  Row
    ``A_q = 0`` with ``p_{i+1} = p_i + h bᵀG`` gives ``Bᵀ Â = φ(1) bᵀ - diag(b)``, singular
    (kernel: the Legendre polynomial ``P_{s-1}``) and closed by the boundary condition
    ``φ(0)ᵀ Â = 0``.  The result equals :func:`dg_prk_tableau_formula`.
    """
    s = _check_int("s", s, 1)
    basis = _gauss_basis("lagrange", s)
    c, b = tb.gauss_quadrature(s)
    phi0, phi1 = basis.values(0.0)[0], basis.values(1.0)[0]
    B = _mixed_matrix(basis, basis)
    a = np.linalg.solve(np.outer(phi0, phi0) + B, np.diag(b))
    lhs = np.vstack([B.T, phi0[None, :]])
    rhs = np.vstack([np.outer(phi1, b) - np.diag(b), np.zeros((1, s))])
    ahat = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
    name = f"DG({s})"
    tq = tb.ButcherTableau.from_arrays(a, b, c, name=f"{name} q-part", order=2 * s - 1)
    tp = tb.ButcherTableau.from_arrays(ahat, b, c, name=f"{name} p-part", order=2 * s - 1)
    return tb.PartitionedTableau(tq, tp, f"{name} PRK (Gauss-{s} quadrature)", 2 * s - 1)


def dg_prk_tableau_formula(s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(A, Â, b, c)`` from our closed form (not in the paper; checked for ``s = 1..5``):
    ``a_jk = a^Gauss_jk ± ½ P_{s-1}(2c_j - 1) P_{s-1}(2c_k - 1) b_k`` (``+`` for ``A``)."""
    s = _check_int("s", s, 1)
    g = tb.gauss(s)
    leg = np.polynomial.legendre.legval(2 * g.c - 1, np.eye(s)[s - 1])
    corr = 0.5 * np.outer(leg, leg) * g.b[None, :]
    return g.a + corr, g.a - corr, g.b, g.c


# ----------------------------------------------------------------------------------------------
# Appendix B: continuous q̃ (Marsden--West Galerkin VI for constant M)
# ----------------------------------------------------------------------------------------------


class CGState(AbstractState):
    """Node data ``(t_i, q_i, p_i)`` of the continuous-position scheme and the last interval:
    ``Q`` = ``q̃`` at the ``r + 1`` Gauss--Lobatto nodes (``Q[0] = q_{i-1}``, ``Q[-1] = q_i``),
    ``P`` = ``p̃`` at the ``r`` Gauss nodes.  ``lam = p̃(t_{i-1}^+) - p_{i-1}`` (the continuity
    multiplier of eq. (B.6)) and ``jump_p = p̃(t_i^-) - p_i``."""

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    h: Float[Array, ""]
    Q: Float[Array, "r1 n"]
    P: Float[Array, "r n"]
    lam: Float[Array, " n"]
    jump_p: Float[Array, " n"]


class CGVI(_ContinuousTimeVI):
    """Appendix-B variant (Muehlebach et al. (2016), eqs. (B.10)-(B.12)): continuous ``q̃`` of
    degree ``r``, ``p̃`` of degree ``r - 1``, node momenta from the continuity multipliers.

    Step: with ``q̃(t_i) = q_i`` built into the ansatz, solve ``∂G/∂η_q = 0`` (all ``r + 1``
    coefficient rows) and ``∂G/∂η_p = 0`` for the free coefficients and ``p_{i+1}``, where ::

        G = p_{i+1}ᵀ q̃(1) - p_iᵀ q̃(0) - ∫ p̃ᵀ q̃̇ dt + ∫ H(q̃, p̃) dt.

    For a constant mass matrix and exact kinetic integrals ``A_p = 0`` gives ``p̃ = M q̃̇``
    (B.13) and the step is the Marsden--West Galerkin VI (Marsden & West (2001); eq. (62) of
    Muehlebach et al.), nodal order
    ``2r``.  Quadrature options as for :class:`DGVI` (default Gauss with ``2r`` points).
    """

    r: int = eqx.field(static=True)
    quadrature: Quadrature
    kinetic_quadrature: Optional[Quadrature]
    solver: AbstractRootSolver


    def __init__(self, r: int = 2, quadrature=None, *, kinetic_quadrature=None,
                 solver: Optional[AbstractRootSolver] = None):
        self.r = _check_int("CGVI: r (polynomial degree of q)", r, 1)
        self.quadrature, self.kinetic_quadrature, self.solver = self._rules(
            2 * self.r, quadrature, kinetic_quadrature, solver)

    @classmethod
    def presets(cls):
        return [(f"CGVI({r})", cls(r)) for r in (1, 2)]

    @property
    def order(self) -> int:
        return self._order_with_rules(2 * self.r)

    @property
    def stages(self) -> int:
        """Unknown control values of ``q̃`` per step."""
        return self.r

    @property
    def name(self) -> str:
        return self._label(f"CGVI(r={self.r}")

    def _bases(self):
        return _lobatto_basis(self.r), _gauss_basis("lagrange", self.r)

    def _H_bases(self):
        return self._bases()

    def residual(self, system, X, q_i, p_i, h):
        """``(∂G/∂Q, ∂G/∂P)`` for the unknowns ``X = {"Q": Q[1:], "P": P, "p1": p_{i+1}}``."""
        bq, bp = self._bases()
        dtype = q_i.dtype
        B = jnp.asarray(_mixed_matrix(bp, bq), dtype)  # ∫ ψ_k φ_l'

        def G(Q, P):
            return (X["p1"] @ Q[-1] - p_i @ Q[0] - jnp.sum(P * (B @ Q))
                    + self._H_integral(system, Q, P, h))

        Q = jnp.concatenate([q_i[None], X["Q"]])
        return jax.grad(G, argnums=(0, 1))(Q, X["P"])

    def init_from_momentum(self, system, t0, q0, p0):
        dtype = q0.dtype
        n, r = q0.shape[0], self.r
        zero = jnp.zeros((), dtype)
        return CGState(t=jnp.asarray(t0, dtype), q=q0, p=p0, h=zero,
                       Q=jnp.broadcast_to(q0, (r + 1, n)), P=jnp.broadcast_to(p0, (r, n)),
                       lam=jnp.zeros_like(q0), jump_p=jnp.zeros_like(q0))

    def step(self, system, state, h):
        bq, bp = self._bases()
        dtype = state.q.dtype
        h = jnp.asarray(h, dtype)
        q_i, p_i = state.q, state.p
        ratio = _step_ratio(state, h)
        Eq = _extrapolation(bq.nodes, ratio, bq.nodes[1:]).astype(dtype)
        Ep = _extrapolation(bp.nodes, ratio, bp.nodes).astype(dtype)
        e1 = _extrapolation(bp.nodes, ratio, np.ones(1)).astype(dtype)[0]
        X0 = {"Q": Eq @ state.Q, "P": Ep @ state.P, "p1": e1 @ state.P}
        X, stats = self.solver.solve(lambda X: self.residual(system, X, q_i, p_i, h), X0)
        Q = jnp.concatenate([q_i[None], X["Q"]])
        P = X["P"]
        psi0 = jnp.asarray(bp.values(0.0)[0], dtype)
        psi1 = jnp.asarray(bp.values(1.0)[0], dtype)
        new = CGState(t=state.t + h, q=Q[-1], p=X["p1"], h=h, Q=Q, P=P,
                      lam=psi0 @ P - p_i, jump_p=psi1 @ P - X["p1"])
        return new, stats

    def velocity(self, system, state):
        return system.velocity(state.q, state.p)

    def interval(self, state, tau, derivative: bool = False) -> DenseOutput:
        """``q̃`` and ``p̃`` of the interval that ended at ``state`` at scaled times ``tau``
        (time derivatives with ``derivative=True``)."""
        bq, bp = self._bases()
        tau = jnp.atleast_1d(jnp.asarray(tau, state.q.dtype))
        if derivative:
            return DenseOutput(bq.derivs_jnp(tau) @ state.Q / state.h,
                               bp.derivs_jnp(tau) @ state.P / state.h)
        return DenseOutput(bq.values_jnp(tau) @ state.Q, bp.values_jnp(tau) @ state.P)

    def dense_output(self, states, t) -> DenseOutput:
        """``q̃(t)`` (continuous) and ``p̃(t)`` from a run saved at every step; ``p̃`` is taken
        right-continuous at the grid points (``p̃(t_i^+)``), the node momentum ``p_N`` at the end.
        For a constant mass matrix ``p̃ = M q̃̇`` (the paper's §6.2 momentum)."""
        return _dense_cg(self, states, jnp.atleast_1d(jnp.asarray(t, states.q.dtype)))


@eqx.filter_jit
def _dense_dg(integ: DGVI, states, t) -> DenseOutput:
    t_nodes = states.t
    snap = 1e-9 * jnp.min(states.h[1:])
    iq, node, on_node = _locate(t_nodes, t, False, snap)
    ip, _, _ = _locate(t_nodes, t, True, snap)
    n_int = t_nodes.shape[0] - 1
    after_end = on_node & (node == n_int)

    def evaluate(idx):
        st = jax.tree_util.tree_map(lambda x: x[idx + 1], states)
        tau = jnp.clip((t - (st.t - st.h)) / st.h, 0.0, 1.0)
        return jax.vmap(lambda s_, x: integ.interval(s_, x))(st, tau)

    dq = evaluate(iq)
    dp = evaluate(ip)
    q = jnp.where(on_node[:, None], states.q[node], dq.q[:, 0])
    p = jnp.where(after_end[:, None], states.p[-1], dp.p[:, 0])
    pg = None if dp.pg is None else dp.pg[:, 0]
    if pg is not None:
        pg_end = integ.interval(jax.tree_util.tree_map(lambda x: x[-1], states), 1.0).pg[0]
        pg = jnp.where(after_end[:, None], pg_end, pg)
    return DenseOutput(q, p, pg)


@eqx.filter_jit
def _dense_cg(integ: CGVI, states, t) -> DenseOutput:
    snap = 1e-9 * jnp.min(states.h[1:])
    n_int = states.t.shape[0] - 1
    idx, node, on_node = _locate(states.t, t, True, snap)
    st = jax.tree_util.tree_map(lambda x: x[idx + 1], states)
    tau = jnp.clip((t - (st.t - st.h)) / st.h, 0.0, 1.0)
    tau = jnp.where(on_node & (node < n_int), 0.0, tau)
    d = jax.vmap(lambda s_, x: integ.interval(s_, x))(st, tau)
    q = jnp.where(on_node[:, None], states.q[node], d.q[:, 0])
    p = jnp.where((on_node & (node == n_int))[:, None], states.p[-1], d.p[:, 0])
    return DenseOutput(q, p)
