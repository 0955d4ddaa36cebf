"""Nonholonomic partitioned Runge--Kutta integrators (Lobatto IIIA--IIIB).

After Martín de Diego & Sato Martín de Almagro (2022), §5, eq. (14) and Appendix D.  For a
system with nonholonomic constraints ``Φ(q, v) = 0`` and Lagrange--d'Alembert (Chetaev)
constraint forces ``D2Φ^T λ``, one step ``(q_k, p_k, λ_k) -> (q_{k+1}, p_{k+1}, λ_{k+1})``
reads

    Q^i = q_k + h sum_j a_ij V^j,            P^i = p_k + h sum_j â_ij W^j,
    W^i = D1L(Q^i, V^i) + D2Φ(Q^i, V^i)^T Λ^i,   P^i = D2L(Q^i, V^i),
    p^i = p_k + h sum_j a_ij W^j   (the IIIA coefficients, not â),
    Φ(Q^i, v^i) = 0 with D2L(Q^i, v^i) = p^i      (i = 2..s),
    q_{k+1} = Q^s,  p_{k+1} = p^s,  λ_{k+1} = Λ^s,  Λ^1 = λ_k (carried).

The constraint is imposed on the new stage momenta ``p^i`` (stage order ``s``), not on the
IIIB momenta ``P^i`` (stage order ``s - 2``), and the node velocity is ``v_{k+1} = v^s``, not
the low-order ``V^s``.  With a :class:`vijax.ForcedSystem` the stage forces
``F(t_k + c_i h, Q^i, V^i, U^i)`` join ``W^i`` (discrete Lagrange--d'Alembert principle).

The Hamiltonian form (their eq. (15), Appendix E; ``form="hamiltonian"``) writes the same
step with ``H(q, p) = E_L(q, FL^{-1}(q, p))`` and ``Ψ(q, p) = Φ(q, ∂H/∂p)``:

    V^i = ∂H/∂p(Q^i, P^i),   W^i = ∂H/∂q(Q^i, P^i) - ♭_H(D2Ψ)(Q^i, P^i)^T Λ^i - F^i,
    P^i = p_k - h sum_j â_ij W^j,   p^i = p_k - h sum_j a_ij W^j,   Ψ(Q^i, p^i) = 0,

with ``♭_H(D2Ψ) = D2Ψ (∂²H/∂p²)^{-1}``, which the chain rule makes ``D2Φ(Q^i, ∂H/∂p)`` (here
``W`` is minus the generalised force).
"""

from __future__ import annotations

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import constraints as cons
from .. import tableaus as tb
from .._checks import is_traced
from .._typing import ScalarLike, Vector
from ..solvers import AbstractRootSolver, SolverStats, StartAsRoot
from ..systems import ForcedSystem, LagrangianSystem, NonholonomicSystem, TimeDependentSystem
from ._base import AbstractIntegrator, with_fields
from ._prk_core import (PRKState, at_nodes, initial_state, next_state,
                        nonholonomic_solver, predict, stage_equations, vector_space)
from .vprk import VPRK, AbstractPRK

__all__ = ["NonholonomicVPRK", "NonholonomicState"]

_H_TOL = 1e-14


#: ``(t, q, p, v)`` on the constraint set ``Φ(q, v) = 0``, the node multiplier ``lam``
#: (``Λ^s`` of the step that ended here, the next step's ``Λ^1``), and that step's stage
#: velocities ``V^i`` (``stages``) and stage multipliers ``Λ^i`` (``lams``, ``Λ^1`` first) for
#: the predictor.  ``v`` is the node velocity ``v^s`` (the inverse Legendre map of ``p``), not
#: the IIIB stage velocity ``V^s``.  The state of every PRK family with constraints
#: (:class:`vijax.PRKState`).
NonholonomicState = PRKState


