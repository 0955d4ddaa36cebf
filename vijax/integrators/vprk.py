"""Variational partitioned Runge--Kutta integrators.

Martín de Diego & Sato Martín de Almagro (2022), §4.2: stationarity of the discrete
Hamilton--Pontryagin action (their eq. (8)) gives, per step (Thm 4.2, eq. (9)),

    Q^i = q_k + h sum_j a_ij V^j,          P^i = p_k + h sum_j â_ij W^j,
    W^i = D1L(Q^i, V^i),                    P^i = D2L(Q^i, V^i),
    q_{k+1} = q_k + h sum_j b_j V^j,        p_{k+1} = p_k + h sum_j b_j W^j,

with ``(a, b)`` any Runge--Kutta tableau and ``(â, b)`` its symplectic conjugate
``b_i â_ij + b_j a_ji = b_i b_j``.  The unknowns are the stage velocities ``V`` (``s n``
equations ``D2L(Q^i, V^i) - P^i = 0``).  The map ``(q_k, p_k) -> (q_{k+1}, p_{k+1})`` is
symplectic, and its order is that of the tableau: ``2s`` for Gauss, ``2s - 2`` for
Lobatto IIIA--IIIB.

With a :class:`vijax.ForcedSystem` the discrete Lagrange--d'Alembert principle adds the
stage forces, ``W^i = D1L(Q^i, V^i) + F(t_k + c_i h, Q^i, V^i, U^i)`` (Ober-Blöbaum, Junge &
Marsden (2011); the high-order form of Campos, Ober-Blöbaum & Trélat (2015)): the same order,
the energy balance of the forced system instead of conservation.  A
:class:`vijax.TimeDependentSystem` is evaluated at the stage times, ``D1L``, ``D2L`` on
``L(t_k + c_i h, ·, ·)``: the discrete Lagrangian ``h Σ b_i L(t_k + c_i h, Q^i, V^i)`` of a
time-dependent system (Marsden & West (2001), Part 4, time-dependent mechanics), again of the tableau's order.
"""


import functools
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from equinox import AbstractVar
from jaxtyping import Array, Float

from .. import tableaus as tb
from .._linalg import mm
from .._typing import DenseLayout, ScalarLike, Stages, Vector
from ..quadrature import (
    integration_matrix,
    lagrange_extrapolation_matrix,
    lobatto_quadrature,
)
from ..solvers import AbstractRootSolver, FixedPoint, SolverStats, StartAsRoot
from ..systems import ForcedSystem, LagrangianSystem, MechanicalSystem, TimeDependentSystem
from ._base import AbstractDenseIntegrator, AbstractIntegrator, AbstractState, with_fields
from ._prk_core import (Misses, at_nodes, extrapolate, extrapolation, free_precond,
                        momentum_coupling, stage_equations, vector_space)

__all__ = ["AbstractPRK", "VPRK", "VPRKState", "stage_values", "at_nodes"]

_CONJUGACY_TOL = 1e-12


class VPRKState(AbstractState):
    """``(t, q, p)`` plus the last step's stage velocities ``V^i`` and stage forces
    ``W^i = D1L(Q^i, V^i)`` (the next step's predictor and the step's dense output), and the
    predictor's misses on the unknowns of the last two steps
    (:class:`vijax.integrators._prk_core.Misses`; empty unless
    :meth:`VPRK._carries_misses`)."""

    t: Float[Array, ""]
    q: Float[Array, " n"]
    p: Float[Array, " n"]
    stages: Float[Array, "s n"]
    forces: Float[Array, "s n"]
    misses: Misses


