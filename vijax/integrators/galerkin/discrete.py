"""Galerkin variational integrators with holonomic constraints.

The method of Wenger, Ober-Blöbaum & Leyendecker (2017); equation, table and theorem numbers
below are theirs.  On each step ``[t_k, t_k + h]`` the configuration is a polynomial ``q_d`` of
degree ``s`` through control points ``q_k^0..q_k^s`` (eq. (11)) and the multiplier a polynomial
``lam_d`` of degree ``w`` whose control points are the nodes of the constraint quadrature
(eq. (12), Theorem 1 condition 1).  The discrete augmented Lagrangian splits the action into
two quadratures (eqs. (13), (18)-(20)):

    Lbar_d = h sum_i b_i L(q_d(c_i h), qdot_d(c_i h)) - h sum_i e_i g(q_d(f_i h)) . lam_d(f_i h),

``(b, c)`` Gauss or Lobatto of order ``ordL`` for ``L`` and ``(e, f)`` Lobatto (``ordZ = 2w``,
stiffly accurate) or Gauss (``ordZ = 2w - 2``, not stiffly accurate) for the constraint.
Stationarity gives the discrete Euler--Lagrange equations (22); one step solves

    R0 = pi_k + D_1 Lbar_d - (sigma - 1) h e_1 G(q_k^0)^T lam_k^0      (momentum matching)
    R_nu = D_{nu+1} Lbar_d,  nu = 1..s-1                                  (interior points)
    0 = g(q_d(f_i h)),       i = 2..w+1  (Lobatto)  /  1..w-1  (Gauss)    (constraints)

for ``q_k^1..q_k^s`` and the multipliers (our one-step form of (22), see docs/holonomic.md).
``pi_{k+1} = D_{s+1} Lbar_d`` without the ``lam_k^w`` term is the incoming momentum of the
next step.  All derivatives of ``Lbar_d`` come from :func:`jax.grad`.

Two modes:

* ``"projected"`` (default): a one-step map on the hidden-constraint manifold,
  ``pi = p_k`` and ``sigma = 1``, then ``p_{k+1} = P(q_{k+1}) pi_{k+1}`` (projection (4)).  It
  gives the paper's ``q_k^0`` exactly and ``P p_k^0``, is symplectic on ``T^*C`` and time
  reversible on ``(q, p)``.
* ``"paper"``: the two-step scheme of the paper (``sigma = 2`` after the first step), whose raw
  Legendre momentum ``p_k^0`` and raw multiplier ``lam_k^0`` are available one step late
  (``state.p_raw``, ``state.lam_raw``).  ``s = w = 1`` with Lobatto ``r = 2`` is SHAKE.

In both modes the state's ``p`` is the projected momentum and ``lam`` the multiplier (70) at
``(q, p)``: the post-processing of the paper's §4.1, which lifts ``p`` and ``lam`` to the
order of ``q``.
"""

from __future__ import annotations

import warnings
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ... import constraints as cons
from ..._linalg import mm
from ..._typing import DenseLayout, ScalarLike, Stages, Vector
from ...quadrature import (
    gauss_quadrature,
    lagrange_derivative_matrix,
    lagrange_extrapolation_matrix,
    lobatto_quadrature,
)
from ...solvers import AbstractRootSolver, SolverStats
from ...systems import ForcedSystem, HolonomicSystem, LagrangianSystem, TimeDependentSystem
from .._base import AbstractDenseIntegrator, AbstractIntegrator, AbstractState, with_fields
from .._forcing import end_force
from ..vprk import at_nodes

__all__ = ["GalerkinState", "GalerkinVI"]