def _check_hypotheses(pair: tb.PartitionedTableau, family: str = "NonholonomicVPRK",
                      context: str = "", fix: str = "NonholonomicVPRK.lobatto(s)") -> None:
    a, b = np.asarray(pair.q.a, float), np.asarray(pair.q.b, float)
    ahat = np.asarray(pair.p.a, float)
    problems = []
    if a.shape[0] < 2:
        problems.append("s >= 2 stages")
    if np.max(np.abs(a[0])) > _H_TOL:
        problems.append("H1: a_1j = 0")
    if a.shape[0] > 1 and abs(np.linalg.det(a[1:, 1:])) < 1e-12:
        problems.append("H2: (a_ij), i,j >= 2, invertible")
    if np.max(np.abs(a[-1] - b)) > _H_TOL:
        problems.append("H3: a_sj = b_j (stiffly accurate)")
    if np.max(np.abs(ahat[:, -1])) > _H_TOL:
        problems.append("H1': â_is = 0")
    if np.max(np.abs(ahat[:, 0] - b[0])) > _H_TOL:
        problems.append("H2': â_i1 = b_1")
    if problems:
        raise ValueError(
            f"{family}{context} needs a tableau pair satisfying the hypotheses H1--H3 and "
            f"H1'--H2' of Martín de Diego & Sato Martín de Almagro (2022), §4.3; {pair.name} "
            f"violates {', '.join(problems)}. Use Lobatto IIIA-IIIB: {fix}.")


_FORMS = ("lagrangian", "hamiltonian")