def stage_values(system, a, q, h, V, force=None, times=None):
    """Stage positions ``Q^i = q + h sum_j a_ij V^j`` and ``(D1L + F, D2L)`` at
    ``(Q^i, V^i)`` (Martín de Diego & Sato Martín de Almagro (2022), eqs. (9) and (13)): the
    part every VPRK variant shares.  ``force`` (from :func:`._forcing.stage_force`) adds the
    stage forces of the discrete Lagrange--d'Alembert principle to ``D1L``: the forced PRK
    of Ober-Blöbaum, Junge & Marsden (2011), whose order is the tableau's.  ``times`` (the
    stage times ``t_k + c_i h``) evaluates the derivatives of a
    :class:`vijax.TimeDependentSystem` on ``system.at(t_k + c_i h)``."""
    Q = q[None, :] + h * mm(a, V)
    D1, D2 = at_nodes(system, times, lambda sys, x, y: sys.derivatives(x, y), Q, V)
    if force is not None:
        D1 = D1 + force(Q, V)
    return Q, D1, D2


def _as_pair(tableau) -> tb.PartitionedTableau:
    if isinstance(tableau, tb.PartitionedTableau):
        defect = tableau.symplectic_defect()
        if not defect <= _CONJUGACY_TOL:
            raise ValueError(
                f"VPRK needs a symplectic-conjugate pair (b_i â_ij + b_j a_ji = b_i b_j, "
                f"b̂ = b), but {tableau.name} has defect {defect:.2e}. Pass a single "
                f"tableau (its conjugate is computed) or build the pair with "
                f"vijax.tableaus.symplectic_pair(tableau)."
            )
        return tableau
    if isinstance(tableau, tb.ButcherTableau):
        return tb.symplectic_pair(tableau)
    raise TypeError(
        f"VPRK expects a vijax.tableaus.ButcherTableau or PartitionedTableau, got "
        f"{type(tableau).__name__}; e.g. VPRK(vijax.tableaus.gauss(2))."
    )


class PRKTraits:
    """The traits every PRK family reads off its tableau pair ``self.tableau`` (the
    vector-space families through :class:`AbstractPRK`, and :class:`vijax.GroupVPRK`)."""

    @property
    def order(self) -> int:
        return self.tableau.order

    @property
    def stages(self) -> int:
        return self.tableau.q.stages

    def force_nodes(self) -> np.ndarray:
        """The stage nodes ``c_i`` of the ``q``-tableau: the stage forces act at
        ``(t_k + c_i h, Q^i, V^i)``."""
        return np.asarray(self.tableau.q.c, dtype=np.float64)

    def force_weights(self) -> np.ndarray:
        """The weights ``b_i`` of the ``q``-tableau."""
        return np.asarray(self.tableau.q.b, dtype=np.float64)

    def _stage_times(self, t, h):
        """``t_k + c_i h``: where a :class:`vijax.TimeDependentSystem` is evaluated."""
        return t + h * jnp.asarray(self.tableau.q.c, t.dtype)

    def _coefficients(self, dtype):
        """``(a, â, b)`` cast to the working dtype (constants in compiled code)."""
        q, p = self.tableau.q, self.tableau.p
        return tuple(jnp.asarray(x, dtype) for x in (q.a, p.a, q.b))


