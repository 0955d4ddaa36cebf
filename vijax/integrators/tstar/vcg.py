"""Variational Crouch--Grossman methods (VCG) on ``T*G``.

Bogfjellmo & Marthinsen (2016), §4.2.  The discrete Lagrangian ``L_h = h Σ_i b_i ℓ(Q_i, ξ_i)``
(their eq. (17)) is extremised under the constraints of the Crouch--Grossman method, products
of exponentials with ``ξ_1`` acting first::

    q^0 = q0,   q^j = exp(h b_j ξ_j) q^{j−1},   q1 = q^s,
    Q_{i0} = q0,  Q_{ij} = exp(h a_ij ξ_j) Q_{i,j−1},   Q_i = Q_{is}.

Eliminating the multipliers gives the step, their eq. (18), in body momenta
``μ̄ = Ad*_q μ``::

    (ξ_i, n_i) = f(Q_i, M_i),   n̄_i = Ad*_{Q_i} n_i,   μ̄1 = μ̄0 + h Σ_j b_j n̄_j,
    M_i = dexp*_{h b_i ξ_i} Ad*_{(q^i)⁻¹} μ̄1
          − h Σ_j (b_j a_ji / b_i) dexp*_{h a_ji ξ_i} Ad*_{Q_ji⁻¹} n̄_j,

with unknowns ``(ξ_i, M_i)`` (``2 s d`` scalars) and ``dexp`` right-trivialised.  On an
abelian group it is the SPRK method ``(a, b; â, b)``.  The order conditions are those of
their §5.2 up to order 3 (:func:`vcg_order_conditions`); a Gauss tableau gives only order 2.
High order comes from composition (their Lemma 5.4, :func:`composition_tableau`): VCG with
step ``γh`` followed by VCG with step ``(1−γ)h`` is the VCG method of the combined tableau,
so symmetric compositions of the (symmetric, second-order) midpoint VCG reach any even order
(Table 2).
"""

from __future__ import annotations

from typing import Optional

import decimal
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ... import tableaus as tb
from ..._typing import ScalarLike
from ...solvers import AbstractRootSolver, SolverStats
from ...systems import LieGroupSystem
from .._base import AbstractIntegrator
from ._method import AbstractTStarMethod
from ._common import (TStarState, check_weights,
                      dexp_star, safe_div, spatial_field, stage_field, to_spatial)

__all__ = ["VCG", "composition_tableau", "vcg_order_conditions", "vcg_order",
           "TRIPLE_JUMP", "YOSHIDA6"]

_TOL = 1e-12

with decimal.localcontext(prec=60):
    _CBRT2 = Decimal(2) ** (Decimal(1) / Decimal(3))
    #: ``γ1, γ2, γ1`` of the fourth-order triple jump, ``γ1 = 1/(2 − 2^{1/3})``,
    #: ``γ2 = −2^{1/3}/(2 − 2^{1/3})`` (Bogfjellmo & Marthinsen (2016), Table 2(b)).
    TRIPLE_JUMP: tuple[Decimal, ...] = (1 / (2 - _CBRT2), -_CBRT2 / (2 - _CBRT2),
                                        1 / (2 - _CBRT2))
#: ``γ1, …, γ4, …, γ1`` of Yoshida's (1990) sixth-order symmetric composition (solution A),
#: Bogfjellmo & Marthinsen (2016), Table 2(c).
_Y = (Decimal("0.78451361047755726381949763"), Decimal("0.23557321335935813368479318"),
      Decimal("-1.17767998417887100694641568"), Decimal("1.31518632068391121888424973"))
YOSHIDA6: tuple[Decimal, ...] = (_Y[0], _Y[1], _Y[2], _Y[3], _Y[2], _Y[1], _Y[0])


def _fraction(x) -> Fraction:
    if isinstance(x, (Fraction, int)):
        return Fraction(x)
    if isinstance(x, (Decimal, float)):
        return Fraction(x)
    return Fraction(Decimal(str(x)))