class GalerkinState(AbstractState):
    """Node values and what the next step needs.

    ``q, p, v, lam``: node configuration, projected momentum, velocity and multiplier (70).
    ``pi``: incoming momentum of the next step (equals ``p`` in projected mode).
    ``first``: 1 before the first step (the paper mode's ``sigma = 1``), 0 afterwards.
    ``p_raw, lam_raw``: paper mode's raw ``p_k^0`` and ``lam_k^0`` at the *previous* node
    (they need step ``k``'s solve: the node multiplier ``lam_k^0`` is shared by steps ``k - 1``
    and ``k``, and only step ``k`` determines it).  ``controls, mults``: the last step's
    control points (as ``(q^nu - q^0)/h``) and multipliers, for the predictor.
    """

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    v: Float[Array, " n"]
    lam: Float[Array, " m"]
    pi: Float[Array, " n"]
    first: Float[Array, ""]
    p_raw: Float[Array, " n"]
    lam_raw: Float[Array, " m"]
    controls: Float[Array, "s1 n"]
    mults: Float[Array, "z m"]

    def step_momenta(self):
        """``p`` (projected mode) and ``pi`` (paper mode, the incoming momentum of eq. (22)):
        the step reads whichever its mode uses."""
        return (self.p, self.pi)


def _q_order(s: int, w: int, ordL: int) -> int:
    """``ord(q)`` read off Tables 1-2 of Wenger et al. (2017) (Lobatto constraint quadrature).

    Shaded cells (``s = w`` or ``s = w + 1``): ``min(2s, ordL, 2w)`` (the rule of their §4.1).
    Each further degree of ``s`` beyond ``w + 1`` costs two orders, with a floor of 2 (our
    reading of the unshaded cells).
    """
    return max(2, min(2 * s, ordL, 2 * w) - 2 * max(0, s - w - 1))