class AbstractPRK(PRKTraits, AbstractDenseIntegrator):
    """Shared traits of the partitioned Runge--Kutta families (VPRK and its constrained
    variants): a symplectic-conjugate tableau pair, a root solver, and dense output from the
    collocation polynomial of the stage velocities.

    Dense output: when the ``q``-tableau is a collocation method (``a_ij = ∫_0^{c_i} l_j``:
    Gauss, Lobatto IIIA), ``q(t_k + τh) = q_k + h Σ_j (∫_0^τ l_j) V^j`` is the step's
    collocation polynomial (degree ``s``; it passes through every stage ``Q^i`` and through
    ``q_{k+1}``), ``v`` is ``Σ_j l_j(τ) V^j`` and ``p`` the Legendre map of both, the last two
    taking the node values at the grid points.  States carry the stage velocities
    (``stages``) of the step that ended at them."""

    tableau: AbstractVar[tb.PartitionedTableau]
    solver: AbstractVar[AbstractRootSolver]

    @property
    def symmetric(self) -> bool:
        """Both tableaus symmetric, ``a_ij + a_{s+1-i, s+1-j} = b_j`` and
        ``b_j = b_{s+1-j}`` (Gauss, Lobatto IIIA--IIIB; Hairer, Lubich & Wanner (2006),
        Thm V.2.3)."""
        def sym(t):
            a, b = np.asarray(t.a, float), np.asarray(t.b, float)
            return (np.allclose(a + a[::-1, ::-1], b[None, :], atol=1e-12)
                    and np.allclose(b, b[::-1], atol=1e-12))
        return sym(self.tableau.q) and sym(self.tableau.p)

    # -- dense output ----------------------------------------------------------------------
    def _dense_nodes(self) -> np.ndarray:
        tq = self.tableau.q
        c = np.asarray(tq.c)
        if len(set(tq.c_)) < tq.stages or not np.allclose(integration_matrix(c, c), tq.a,
                                                          atol=1e-12):
            raise ValueError(
                f"dense output needs a collocation q-tableau (distinct nodes c and "
                f"a_ij = ∫_0^(c_i) l_j, as Gauss and Lobatto IIIA); {self.tableau.name} is not "
                f"one. Use simulate(..., dense=False) or a Gauss/Lobatto preset.")
        return lobatto_quadrature(self.stages + 1)[0]

    def dense_layout(self, system: LagrangianSystem) -> DenseLayout:
        nodes = tuple(float(x) for x in self._dense_nodes())
        return {name: (nodes, "node", True) for name in ("q", "v", "p")}

    def dense_knots(self, system: LagrangianSystem, state: AbstractState
                    ) -> dict[str, Vector]:
        return {"q": state.q, "v": self.velocity(system, state), "p": state.p}

    def dense_interval(self, system: LagrangianSystem, prev: AbstractState,
                       new: AbstractState, h: ScalarLike) -> dict[str, Stages]:
        c = np.asarray(self.tableau.q.c)
        nodes = self._dense_nodes()
        V = new.stages
        dtype = V.dtype
        q = prev.q[None, :] + h * (jnp.asarray(integration_matrix(c, nodes), dtype) @ V)
        v = jnp.asarray(lagrange_extrapolation_matrix(c, nodes), dtype) @ V
        times = prev.t + h * jnp.asarray(nodes, dtype)
        return {"q": q, "v": v, "p": at_nodes(system, times, lambda s, x, y: s.momentum(x, y), q, v)}


class TableauPresets:
    """The tableau presets of the variational PRK families (:class:`VPRK` and
    :class:`vijax.GroupVPRK`): ``cls(tableau, **kwargs)`` for the standard pairs."""

    @classmethod
    def gauss(cls, s: int, **kwargs):
        """Gauss--Legendre, ``s`` stages, order ``2s`` (self-conjugate)."""
        return cls(tb.gauss(s), **kwargs)

    @classmethod
    def lobatto(cls, s: int, **kwargs):
        """Lobatto IIIA--IIIB pair, ``s >= 2`` stages, order ``2s - 2``."""
        return cls(tb.lobatto_iiia_iiib(s), **kwargs)

    @classmethod
    def midpoint(cls, **kwargs):
        """Implicit midpoint rule (Gauss, one stage), order 2."""
        return cls(tb.gauss(1), **kwargs)