def composition_tableau(tableaus: Sequence[tb.ButcherTableau], weights: Sequence,
                        name: str | None = None, order: int | None = None
                        ) -> tb.ButcherTableau:
    """The tableau of the VCG method that is the composition of VCG steps with the
    ``tableaus`` and step sizes ``weights[k] h`` (first one first), by Lemma 5.4 of
    Bogfjellmo & Marthinsen (2016) applied repeatedly::

        A = [ γ1 A¹            0          … ]      b = [ γ1 b¹, γ2 b², … ]
            [ 1 (γ1 b¹)ᵀ       γ2 A²      … ]
            [ 1 (γ1 b¹)ᵀ   1 (γ2 b²)ᵀ  γ3 A³ … ]

    Exact arithmetic on the given weights (pass ``Decimal``/``Fraction``/strings to keep more
    than float64 digits) and the stored tableau coefficients, rounded once.  The weights
    must sum to 1.  ``order`` is stored on the tableau (default: the smallest base order)."""
    if len(tableaus) != len(weights) or not tableaus:
        raise ValueError(f"composition_tableau: need as many weights as tableaus (at least one), "
                         f"got {len(tableaus)} tableaus and {len(weights)} weights")
    gam = [_fraction(w) for w in weights]
    if abs(float(sum(gam)) - 1.0) > _TOL:
        raise ValueError(f"composition weights must sum to 1 (a consistent step), got "
                         f"{float(sum(gam))!r}")
    blocks = [([[Fraction(x) for x in row] for row in t.a_], [Fraction(x) for x in t.b_])
              for t in tableaus]
    s = sum(len(bk) for _, bk in blocks)
    A = [[Fraction(0)] * s for _ in range(s)]
    B: list[Fraction] = []
    offset = 0
    for g, (ak, bk) in zip(gam, blocks):
        sk = len(bk)
        for i in range(sk):
            row = A[offset + i]
            for j, bj in enumerate(B):         # earlier sub-steps: their weights
                row[j] = bj
            for j in range(sk):                # this sub-step: its own tableau, scaled
                row[offset + j] = g * ak[i][j]
        B.extend(g * bj for bj in bk)
        offset += sk
    c = [sum(row, Fraction(0)) for row in A]
    if name is None:
        name = "∘".join(t.name for t in tableaus)
    if order is None:
        order = min(t.order for t in tableaus)
    return tb.ButcherTableau.from_arrays(np.array([[float(x) for x in row] for row in A]),
                                         [float(x) for x in B], [float(x) for x in c],
                                         name, order)


def vcg_order_conditions(tableau: tb.ButcherTableau) -> dict[str, float]:
    """Defects of the VCG order conditions up to order 3, Bogfjellmo & Marthinsen (2016),
    §5.2 (Props 5.6 and 5.7), with ``ĉ_i = Σ_j â_ij`` of the symplectic conjugate and
    ``β_i = Σ_{j<i} b_j + b_i/2``: order 1 ``Σ b_i = 1``, order 2 ``Σ b_i c_i = 1/2``, order 3
    ``Σ b_i c_i² = 1/3``, ``Σ b_i a_ij c_j = 1/6``, ``Σ b_i c_i β_i = 1/3``,
    ``Σ b_i ĉ_i² = 1/3``, ``Σ b_i ĉ_i β_i = 1/3``, ``Σ b_i³ = 0``."""
    a, b, c = tableau.a, tableau.b, tableau.c
    chat = tb.symplectic_conjugate(tableau).a.sum(axis=1)
    beta = np.concatenate([[0.0], np.cumsum(b)[:-1]]) + b / 2
    return {
        "order 1: sum b = 1": float(b.sum() - 1),
        "order 2: sum b c = 1/2": float(b @ c - 0.5),
        "order 3 (RK): sum b c^2 = 1/3": float(b @ c**2 - 1 / 3),
        "order 3 (RK): sum b a c = 1/6": float(b @ a @ c - 1 / 6),
        "order 3 (CG): sum b c beta = 1/3": float(b @ (c * beta) - 1 / 3),
        "order 3 (SPRK): sum b chat^2 = 1/3": float(b @ chat**2 - 1 / 3),
        "order 3: sum b chat beta = 1/3": float(b @ (chat * beta) - 1 / 3),
        "order 3: sum b^3 = 0": float(np.sum(b**3)),
    }