class NonholonomicVPRK(AbstractPRK):
    """Nonholonomic partitioned Runge--Kutta method (eq. (14) of Martín de Diego & Sato
    Martín de Almagro (2022)) for a :class:`vijax.NonholonomicSystem`.

    Presets :meth:`lobatto` (``s = 2..5`` stages).  Global orders (their Corollary 5.2.1):
    ``2s - 2`` in ``q`` and ``p``; in the multiplier ``λ``, ``s`` for even ``s`` and
    ``s - 1`` for odd ``s``.  These orders need the exact initial multiplier: :meth:`init`
    computes it with :func:`vijax.constraints.nonholonomic_multiplier` (a wrong ``λ0`` is
    never damped and costs the order for ``s >= 3``).

    The constraints may be linear, affine or nonlinear in ``v`` (any ``constraint_form``):
    they are imposed at every stage ``(Q^i, v^i)`` to the solver's tolerance, the last stage
    being the node.  The method is not symplectic (nonholonomic flows are not); the Lobatto
    pairs are symmetric.  The Lagrangian may be any regular one: for systems declared
    ``quadratic_in_velocity`` the stage velocities ``v^i`` are one linear solve from ``p^i``,
    otherwise they join the unknowns.

    Per step the unknowns are the stage velocities ``V^1..V^s``, the impulses
    ``h Λ^2..h Λ^s`` (scaled so that the Newton matrix stays conditioned as ``h -> 0``) and,
    for non-quadratic Lagrangians, ``v^2..v^s``.  The default solver is a fixed point
    (:func:`vijax.constraints.default_solver`, ``kappa=0.01``) preconditioned by the
    approximate Jacobian built from the velocity Hessians, the constraint matrices ``D2Φ``
    and their configuration derivatives ``D1Φ`` at the predicted stages (exact up to
    ``O(h)``; one ``(s - 1) m``-square factorisation per step,
    :func:`~vijax.integrators._prk_core.nonholonomic_precond`); in the Hamiltonian form it is
    full :class:`~vijax.solvers.Newton`.  Pass ``solver=vj.solvers.Newton()`` for stiff
    problems.

    ``form="hamiltonian"`` solves the Hamiltonian form of the same method (their eq. (15),
    Appendix E) in the unknowns ``V^i``, ``P^i`` and ``h Λ^2..h Λ^s``, with every derivative
    taken from ``system.hamiltonian`` (``H = E_L∘FL^{-1}``; a closed form where the class
    gives one, e.g. ``½ pᵀM^{-1}p + U`` for a :class:`vijax.MechanicalSystem`) and the
    constraint one-forms ``♭_H(D2Ψ) = D2Φ(Q^i, ∂H/∂p)`` of ``Ψ(q, p) = Φ(q, ∂H/∂p)``.  For a
    hyperregular Lagrangian both forms give the same trajectory to solver tolerance; the
    Lagrangian form has ``n s`` fewer unknowns and is the default.
    """

    tableau: tb.PartitionedTableau
    solver: AbstractRootSolver | None
    form: str = eqx.field(static=True)
    retrace: bool = eqx.field(static=True, default=False)   # see retracing

    symplectic = False
    supported = frozenset({NonholonomicSystem, ForcedSystem, TimeDependentSystem})
    required = frozenset({NonholonomicSystem})

    def __init__(self, tableau, solver: AbstractRootSolver | None = None,
                 form: str = "lagrangian"):
        pair = VPRK(tableau).tableau
        _check_hypotheses(pair)
        if form not in _FORMS:
            raise ValueError(f"NonholonomicVPRK: form={form!r}; use 'lagrangian' (eq. (14)) or "
                             f"'hamiltonian' (eq. (15)).")
        self.tableau = pair
        self.solver = solver
        self.form = form

    @classmethod
    def lobatto(cls, s: int, **kwargs) -> "NonholonomicVPRK":
        """Nonholonomic Lobatto IIIA--IIIB, ``s >= 2`` stages: order ``2s - 2`` in ``q, p``
        (``form="hamiltonian"`` for the Hamiltonian form)."""
        return cls(tb.lobatto_iiia_iiib(s), **kwargs)

    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        return [(f"NonholonomicVPRK.lobatto({s})", cls.lobatto(s)) for s in (2, 3, 4, 5)]

    @property
    def name(self) -> str:
        form = "" if self.form == "lagrangian" else ", hamiltonian"
        return f"NonholonomicVPRK[{self.tableau.name}{form}]"

    @property
    def multiplier_order(self) -> int:
        """Global order of the multiplier: ``s`` for even ``s``, ``s - 1`` for odd ``s``
        (their Corollary 5.2.1)."""
        s = self.stages
        return s if s % 2 == 0 else s - 1

    # -- initial data -------------------------------------------------------------------------
    def check_initial(self, system: LagrangianSystem, q0: Vector, v0: Vector, tol: float
                      ) -> tuple[Vector, Vector]:
        return cons.check_nonholonomic_consistent(system, q0, v0, tol)

    def init(self, system: LagrangianSystem, t0: ScalarLike, q0: Vector, v0: Vector,
             lam0: Vector | None = None) -> NonholonomicState:
        """The state at ``t0``.  ``λ0`` is the exact multiplier
        (:func:`vijax.constraints.nonholonomic_multiplier`, with zero controls for a
        controlled system) unless ``lam0`` is given; a given ``lam0`` that differs from it
        is used as passed, with a warning that reports the difference."""
        t0 = jnp.asarray(t0, q0.dtype)
        exact, p0 = _initial_data(system, t0, q0, v0)
        if lam0 is None:
            lam0 = exact
        else:
            lam0 = jnp.asarray(lam0, q0.dtype).reshape(exact.shape)
            _warn_if_inconsistent(lam0, exact)
        return initial_state(self.tableau, t0, q0, p0, v0, lam0, "nonholonomic")

    # -- the step equations -------------------------------------------------------------------
    def _explicit_velocities(self, system) -> bool:
        return bool(system.quadratic_in_velocity)

    def stage_equations(self, system, state: NonholonomicState, h: ScalarLike, X, force=None,
                        with_stages: bool = False):
        """Residual of eq. (14) (``form="hamiltonian"``: eq. (15)) at the unknowns
        ``X = (V, μ, extra)`` (``μ^i = h Λ^i`` for ``i >= 2``; ``extra``: ``v^2..v^s`` for a
        Lagrangian not declared quadratic in the velocities, else ``None``; the stage
        momenta ``P^i`` in the Hamiltonian form) and the step's
        :class:`~vijax.integrators._prk_core.StepOutput` (with ``with_stages``, also the
        stages ``(Q^i, p^i, v^i)``, ``i = 1..s``)."""
        group, retraction = vector_space(state.q)
        return stage_equations(self.tableau, group, retraction, system, "nonholonomic", state,
                               h, X, force, form=self.form, with_stages=with_stages)

    def _predictor(self, system, state: NonholonomicState, h):
        extra = ("momenta" if self.form == "hamiltonian" else
                 "" if self._explicit_velocities(system) else "velocities")
        group, retraction = vector_space(state.q)
        return predict(self.tableau, state, h, "nonholonomic", extra, system=system, group=group,
                       retraction=retraction, retrace=self.retrace)

    def retracing(self) -> "NonholonomicVPRK":
        # the carried stage values and multipliers reversed are the root (_predictor): no
        # solve, no preconditioner
        return with_fields(self, retrace=True, solver=StartAsRoot())

    def step(self, system: LagrangianSystem, state: NonholonomicState, h: ScalarLike, u=None
             ) -> tuple[NonholonomicState, SolverStats]:
        force = self._force(system, state, h, u)
        X0 = self._predictor(system, state, h)
        if self.retrace:
            solver, precond, start, X0 = self.solver, None, X0, None
        else:
            solver, precond = nonholonomic_solver(self.solver, self.tableau, self.form,
                                                  *vector_space(state.q), system, state, h,
                                                  X0[0])
            start = state.misses.correct(X0)
        X, out, stats = solver.solve(
            lambda X: self.stage_equations(system, state, h, X, force), start, precond,
            has_aux=True)
        return next_state(state, "nonholonomic", X, out, h, X0=X0), stats

    def stage_values(self, system: LagrangianSystem, prev: NonholonomicState,
                     new: NonholonomicState, h: ScalarLike, u=None):
        """The stages ``(Q^i, p^i, v^i)`` of the step ``prev -> new`` (``i = 1..s``),
        recomputed from the stored ``V^i`` and ``Λ^i``: where the constraint
        ``Φ(Q^i, v^i) = 0`` is imposed."""
        force = self._force(system, prev, h, u)
        # the Lagrangian form whatever self.form: Q^i and p^i depend on V^i and Λ^i only
        w = None if self._explicit_velocities(system) else new.stages[1:]
        group, retraction = vector_space(prev.q)
        _, (_, (Q, ps, _)) = stage_equations(
            self.tableau, group, retraction, system, "nonholonomic", prev, h,
            (new.stages, h * new.lams[1:], w), force, with_stages=True)
        times = self._stage_times(prev.t, h)
        vs = at_nodes(system, times, lambda sy, x, y, g: sy.velocity(x, y, g), Q, ps, new.stages)
        return Q, ps, vs

    def velocity(self, system: LagrangianSystem, state: NonholonomicState) -> Vector:
        return state.v