class VPRK(TableauPresets, AbstractPRK):
    """Variational partitioned Runge--Kutta method.

    Eq. (9) of Martín de Diego & Sato Martín de Almagro (2022).

    Parameters
    ----------
    tableau:
        A :class:`~vijax.tableaus.ButcherTableau` (paired with its symplectic conjugate) or a
        symplectic-conjugate :class:`~vijax.tableaus.PartitionedTableau`.
    solver:
        Root solver for the stage equations.  Default :class:`~vijax.solvers.FixedPoint`
        preconditioned by the inverse velocity Hessian at the start of the step (the classic
        fixed-point iteration when the mass matrix is constant); use
        :class:`~vijax.solvers.Newton` for stiff problems.
    predictor:
        ``"extrapolate"`` (default): the previous step's stage velocities extrapolated by
        their interpolation polynomial (for a :class:`vijax.MechanicalSystem` and stages
        inside the step, as Gauss's, the polynomial also passes through the node value --
        the velocity ``M(q_k)^{-1} p_k``, or with a constant mass matrix the force
        ``D1L(q_k, v_k)`` of an unforced system, for a general Lagrangian the node velocity
        from one Newton step on the Legendre map: one order more); ``"constant"``: all
        stages start at the last stage velocity.

    Presets: :meth:`gauss`, :meth:`lobatto`, :meth:`midpoint`, :meth:`stormer_verlet`.
    """

    tableau: tb.PartitionedTableau
    solver: AbstractRootSolver
    predictor: Literal["extrapolate", "constant"] = eqx.field(static=True)
    retrace: bool = eqx.field(static=True, default=False)   # see retracing

    symplectic = True
    supported = frozenset({ForcedSystem, TimeDependentSystem})

    def __init__(self, tableau, solver: AbstractRootSolver | None = None,
                 predictor: Literal["extrapolate", "constant"] = "extrapolate"):
        self.tableau = _as_pair(tableau)
        self.solver = FixedPoint() if solver is None else solver
        if predictor not in ("extrapolate", "constant"):
            raise ValueError(f"predictor must be 'extrapolate' or 'constant', got {predictor!r}")
        if predictor == "extrapolate" and len(set(self.tableau.q.c_)) < self.tableau.q.stages:
            predictor = "constant"  # repeated nodes: no interpolation polynomial
        self.predictor = predictor

    # -- presets (gauss, lobatto, midpoint from TableauPresets) ------------------------------
    @classmethod
    def stormer_verlet(cls, **kwargs) -> "VPRK":
        """Störmer--Verlet (Lobatto IIIA--IIIB, two stages), order 2."""
        return cls(tb.lobatto_iiia_iiib(2), **kwargs)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        out = [("VPRK.midpoint()", cls.midpoint()), ("VPRK.stormer_verlet()", cls.stormer_verlet())]
        out += [(f"VPRK.gauss({s})", cls.gauss(s)) for s in (1, 2, 3, 4)]
        return out + [(f"VPRK.lobatto({s})", cls.lobatto(s)) for s in (2, 3, 4, 5)]

    @property
    def name(self) -> str:
        return f"VPRK[{self.tableau.name}]"

    # -- stepping ---------------------------------------------------------------------------
    def init(self, system: LagrangianSystem, t0: ScalarLike, q0: Vector, v0: Vector) -> VPRKState:
        t0 = jnp.asarray(t0, q0.dtype)
        at_t0 = system.at(t0)
        stages = jnp.broadcast_to(v0, (self.stages,) + v0.shape)
        forces = jnp.broadcast_to(at_t0.d1_lagrangian(q0, v0), (self.stages,) + v0.shape)
        carried = [stages.shape] if self._carries_misses(system) else []
        return VPRKState(t=t0, q=q0, p=at_t0.momentum(q0, v0), stages=stages, forces=forces,
                         misses=Misses.zeros(carried, q0.dtype))

    @staticmethod
    def _velocity_form(system) -> bool:
        """Whether the stage equations are solved for the stage velocities in the velocity
        form ``V^i = M(Q^i)^{-1} P^i`` (a :class:`vijax.MechanicalSystem` whose mass matrix
        depends on the configuration)."""
        return isinstance(system, MechanicalSystem) and not system.constant_mass

    def _carries_misses(self, system) -> bool:
        """Whether the state carries the predictor's last misses (``misses``; elsewhere an
        empty array), measured where they pay: in the velocity form with at most four stages.
        Chaotic double pendulum, 1024 members, step time with / without: Gauss(2) h = 0.01
        0.89x, Gauss(3) h = 0.015 0.90x, Gauss(4) h = 0.02 0.95x, Gauss(6) h = 0.035 1.03x
        (its updates are set by the contraction rate: 4.77 / 4.76); Kepler in the force form
        2.19 -> 2.04 updates per step but 1.06-1.10x the time."""
        return self._velocity_form(system) and self.stages <= 4

    def _extrapolation(self, dtype):
        """Predictor matrix: previous stages -> this step's stages."""
        return extrapolation(self.tableau, dtype, constant=self.predictor == "constant")

    def _extrapolate(self, values, extrap, node):
        """:func:`~vijax.integrators._prk_core.extrapolate`: ``values`` by ``extrap``, through
        the node value ``node()`` as well unless ``predictor="constant"``."""
        return extrapolate(self.tableau, values, extrap,
                           node if self.predictor == "extrapolate" else None)

    def _at_end(self, stages):
        """The stage values' interpolation polynomial at the step's end node."""
        c = np.asarray(self.tableau.q.c)
        return mm(jnp.asarray(lagrange_extrapolation_matrix(c, np.ones(1)), stages.dtype),
                  stages)[0]

    def _velocity_predictor(self, system, state: VPRKState, extrap):
        """The stage velocities' warm start of the velocity form: the previous stage
        velocities extrapolated through the node velocity ``v_k = M(q_k)^{-1} p_k``."""
        return self._extrapolate(state.stages, extrap, lambda: mm(
            system.at(state.t).inverse_mass_matrix(state.q), state.p))

    def _momentum_predictor(self, system, state: VPRKState, extrap, minv):
        """The stage velocities' warm start of the momentum form (general Lagrangians): the
        previous stage velocities extrapolated through the node velocity from one Newton
        step on ``D2L(q_k, v) = p_k`` from the polynomial's value at the node, with ``minv``
        the inverse velocity Hessian at the predicted last stage (``O(h)`` from it: the node
        velocity to ``O(h^{s+1})``)."""
        def node():
            guess = self._at_end(state.stages)
            return guess + mm(minv, state.p - system.at(state.t).momentum(state.q, guess))

        return self._extrapolate(state.stages, extrap, node)

    def _force_predictor(self, system, state: VPRKState, extrap, minv, force=None):
        """The stage forces' warm start of the force form (constant mass matrix ``minv⁻¹``):
        the previous stage forces extrapolated, through the node force
        ``D1L(q_k, M^{-1} p_k)`` as well when no external force is given (a force's
        controls are given per stage)."""
        node = None if force is not None else (
            lambda: system.at(state.t).d1_lagrangian(state.q, mm(minv, state.p)))
        return self._extrapolate(state.forces, extrap, node)

    def retracing(self) -> "VPRK":
        # the carried stage values reversed are the root (symmetric nodes and coefficients):
        # no predictor, no solve (_start)
        return with_fields(self, retrace=True, solver=StartAsRoot())

    def _start(self, state: VPRKState, predictor, carried):
        """``(start, X0)`` of the stage solve: the predictor ``X0 = predictor()`` corrected
        by its last misses, or, retracing (:meth:`retracing`), the unknowns ``carried`` from
        the step being retraced, in reverse order (with symmetric nodes and coefficients the
        stage values of the step with ``-h`` are those of the step with ``h`` in reverse
        order), and no predictor (``X0 = None``)."""
        if self.retrace:
            return carried[::-1], None
        X0 = predictor()
        return state.misses.correct((X0,))[0], X0

    def step(self, system: LagrangianSystem, state: VPRKState, h: ScalarLike, u=None
             ) -> tuple[VPRKState, SolverStats]:
        q, p = state.q, state.p
        a, ahat, b = self._coefficients(q.dtype)
        extrap = self._extrapolation(q.dtype)
        force = self._force(system, state, h, u)
        times = self._stage_times(state.t, h)
        if isinstance(system, MechanicalSystem) and system.constant_mass:
            # Force form: with a constant mass matrix the stage velocities are a linear
            # function of the stage forces, V^i = M^{-1} (p + h sum_j â_ij W^j), so the
            # unknowns are the W^i and the fixed-point map is W <- D1L(Q(W), V(W)).  The
            # converged W gives p_{k+1} and V (hence q_{k+1}) with no evaluation after the
            # solve.
            minv = system.at(state.t).inverse_mass_matrix(q)

            def velocities(W):
                return mm(p[None, :] + h * mm(ahat, W), minv.T)

            def residual(W):
                V = velocities(W)
                Q = q[None, :] + h * mm(a, V)
                D1 = at_nodes(system, times, lambda sys, x, y: sys.d1_lagrangian(x, y), Q, V)
                return W - (D1 if force is None else D1 + force(Q, V))

            # (the misses: an empty record in this form, see _carries_misses)
            start, X0 = self._start(
                state, lambda: self._force_predictor(system, state, extrap, minv, force),
                state.forces)
            W, stats = self.solver.solve(residual, start)
            V, X = velocities(W), W
        else:
            if self._velocity_form(system):
                # Velocity form V^i = M(Q^i)^{-1} P^i: the fixed-point map uses each stage's
                # own mass matrix (measured on the chaotic double pendulum at h = 0.01: 4.8
                # instead of 6.0 updates per step, 17 % less time than a matrix frozen at the
                # step start).
                def residual(V):
                    Q, W, _ = stage_values(system, a, q, h, V, force, times)
                    P = p[None, :] + h * mm(ahat, W)
                    minv_p = at_nodes(system, times,
                                      lambda sys, Qi, Pi: sys.inverse_mass_matrix(Qi) @ Pi, Q, P)
                    return V - minv_p, W

                precond = None
                # the predictor corrected by its last misses (_prk_core.corrected: the
                # Coriolis terms make this iteration contract slowly, and a better start
                # saves updates: the chaotic double pendulum 4.49 -> 3.83 per Gauss(2) step)
                start, X0 = self._start(
                    state, lambda: self._velocity_predictor(system, state, extrap),
                    state.stages)
            else:
                # Momentum form D2L(Q^i, V^i) - P^i: the stage equations every PRK family
                # shares (vijax.integrators._prk_core, on the group R^n), preconditioned by
                # the velocity Hessian at the step start, inverted once per step (not when
                # retracing: no update).
                group, retraction = vector_space(q)
                none = jnp.zeros((0,), q.dtype)
                if self.retrace:
                    precond, predictor = None, None
                else:
                    V0 = mm(extrap, state.stages)
                    at_t = system.at(state.t)
                    minv = at_t.inverse_velocity_hessian(q, V0[-1])
                    precond = free_precond(self.tableau, group, minv, p, V0[-1], h,
                                           momentum_coupling(at_t, group, q, V0[-1]))
                    predictor = functools.partial(self._momentum_predictor, system, state,
                                                  extrap, minv)
                start, X0 = self._start(state, predictor, state.stages)

                def residual(V):
                    res, out = stage_equations(self.tableau, group, retraction, system, "free",
                                               state, h, (V, none, None), force)
                    return res, out.forces

            # W^i comes from the last residual evaluation (within the tolerance of the
            # root), not from an evaluation after the solve.
            V, W, stats = self.solver.solve(residual, start, precond, has_aux=True)
            X = V
        new = VPRKState(t=state.t + h, q=q + h * mm(b, V), p=p + h * mm(b, W), stages=V,
                        forces=W, misses=state.misses.after((X,), None if X0 is None else (X0,)))
        return new, stats

    def velocity(self, system: LagrangianSystem, state: VPRKState) -> Vector:
        guess = (self._at_end(state.stages) if self.predictor == "extrapolate"
                 else state.stages[-1])
        return system.at(state.t).velocity(state.q, state.p, guess)