def vcg_order(tableau: tb.ButcherTableau, tol: float = _TOL) -> int:
    """The order (0 to 3) the conditions of :func:`vcg_order_conditions` give; the general
    order theory of VCG is open beyond 3 (Bogfjellmo & Marthinsen (2016), §5.2)."""
    defects = list(vcg_order_conditions(tableau).values())
    if abs(defects[0]) > tol:
        return 0
    if abs(defects[1]) > tol:
        return 1
    if max(abs(d) for d in defects[2:]) > tol:
        return 2
    return 3


def _is_symmetric_composition(tableau: tb.ButcherTableau) -> bool:
    """Whether the tableau is that of a composition of midpoint steps with palindromic
    weights (``a_ii = b_i/2``, ``a_ij = b_j`` for ``j < i``, ``0`` above, ``b`` a palindrome):
    then the VCG method is symmetric (the midpoint VCG is, Example 3.3)."""
    a, b = tableau.a, tableau.b
    want = np.tril(np.broadcast_to(b, a.shape), -1) + np.diag(b / 2)
    return bool(np.allclose(a, want, rtol=0, atol=1e-15) and np.allclose(b, b[::-1], rtol=0,
                                                                          atol=1e-15))


class VCG(AbstractTStarMethod):
    """Variational Crouch--Grossman method on ``T*G``, Bogfjellmo & Marthinsen (2016),
    eq. (18): symplectic for any tableau with nonzero weights.

    Parameters
    ----------
    tableau:
        A :class:`~vijax.tableaus.ButcherTableau` with every ``b_i ≠ 0``.
    solver:
        Root solver for the ``2 s d`` unknowns ``(ξ_i, M_i)``.  Default (``None``): the
        fixed-point iteration ``(ξ, M) ← Φ(ξ, M)`` of the paper (§6) run to round-off with at
        most 300 updates (:func:`~vijax.integrators.tstar.default_solver`);
        ``solver=vj.solvers.Newton()`` for stiff problems or large steps.
    order:
        The order, when known from elsewhere (a composition, see :meth:`composition`).
        Default: what the order conditions of §5.2 certify (at most 3,
        :func:`vcg_order`).

    Presets: :meth:`midpoint` (Table 2(a)), :meth:`triple_jump` (Table 2(b), order 4),
    :meth:`yoshida6` (Table 2(c), order 6); :meth:`composition` builds others.
    """

    tableau: tb.ButcherTableau
    solver: Optional[AbstractRootSolver]
    _order: int = eqx.field(static=True)

    def __init__(self, tableau: tb.ButcherTableau, solver: AbstractRootSolver | None = None,
                 order: int | None = None):
        check_weights(tableau, "VCG")
        certified = vcg_order(tableau)
        if certified == 0:
            raise ValueError(f"VCG: the tableau {tableau.name} is not consistent (sum b_i = "
                             f"{sum(tableau.b_)!r}, must be 1; Bogfjellmo & Marthinsen (2016), "
                             f"§5.2)")
        self.tableau = tableau
        self.solver = solver
        self._order = certified if order is None else int(order)

    # -- presets and composition ---------------------------------------------------------------
    @classmethod
    def midpoint(cls, **kwargs) -> "VCG":
        """Table 2(a): ``a = 1/2``, ``b = 1``; order 2, symmetric, identical to
        :meth:`vijax.integrators.tstar.VRKMK.midpoint` (Example 3.3)."""
        return cls(tb.gauss(1), **kwargs)

    @classmethod
    def composition(cls, weights: Sequence, base: "VCG | None" = None,
                    order: int | None = None, name: str | None = None, **kwargs) -> "VCG":
        """The VCG method of the composition ``Φ_{γ_m h} ∘ … ∘ Φ_{γ_1 h}`` of the ``base``
        method (default :meth:`midpoint`), by Lemma 5.4 of Bogfjellmo & Marthinsen (2016)
        (:func:`composition_tableau`).

        Its order (Hairer, Lubich & Wanner (2006), Thm II.4.1 and §V.3): the base order ``p``;
        ``p + 1`` if ``Σ γ_k^{p+1} = 0``, ``p + 2`` when moreover the base is symmetric and the
        weights a palindrome (a symmetric method has even order).  ``order`` declares a higher
        order known from the theory of compositions (Yoshida's sixth-order weights); the
        necessary conditions ``Σ γ_k^m = 0`` for odd ``m`` from ``p + 1`` to ``order − 1`` are
        checked."""
        base = cls.midpoint() if base is None else base
        p = base.order
        gam = [_fraction(w) for w in weights]
        palindrome = all(abs(float(x - y)) <= _TOL for x, y in zip(gam, gam[::-1]))
        symmetric = base.symmetric and palindrome

        def vanishes(m):
            return abs(float(sum(g**m for g in gam))) <= _TOL

        deduced = p
        if vanishes(p + 1):
            deduced = p + 2 if (symmetric and p % 2 == 0) else p + 1
        if order is not None:
            order = int(order)
            missing = [m for m in range(p + 1, order, 2) if not vanishes(m)]
            if symmetric and order > deduced and missing:
                raise ValueError(f"VCG.composition: order {order} needs sum gamma^m = 0 for "
                                 f"m = {missing}, which these weights do not satisfy")
        else:
            order = deduced
        tableau = composition_tableau([base.tableau] * len(gam), gam, name=name, order=order)
        kwargs.setdefault("solver", base.solver)
        return cls(tableau, order=order, **kwargs)

    @classmethod
    def triple_jump(cls, **kwargs) -> "VCG":
        """Table 2(b): the midpoint VCG composed with steps ``γ1 h, γ2 h, γ1 h``,
        ``γ1 = 1/(2 − 2^{1/3})``; order 4, symmetric."""
        return cls.composition(TRIPLE_JUMP, name="TripleJump(4)", **kwargs)

    @classmethod
    def yoshida6(cls, **kwargs) -> "VCG":
        """Table 2(c): the midpoint VCG composed with Yoshida's (1990) seven steps
        ``γ1 γ2 γ3 γ4 γ3 γ2 γ1``; order 6, symmetric."""
        return cls.composition(YOSHIDA6, order=6, name="Yoshida(6)", **kwargs)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        return [("VCG.midpoint()", cls.midpoint()), ("VCG.triple_jump()", cls.triple_jump()),
                ("VCG.yoshida6()", cls.yoshida6())]

    # -- traits -----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"VCG[{self.tableau.name}]"

    @property
    def symmetric(self) -> bool:
        """True for compositions of the midpoint VCG with palindromic weights (the midpoint,
        Table 2(b) and (c))."""
        return _is_symmetric_composition(self.tableau)

    # -- stepping -----------------------------------------------------------------------------
    def _coefficients(self, dtype):
        t = self.tableau
        ahat = tb.symplectic_conjugate(t).a
        return tuple(jnp.asarray(x, dtype) for x in (t.a, t.b, ahat.sum(axis=1)))

    def init(self, system: LieGroupSystem, t0: ScalarLike, q0, v0) -> TStarState:
        """State at ``t0`` from the group element ``q0`` and the **body** velocity ``v0``."""
        self.check_system(system)
        G = system.group
        v0 = jnp.asarray(v0)
        t0 = jnp.asarray(t0, v0.dtype)
        sys0 = system.at(t0)
        p0 = sys0.momentum(q0, v0)
        mu0 = to_spatial(G, q0, p0)
        xi0, n0 = spatial_field(sys0, q0, mu0)
        _, _, chat = self._coefficients(v0.dtype)
        s = self.stages
        # Predictor of the first step: ξ_i = ξ0, M_i = μ0 + h ĉ_i (n0 − ad*_{ξ0} μ0).
        rate = n0 - G.ad_star(xi0, mu0)
        stages = (jnp.broadcast_to(xi0, (s,) + xi0.shape), chat[:, None] * rate[None, :])
        return TStarState(t=t0, q=q0, p=p0, stages=stages)

    def step(self, system: LieGroupSystem, state: TStarState, h: ScalarLike, u=None
             ) -> tuple[TStarState, SolverStats]:
        self.check_system(system)
        G = system.group
        s = self.stages
        q0, p0 = state.q, state.p
        dtype = p0.dtype
        h = jnp.asarray(h, dtype)
        a, b, _ = self._coefficients(dtype)
        mu0 = to_spatial(G, q0, p0)
        force = self._force(system, state, h, u)
        # the stage times (the clock of a TimeDependentSystem)
        times = state.t + h * jnp.asarray(self.tableau.c, dtype)
        tmap = jax.tree_util.tree_map
        # Rows k = 1..s are the stages, row s+1 the update: q^j is the partial product of the
        # row b, Q_{kj} that of row k of a.
        abar = jnp.concatenate([a, b[None, :]], axis=0)               # (s+1, s)
        coeff = a.T * b[None, :] / b[:, None]                          # b_j a_ji / b_i at [i, j]
        compose = jax.vmap(G.compose)

        def update(z):
            XI, M = z
            X = h * abar[:, :, None] * XI[None, :, :]                  # h a_kj ξ_j, (s+1, s, d)
            E = jax.vmap(jax.vmap(G.exp))(X)

            def factor(P, Ej):                                         # Q_{kj} = E_kj Q_{k,j-1}
                P = compose(Ej, P)
                return P, P

            P0 = tmap(lambda x: jnp.broadcast_to(x, (s + 1,) + x.shape), q0)
            _, part = jax.lax.scan(factor, P0, tmap(lambda x: jnp.swapaxes(x, 0, 1), E))
            # part[j][k]: row k's product up to factor j
            Q = tmap(lambda x: x[-1, :s], part)
            q1 = tmap(lambda x: x[-1, s], part)
            xi, _, _, nbar = stage_field(system, Q, M, force, times)
            mubar1 = p0 + h * (b @ nbar)
            V = jnp.concatenate([nbar, mubar1[None, :]], axis=0)       # (s+1, d)

            # T[i, k] = dexp*_{h abar_ki ξ_i} Ad*_{(part[i][k])⁻¹} V_k
            def term(x, g, v):
                return dexp_star(G, x, G.Ad_star(G.inverse(g), v))

            T = jax.vmap(jax.vmap(term), in_axes=(1, 0, None))(X, part, V)   # (s, s+1, d)
            M_new = T[:, s] - h * jnp.einsum("ij,ijd->id", coeff, T[:, :s])
            return (xi, M_new), (q1, mubar1)

        def residual(z):
            new, aux = update(z)
            return tmap(lambda x, y: x - y, z, new), aux

        XIp, Dh = state.stages
        z0 = (XIp, mu0[None, :] + h * Dh)
        z, (q1, p1), stats = self._solver(dtype).solve(residual, z0, has_aux=True)
        XI, M = z
        stages = (XI, safe_div(M - mu0[None, :], h))
        new = TStarState(t=state.t + h, q=q1, p=p1, stages=stages)
        return new, stats