@eqx.filter_jit
def _initial_data(system, t0, q0, v0):
    """The exact multiplier and the momentum at ``(t0, q0, v0)`` (compiled: an eager ``init``
    costs one compilation, not one dispatch per primitive)."""
    return (cons.nonholonomic_multiplier(system, q0, v0, t0),
            system.at(t0).momentum(q0, v0))


def _warn_if_inconsistent(lam0, exact):
    """Warn (eagerly, or from the compiled code through a callback) when a passed ``λ0``
    differs from the exact multiplier by more than ``sqrt(eps)`` relative."""
    gap = jnp.max(jnp.abs(lam0 - exact))
    tol = float(jnp.finfo(lam0.dtype).eps) ** 0.5 * (1.0 + jnp.max(jnp.abs(exact)))

    def warn(gap, tol):
        if float(gap) > float(tol):
            warnings.warn(
                f"lam0 differs from the exact multiplier of the continuous problem by "
                f"{float(gap):.3e} (residual max|lam0 - λ(q0, v0)|): NonholonomicVPRK then "
                f"loses its order for s >= 3 (Martín de Diego & Sato Martín de Almagro (2022), "
                f"Thm 5.1 assumes the exact λ0). Leave lam0 out to use "
                f"vijax.constraints.nonholonomic_multiplier(system, q0, v0).",
                UserWarning, stacklevel=4)

    if is_traced((gap, tol)):
        jax.debug.callback(warn, gap, tol)
    else:
        warn(gap, tol)