class GalerkinVI(AbstractDenseIntegrator):
    """Constrained Galerkin variational integrator ``(s, w, ordL, ordZ)``.

    Wenger, Ober-Blöbaum & Leyendecker (2017); theorem and equation numbers below are theirs.

    Parameters
    ----------
    s:
        Degree of the configuration polynomial (``s >= 1``).
    w:
        Degree of the multiplier polynomial (default ``s``).  Theorem 1 condition 2 needs
        ``w <= s`` (Lobatto constraint quadrature) or ``w <= s + 1`` (Gauss).
    quadrature:
        ``"gauss"`` (``r = ordL / 2`` nodes) or ``"lobatto"`` (``r = ordL / 2 + 1``) for the
        Lagrangian.
    ordL:
        Order of the Lagrangian quadrature; default the smallest one giving ``ord(q) = 2s``:
        ``2s`` (Gauss ``r = s``, Lobatto ``r = s + 1``).  ``ordL < 2s`` (Gauss) or
        ``< 2s - 2`` (Lobatto), i.e. fewer than ``s`` nodes, is refused (Assumption 1).
    constraint_quadrature:
        ``"lobatto"`` (default; ``ordZ = 2w``, stiffly accurate) or ``"gauss"``
        (``ordZ = 2w - 2``; legal but not stiffly accurate: ``q_k`` drifts off ``g = 0``).
    ordZ:
        Optional check: must equal the order implied by ``w`` and ``constraint_quadrature``
        (the multiplier control points *are* the constraint nodes, condition 1).
    mode:
        ``"projected"`` (default, one-step map on ``T^*C``) or ``"paper"`` (the paper's
        unprojected two-step scheme); see the module docstring.
    control_points:
        Interior control points of ``q_d``: ``"lobatto"`` (default) or ``"equidistant"``.  The
        nodal solution does not depend on them (they only choose a basis of the same
        polynomials; the constraints are imposed at the multiplier nodes); only conditioning
        does.
    solver:
        Root solver for the step equations (default
        :func:`vijax.constraints.default_solver`, a fixed point preconditioned by the
        approximate inverse Jacobian of :meth:`_precond`; use :class:`~vijax.solvers.Newton`
        for stiff problems).

    Presets: :meth:`gauss` and :meth:`lobatto` (``s = w``, order ``2s``), :meth:`rattle`,
    :meth:`shake`, :meth:`lobatto_iiia_iiib` (``w = s - 1``, ``r = s``, order ``2s - 2``).

    Without ``holonomic`` in the system this is the unconstrained Galerkin variational
    integrator of order ``min(2s, ordL)``.
    """

    s: int = eqx.field(static=True)
    w: int = eqx.field(static=True)
    quadrature: str = eqx.field(static=True)
    ordL: int = eqx.field(static=True)
    constraint_quadrature: str = eqx.field(static=True)
    mode: str = eqx.field(static=True)
    control_points: str = eqx.field(static=True)
    solver: AbstractRootSolver
    retrace: bool = eqx.field(static=True, default=False)   # see retracing

    symplectic = True
    supported = frozenset({HolonomicSystem, ForcedSystem, TimeDependentSystem})

    def __init__(self, s: int, w: int | None = None, *,
                 quadrature: Literal["gauss", "lobatto"] = "gauss", ordL: int | None = None,
                 constraint_quadrature: Literal["lobatto", "gauss"] = "lobatto",
                 ordZ: int | None = None, mode: Literal["projected", "paper"] = "projected",
                 control_points: Literal["lobatto", "equidistant"] = "lobatto",
                 solver: AbstractRootSolver | None = None):
        w = s if w is None else w
        for name, val in (("s", s), ("w", w)):
            if not isinstance(val, (int, np.integer)) or val < 1:
                raise ValueError(f"GalerkinVI needs an integer {name} >= 1, got {val!r}.")
        s, w = int(s), int(w)
        if quadrature not in ("gauss", "lobatto"):
            raise ValueError(f"quadrature must be 'gauss' or 'lobatto', got {quadrature!r}.")
        if constraint_quadrature not in ("lobatto", "gauss"):
            raise ValueError("constraint_quadrature must be 'lobatto' or 'gauss', got "
                             f"{constraint_quadrature!r}.")
        if mode not in ("projected", "paper"):
            raise ValueError(f"mode must be 'projected' or 'paper', got {mode!r}.")
        if control_points not in ("lobatto", "equidistant"):
            raise ValueError("control_points must be 'lobatto' or 'equidistant', got "
                             f"{control_points!r}.")
        if ordL is None:
            ordL = 2 * s
        if not isinstance(ordL, (int, np.integer)) or ordL < 2 or ordL % 2:
            raise ValueError(f"ordL must be an even integer >= 2, got {ordL!r}.")
        r = ordL // 2 if quadrature == "gauss" else ordL // 2 + 1
        if r < s:
            least = 2 * s if quadrature == "gauss" else max(2, 2 * s - 2)
            raise ValueError(
                f"{quadrature} quadrature of order ordL={ordL} has r={r} nodes, fewer than the "
                f"degree s={s}: the Lagrangian quadrature needs at least s nodes, otherwise the "
                f"discrete Lagrangian flow is not well defined. Use ordL >= {least}.")
        if constraint_quadrature == "lobatto":
            if w > s:
                raise ValueError(
                    f"w <= s is required with Lobatto constraint quadrature (got w={w}, s={s}): "
                    f"otherwise the step equations are rank deficient (the Newton matrix is "
                    f"singular). Use w <= s.")
            implied = 2 * w
        else:
            if w < 2:
                raise ValueError("Gauss constraint quadrature uses w - 1 nodes: it needs w >= 2.")
            if w > s + 1:
                raise ValueError(
                    f"w <= s + 1 is required with Gauss constraint quadrature (got w={w} > "
                    f"s+1={s + 1}): otherwise the step equations are rank deficient. Use "
                    f"w <= s + 1.")
            implied = 2 * (w - 1)
            warnings.warn(
                "Gauss constraint quadrature has no node at the end of the step (f_z < 1):"
                " the scheme is solvable but not stiffly accurate, so the nodes drift off "
                "g = 0. Use constraint_quadrature='lobatto'.", stacklevel=2)
        if ordZ is not None and ordZ != implied:
            raise ValueError(
                f"The multiplier control points must be the constraint quadrature nodes, so "
                f"w={w} with {constraint_quadrature} gives ordZ={implied}, not {ordZ}. "
                f"Change w instead.")
        if constraint_quadrature == "lobatto" and s >= w + 2 and w >= 2:
            warnings.warn(
                f"s={s} >= w+2={w + 2}: solvable but with order reduction in q, p and lam, and "
                f"lam may diverge. Use w = s or w = s - 1.", stacklevel=2)
        self.s, self.w, self.quadrature, self.ordL = s, w, quadrature, int(ordL)
        self.constraint_quadrature, self.mode = constraint_quadrature, mode
        self.control_points = control_points
        self.solver = cons.default_solver() if solver is None else solver

    # -- presets ----------------------------------------------------------------------------
    @classmethod
    def gauss(cls, s: int, **kwargs) -> GalerkinVI:
        """``s = w``, Gauss ``r = s`` for ``L``: order ``2s`` (the (s,s)-Gauss--Lobatto SPARK of
        Jay (2007) with the projection; Wenger et al. (2017), §3.5)."""
        return cls(s, s, quadrature="gauss", **kwargs)

    @classmethod
    def lobatto(cls, s: int, **kwargs) -> GalerkinVI:
        """``s = w``, Lobatto ``r = s + 1`` for ``L``: order ``2s``."""
        return cls(s, s, quadrature="lobatto", **kwargs)

    @classmethod
    def lobatto_iiia_iiib(cls, s: int, **kwargs) -> GalerkinVI:
        """``w = s - 1``, Lobatto ``r = s`` for ``L`` and ``g``: constrained Lobatto
        IIIA--IIIB with ``s`` stages, order ``2s - 2`` (Wenger et al. (2017), §3.5)."""
        if s < 2:
            raise ValueError(f"Lobatto IIIA-IIIB needs s >= 2 stages, got {s}.")
        return cls(s, s - 1, quadrature="lobatto", ordL=2 * s - 2, **kwargs)

    @classmethod
    def rattle(cls, **kwargs) -> GalerkinVI:
        """RATTLE: ``s = w = 1``, trapezoidal ``L`` and ``g``, projected (Wenger et al. (2017),
        §2.2)."""
        return cls(1, 1, quadrature="lobatto", ordL=2, mode="projected", **kwargs)

    @classmethod
    def shake(cls, **kwargs) -> GalerkinVI:
        """SHAKE: ``s = w = 1``, trapezoidal ``L`` and ``g``, unprojected (Wenger et al. (2017),
        eq. (10)).

        Its configurations are RATTLE's; its raw momentum (``state.p_raw``) is not on the
        hidden constraint."""
        return cls(1, 1, quadrature="lobatto", ordL=2, mode="paper", **kwargs)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        out = [(f"GalerkinVI.gauss({s})", cls.gauss(s)) for s in (1, 2, 3, 4)]
        out += [(f"GalerkinVI.lobatto({s})", cls.lobatto(s)) for s in (2, 3, 4)]
        return out + [("GalerkinVI.rattle()", cls.rattle()), ("GalerkinVI.shake()", cls.shake())]

    # -- traits -----------------------------------------------------------------------------
    @property
    def order(self) -> int:
        """Order of ``q`` (and of the post-processed ``p`` and ``lam``), Wenger et al. (2017),
        Tables 1-2.

        For Gauss constraint quadrature the tables give no order; the value returned is the
        one measured in ``tests/test_galerkin.py`` (2)."""
        if self.constraint_quadrature == "gauss":
            return 2
        return _q_order(self.s, self.w, self.ordL)

    @property
    def name(self) -> str:
        if (self.s, self.w, self.quadrature, self.ordL) == (1, 1, "lobatto", 2):
            return "SHAKE" if self.mode == "paper" else "RATTLE"
        tag = "G" if self.quadrature == "gauss" else "L"
        z = "" if self.constraint_quadrature == "lobatto" else ", gauss g"
        return f"GalerkinVI(s={self.s}, w={self.w}, ordL={self.ordL}{tag}{z}, {self.mode})"

    @property
    def stages(self) -> int:
        """Unknown control points per step (``q_k^1..q_k^s``)."""
        return self.s

    @property
    def lagrangian_nodes(self) -> int:
        """``r``, the number of nodes of the Lagrangian quadrature."""
        return self.ordL // 2 + (self.quadrature == "lobatto")

    # -- coefficients -------------------------------------------------------------------------
    def _rules(self):
        """Numpy coefficient tables (float64): control points ``d``, ``L`` rule ``(c, b)``,
        constraint rule ``(f, e)`` and the basis at the nodes (values and derivatives)."""
        s = self.s
        if self.control_points == "lobatto":
            d = lobatto_quadrature(s + 1)[0] if s >= 1 else np.zeros(1)
        else:
            d = np.linspace(0.0, 1.0, s + 1)
        r = self.lagrangian_nodes
        c, b = gauss_quadrature(r) if self.quadrature == "gauss" else lobatto_quadrature(r)
        if self.constraint_quadrature == "lobatto":
            f, e = lobatto_quadrature(self.w + 1)
        else:
            f, e = gauss_quadrature(self.w - 1)
        return dict(
            d=d, c=c, b=b, f=f, e=e,
            lc=lagrange_extrapolation_matrix(d, c), dc=lagrange_derivative_matrix(d, c),
            lf=lagrange_extrapolation_matrix(d, f),
            d1=lagrange_derivative_matrix(d, np.ones(1))[0], dd=lagrange_derivative_matrix(d, d),
            extrap=lagrange_extrapolation_matrix(d, 1.0 + d),
        )

    def _consts(self, dtype):
        return {k: jnp.asarray(v, dtype) for k, v in self._rules().items()}

    @property
    def _lobatto_g(self) -> bool:
        return self.constraint_quadrature == "lobatto"

    def _n_mults(self) -> int:
        """Multiplier unknowns per step: ``w`` (Lobatto: ``lam^0..lam^{w-1}``) or ``w - 1``."""
        return self.w if self._lobatto_g else self.w - 1

    # -- the discrete augmented Lagrangian -------------------------------------------------------
    def discrete_lagrangian(self, system, q0, Z, lam, h, t0=None):
        """``Lbar_d / h`` of Wenger et al. (2017), eq. (13), at control points
        ``q^nu = q0 + h Z_nu`` (``Z`` of shape ``(s + 1, n)``, ``Z_0 = 0``) and constraint-node
        multipliers ``lam`` (shape ``(z, m)``).  Its gradient in ``Z`` is
        ``(D_1 .. D_{s+1}) Lbar_d``.  ``t0``: the step's start time, at which a
        :class:`vijax.TimeDependentSystem` is evaluated at the nodes ``t0 + c_i h``."""
        k = self._consts(q0.dtype)
        Q = q0[None, :] + h * mm(k["lc"], Z)
        V = mm(k["dc"], Z)
        times = None if t0 is None else t0 + h * k["c"]
        val = mm(k["b"], at_nodes(system, times, lambda sys, x, y: sys.lagrangian(x, y), Q, V))
        if isinstance(system, HolonomicSystem):
            gq = self._constraints(system, q0, Z, h, t0, k["lf"], k["f"])
            val = val - jnp.sum(k["e"][:, None] * gq * lam)
        return val

    @staticmethod
    def _constraints(system, q0, Z, h, t0, lf, f):
        """``g`` at the constraint nodes ``q0 + h lf Z`` (nodes ``f`` of the step) and their
        times ``t0 + f h`` (read by a rheonomic constraint)."""
        times = None if t0 is None else t0 + h * f
        return at_nodes(system, times, lambda sy, x: sy.holonomic(x), q0[None, :] + h * mm(lf, Z))

    def _node_multipliers(self, mu, h, m, dtype):
        """Multipliers at the constraint nodes from the unknowns ``mu = h lam``: Lobatto's last
        node ``lam_k^w`` belongs to the next step and is set to zero here."""
        lam = mu / h
        if self._lobatto_g:
            lam = jnp.concatenate([lam, jnp.zeros((1, m), dtype)])
        return lam

    def _shares_node_multiplier(self, system) -> bool:
        """Paper mode with Lobatto constraint nodes: the node multiplier ``lam_k^0`` is
        shared with the previous interval: it enters the momentum matching with weight
        ``2 h e_1`` (``h e_1`` at the first step), and the raw momentum lags one step."""
        return self.mode == "paper" and self._lobatto_g and isinstance(system, HolonomicSystem)

    @property
    def symmetric(self) -> bool:
        """The projected mode with Lobatto constraint nodes is time reversible on ``(q, p)``
        (its quadratures and control points are symmetric; tested in
        ``tests/test_galerkin.py``); the paper mode is a two-step scheme."""
        return self.mode == "projected" and self._lobatto_g

    def force_nodes(self) -> np.ndarray:
        """The nodes ``c_i`` of the Lagrangian quadrature."""
        return np.asarray(self._rules()["c"], dtype=np.float64)

    def force_weights(self) -> np.ndarray:
        """The weights ``b_i`` of the Lagrangian quadrature."""
        return np.asarray(self._rules()["b"], dtype=np.float64)

    def _equations(self, system, state, h, X, G0=None, force=None):
        """Residuals of our one-step form of eqs. (22) of Wenger et al. (2017) (scaled to O(1)
        blocks) and the next incoming momentum.
        ``G0 = G(q_k)``, given when :meth:`_shares_node_multiplier` (evaluated once per step,
        outside the Newton iteration).  ``force`` (a :class:`vijax.ForcedSystem`): the virtual
        work ``h sum_i b_i F_i . δq_d(c_i h)`` of the discrete Lagrange--d'Alembert principle
        joins ``D_nu Lbar_d`` (the forced Galerkin scheme of Ober-Blöbaum, Junge & Marsden
        (2011), with this method's Lagrangian quadrature)."""
        Zs, mu = X
        q0 = state.q
        dtype = q0.dtype
        n = q0.shape[0]
        constrained = isinstance(system, HolonomicSystem)
        m = mu.shape[-1]
        Z = jnp.concatenate([jnp.zeros((1, n), dtype), Zs])
        lam = self._node_multipliers(mu, h, m, dtype)
        grad = jax.grad(self.discrete_lagrangian, argnums=2)(system, q0, Z, lam, h, state.t)
        k = self._consts(dtype)
        if force is not None:
            F = force(q0[None, :] + h * mm(k["lc"], Z), mm(k["dc"], Z))
            grad = grad + h * mm((k["lc"] * k["b"][:, None]).T, F)
        # Projected mode: a one-step map of (q, p); paper mode: the carried partial momentum.
        pi_in = state.p if self.mode == "projected" else state.pi
        r0 = pi_in + grad[0]
        rows = [r0, grad[1:self.s]]
        if constrained:
            first = 1 if self._lobatto_g else 0
            if self._lobatto_g and G0 is not None:  # paper mode, after the first step
                rows[0] = r0 - (1.0 - state.first) * k["e"][0] * (G0.T @ mu[0])
            rows.append(self._constraints(system, q0, Z, h, state.t, k["lf"][first:],
                                          k["f"][first:]) / h)
        return rows, grad[self.s]

    def _precond(self, system, state, h, X0):
        """Approximate inverse Jacobian of :meth:`_equations` at the predictor ``X0``.

        Rows ``r_nu`` against ``Z_mu``: ``K = sum_i b_i dc_i,nu dc_i,mu`` times the velocity
        Hessian at the step start (``nu < s``, ``mu >= 1``); against ``mu_i`` (``lam_i h``):
        ``B = -e_i lf_i,nu`` times ``G_i^T`` (plus ``-e_1`` for the shared node multiplier of
        paper mode); constraint rows ``g(q_d(f_l h)) / h`` against ``Z_mu``: ``C = lf_l,mu``
        times ``G_l``.  The ``G`` are taken at the predicted constraint nodes; the O(h) force
        and curvature terms are dropped (:func:`vijax.constraints.saddle_point_inverse`)."""
        rules = self._rules()
        s, dtype = self.s, state.q.dtype
        dc, b, e, lf = rules["dc"], rules["b"], rules["e"], rules["lf"]
        K = (dc.T * b) @ dc
        K = K[:s, 1:]
        if not isinstance(system, HolonomicSystem):
            k_inv = jnp.asarray(np.linalg.inv(K), dtype)
            h_inv = system.at(state.t).inverse_velocity_hessian(state.q, state.v)
            return lambda r: (mm(mm(k_inv, jnp.concatenate([r[0][None], r[1]])), h_inv.T),
                              jnp.zeros_like(X0[1]))
        z = self._n_mults()
        B = -(lf[:z, :s] * e[:z, None]).T
        if self._shares_node_multiplier(system):
            B = jnp.asarray(B, dtype).at[0, 0].add(-(1.0 - state.first) * e[0])
        c_rows = lf[1:] if self._lobatto_g else lf
        Zs0 = X0[0]
        Z0 = jnp.concatenate([jnp.zeros_like(Zs0[:1]), Zs0])
        G = jax.vmap(lambda x: cons.constraint_jacobian(system.at(state.t), x))(
            state.q[None, :] + h * mm(jnp.asarray(lf, dtype), Z0))
        apply = cons.saddle_point_inverse(system.at(state.t), state.q, state.v, K, B, c_rows[:, 1:],
                                          G[:z], G[1:] if self._lobatto_g else G)
        return lambda r: apply(jnp.concatenate([r[0][None], r[1]]), r[2])

    # -- the integrator contract ------------------------------------------------------------------
    def check_initial(self, system: LagrangianSystem, q0: Vector, v0: Vector, tol: float
                      ) -> tuple[Vector, Vector]:
        if isinstance(system, HolonomicSystem):
            return cons.check_consistent(system, q0, v0, tol)
        return q0, v0

    def _multiplier(self, system, q, v, force=None):
        if isinstance(system, HolonomicSystem):
            return cons.multiplier(system, q, v, force)
        return jnp.zeros((0,), q.dtype)

    def init(self, system: LagrangianSystem, t0: ScalarLike, q0: Vector, v0: Vector) -> GalerkinState:
        t0 = jnp.asarray(t0, q0.dtype)
        lam0 = self._multiplier(system.at(t0), q0, v0)
        p0 = system.at(t0).momentum(q0, v0)
        d = jnp.asarray(self._rules()["d"], q0.dtype)
        return GalerkinState(
            t=t0, q=q0, p=p0, v=v0, lam=lam0, pi=p0,
            first=jnp.ones((), q0.dtype), p_raw=p0, lam_raw=lam0,
            controls=d[:, None] * v0[None, :], mults=jnp.broadcast_to(lam0, (self._n_mults(),) + lam0.shape),
        )

    def retracing(self) -> "GalerkinVI":
        return with_fields(self, retrace=True, solver=with_fields(self.solver, min_steps=1))

    def step(self, system: LagrangianSystem, state: GalerkinState, h: ScalarLike, u=None
             ) -> tuple[GalerkinState, SolverStats]:
        dtype = state.q.dtype
        k = self._consts(dtype)
        force = self._force(system, state, h, u)
        Zprev = state.controls
        if self.retrace:
            # state reached by the step with -h, whose control points are this step's in
            # reverse order: Z^v = (q^v - q^0) / h = Zb^s - Zb^(s - v) from its own Zb (the
            # multipliers as the predictor has them: the one at the step's start node is
            # not carried)
            X0 = ((Zprev[-1][None, :] - Zprev[::-1])[1:], h * state.mults)
        else:
            # Predictor: the previous step's polynomial extrapolated.
            Z0 = mm(k["extrap"], Zprev) - Zprev[-1][None, :]
            X0 = (Z0[1:], h * state.mults)
        G0 = (cons.constraint_jacobian(system.at(state.t), state.q)
              if self._shares_node_multiplier(system) else None)
        # pi_{k+1} from the last residual evaluation: no evaluation after the solve.
        # The constraint rows g/h carry round-off eps |q| / h (see cons.row_round_off).
        stall = (cons.row_round_off(state.q, h, self.stages)
                 if isinstance(system, HolonomicSystem) else None)
        X, pi1, stats = self.solver.solve(lambda X: self._equations(system, state, h, X, G0,
                                                                    force),
                                          X0, self._precond(system, state, h, X0),
                                          has_aux=True, stall_level=stall)
        Zs, mu = X
        q1 = state.q + h * Zs[-1]
        v_guess = k["d1"] @ jnp.concatenate([jnp.zeros_like(Zs[:1]), Zs])
        at_t1 = system.at(state.t + h)
        if isinstance(system, HolonomicSystem):
            p1 = cons.project_momentum(at_t1, q1, pi1, v_guess)
        else:
            p1 = pi1
        v1 = at_t1.velocity(q1, p1, v_guess)
        lams = mu / h
        if G0 is not None:
            p_raw = state.pi - (1.0 - state.first) * k["e"][0] * (G0.T @ mu[0])
            lam_raw = lams[0]
        elif self.mode == "paper":
            p_raw, lam_raw = state.pi, state.lam
        else:
            p_raw, lam_raw = state.p, state.lam
        new = GalerkinState(
            t=state.t + h, q=q1, p=p1, v=v1,
            lam=self._multiplier(at_t1, q1, v1,
                                 end_force(system, state.t, h, self.force_nodes(), u, q1, v1)),
            pi=pi1 if self.mode == "paper" else p1, first=jnp.zeros((), dtype),
            p_raw=p_raw, lam_raw=lam_raw,
            controls=jnp.concatenate([jnp.zeros_like(Zs[:1]), Zs]), mults=lams,
        )
        return new, stats

    def velocity(self, system: LagrangianSystem, state: GalerkinState) -> Vector:
        return state.v

    # -- dense output ---------------------------------------------------------------------------
    def dense_layout(self, system: LagrangianSystem) -> DenseLayout:
        """``q``, ``v`` and ``p`` at the control points: ``q_d`` itself, its derivative and the
        Legendre map of both, each passing through the node values (``p``, ``v``: the
        post-processed ones) at the grid points."""
        d = tuple(float(x) for x in self._rules()["d"])
        return {name: (d, "node", True) for name in ("q", "v", "p")}

    def dense_knots(self, system: LagrangianSystem, state: AbstractState
                    ) -> dict[str, Vector]:
        return {"q": state.q, "v": state.v, "p": state.p}

    def dense_interval(self, system: LagrangianSystem, prev: AbstractState,
                       new: AbstractState, h: ScalarLike) -> dict[str, Stages]:
        Z = new.controls  # (q^nu - q^0) / h
        q = prev.q[None, :] + h * Z
        rules = self._rules()
        v = jnp.asarray(rules["dd"], Z.dtype) @ Z
        times = prev.t + h * jnp.asarray(rules["d"], Z.dtype)
        return {"q": q, "v": v, "p": at_nodes(system, times, lambda s, x, y: s.momentum(x, y), q, v)}
