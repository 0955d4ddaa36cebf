"""Variational partitioned Runge--Kutta methods on Lie groups (RKMK-type, over a retraction).

Martín de Diego & Sato Martín de Almagro (2022), §6: for a :class:`vijax.LieGroupSystem` with
left-trivialised Lagrangian ``ℓ(g, ξ)`` and a retraction ``τ`` (:class:`vijax.lie.Exp` or
:class:`vijax.lie.Cayley`), stationarity of the discrete trivialised Hamilton--Pontryagin
action (their eq. (23)) gives, with unknown stage algebra elements ``H^1..H^s`` (Thm 6.1,
eqs. (24)--(30)),

    Ξ^i = h Σ_j a_ij H^j,   G^i = g_k τ(Ξ^i),   V^i = d^Lτ_{Ξ^i} H^i,   ξ = h Σ_j b_j H^j,
    N^i = (d^Lτ_{Ξ^i})* [L*_{G^i} D1ℓ(G^i, V^i) + F^i],   Π^i = (d^Lτ_{Ξ^i})* D2ℓ(G^i, V^i),
    μ_{k+1} = Ad*_{τ(ξ)} [μ_k + h Σ_j b_j (d^Lτ^{-1}_{-Ξ^j})* N^j],
    0 = Π^i + h Σ_j (b_j a_ji / b_i) [N^j + (dd^Lτ_{Ξ^j})*(H^j, Π^j)] - (d^Lτ_ξ)* μ_{k+1},
    g_{k+1} = g_k τ(ξ),

(the residual is their eq. (30) with (29) substituted; ``b_j a_ji / b_i = b_j - â_ij``).  On
``R^n`` (``τ = id``, ``Ad = I``, ``dd^Lτ = 0``) this is the vector-space VPRK of eq. (9); a
test checks the two agree to round-off.  The ``dd^Lτ`` term is what keeps the order: without
it the method drops to order 1 (a test documents this).

Constraints follow their §6.3--§6.4:

* holonomic ``Φ(g) = 0`` (:class:`vijax.HolonomicSystem`): ``N^i`` gains
  ``-(d^Lτ_{Ξ^i})* (L*_{G^i} DΦ)ᵀ Λ^i``, the rows ``Φ(G^i) = 0`` (``i >= 2``) and the tangency
  ``L*DΦ(g_{k+1}) ξ_{k+1} = 0`` at the new node close the system (unknowns ``H``, ``h Λ^i``
  and the node velocity ``ξ_{k+1}``), as in the vector-space RATTLE family;
* nonholonomic ``φ(g, ξ) = 0`` (:class:`vijax.NonholonomicSystem`; their App. F):
  ``N^i`` gains ``(d^Lτ_{Ξ^i})* D2φ(G^i, V^i)ᵀ Λ^i`` with ``Λ^1 = λ_k`` carried as state, and
  the constraint is imposed on the IIIA-built stage momenta
  ``μ^i = Ad*_{τ(Ξ^i)} [μ_k + h Σ_j a_ij (d^Lτ^{-1}_{-Ξ^j})* N^j]`` through
  ``φ(G^i, η^i) = 0``, ``D2ℓ(G^i, η^i) = μ^i`` (``i = 2..s``).  The orders are those of the
  vector-space methods: ``2s - 2`` in ``g`` and ``μ``, ``s`` (even ``s``) or ``s - 1`` (odd
  ``s``) in ``λ``.

The state carries the group element ``q = g_k``, the **body** momentum ``p = μ_k = D2ℓ(g_k,
ξ_k)`` and, with constraints, the node multiplier.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ... import constraints as cons
from ... import tableaus as tb
from ..._checks import is_traced, refuse
from ..._typing import ScalarLike, Vector
from ...lie import AbstractRetraction, Exp
from ...solvers import AbstractRootSolver, FixedPoint, Newton, SolverStats
from ...systems import (ForcedSystem, HolonomicSystem, LieGroupSystem, NonholonomicSystem,
                        TimeDependentSystem)
from .._base import AbstractIntegrator, IncompatibleSystemError, accepting
from .._prk_core import (PRKState, free_precond, initial_state,
                         momentum_coupling, next_state, nonholonomic_solver, predict,
                         stage_equations)
from ..nonholonomic import _FORMS
from ..nonholonomic import _check_hypotheses as _check_nonholonomic_hypotheses
from ..vprk import PRKTraits, TableauPresets, _as_pair
from ._dynamics import nonholonomic_multiplier

__all__ = ["GroupVPRK", "GroupPRKState"]


#: ``(t, g, μ)`` (``q`` the group element, ``p`` the body momentum), the node body velocity
#: ``v``, the node multiplier ``lam`` (empty without constraints) and the last step's stage
#: values (``stages`` the ``H^i``, ``lams`` the ``Λ^i``) for the predictor
#: (:class:`vijax.PRKState`, the state of every PRK family).
GroupPRKState = PRKState


class GroupVPRK(TableauPresets, PRKTraits, AbstractIntegrator):
    """Variational PRK over a retraction on a Lie group (Martín de Diego & Sato Martín de
    Almagro (2022), Thm 6.1, §6.3, §6.4 and App. F), for a :class:`vijax.LieGroupSystem`,
    unconstrained, holonomically or nonholonomically constrained.

    Parameters
    ----------
    tableau:
        A :class:`~vijax.tableaus.ButcherTableau` (paired with its symplectic conjugate) or a
        symplectic-conjugate pair.  Constrained systems need Lobatto IIIA--IIIB
        (hypotheses H1--H3).
    retraction:
        :class:`vijax.lie.Exp` (default, every group) or :class:`vijax.lie.Cayley`.
    solver:
        Default: :class:`~vijax.solvers.FixedPoint` preconditioned by the inverse velocity
        Hessian for unconstrained systems; with nonholonomic constraints (Lagrangian form) the
        preconditioned fixed point of :class:`vijax.NonholonomicVPRK`; otherwise (holonomic
        constraints, the Hamiltonian form) :class:`~vijax.solvers.Newton`.
    form:
        ``"lagrangian"`` (default) or ``"hamiltonian"``: for a nonholonomic system, the
        Hamiltonian form of their App. G (unknowns ``H^i``, the stage momenta and the
        impulses; every derivative from the reduced Hamiltonian ``𝔥(g, μ)``,
        ``system.hamiltonian``), the same trajectory to solver tolerance for a hyperregular
        Lagrangian.  Unconstrained and holonomic systems refuse it.

    Presets: :meth:`gauss` (order ``2s``), :meth:`lobatto` (order ``2s - 2``), :meth:`midpoint`.
    """

    tableau: tb.PartitionedTableau
    retraction: AbstractRetraction
    solver: AbstractRootSolver | None
    form: str = eqx.field(static=True)

    symplectic = True
    required = frozenset({LieGroupSystem})
    supported = frozenset({LieGroupSystem, HolonomicSystem, NonholonomicSystem, ForcedSystem,
                           TimeDependentSystem})

    def __init__(self, tableau, retraction: AbstractRetraction | None = None,
                 solver: AbstractRootSolver | None = None, form: str = "lagrangian"):
        self.tableau = _as_pair(tableau)
        self.retraction = Exp() if retraction is None else retraction
        if not isinstance(self.retraction, AbstractRetraction):
            raise TypeError(f"retraction must be vijax.lie.Exp() or vijax.lie.Cayley(), got "
                            f"{type(self.retraction).__name__}.")
        if form not in _FORMS:
            raise ValueError(f"GroupVPRK: form={form!r}; use 'lagrangian' (App. F) or "
                             f"'hamiltonian' (App. G, nonholonomic systems).")
        self.solver = solver
        self.form = form

    # -- presets (gauss, lobatto, midpoint from TableauPresets) ------------------------------
    @classmethod
    def presets(cls) -> list[tuple[str, AbstractIntegrator]]:
        from ...lie import Cayley
        # Lobatto first: they take every kind of system (the first preset is the example an
        # error message names)
        out = [(f"GroupVPRK.lobatto({s})", cls.lobatto(s)) for s in (2, 3, 4, 5)]
        out += [("GroupVPRK.lobatto(3, retraction=vj.lie.Cayley())",
                 cls.lobatto(3, retraction=Cayley()))]
        out += [("GroupVPRK.midpoint()", cls.midpoint())]
        return out + [(f"GroupVPRK.gauss({s})", cls.gauss(s)) for s in (2, 3)]

    # -- traits (order, stages, force nodes and weights from PRKTraits) ----------------------
    @property
    def name(self) -> str:
        form = "" if self.form == "lagrangian" else ", hamiltonian"
        return f"GroupVPRK[{self.tableau.name}, {self.retraction.name}{form}]"

    @property
    def symmetric(self) -> bool:
        """Only the one-stage midpoint rule: with several stages the RKMK-type stage maps
        ``g_k τ(h Σ_j a_ij H^j)`` are built from the step's start, and on a non-abelian group
        the step with ``-h`` does not invert the step with ``h`` even for a symmetric tableau
        (measured defects 1e-9 for Gauss(2) and 8e-8 for Lobatto(3) at h = 0.1 on the heavy
        top, against 1e-16 for the midpoint rule), as for the RKMK methods of Bogfjellmo &
        Marthinsen (2016) with a finite cut-off."""
        a, b = np.asarray(self.tableau.q.a, float), np.asarray(self.tableau.q.b, float)
        return bool(a.shape == (1, 1) and np.allclose(a, 0.5 * b, atol=1e-12))

    @property
    def multiplier_order(self) -> int:
        """Global order of a nonholonomic multiplier: ``s`` (even ``s``) or ``s - 1``."""
        s = self.stages
        return s if s % 2 == 0 else s - 1

    def _fits_constraints(self) -> bool:
        try:
            _check_nonholonomic_hypotheses(self.tableau)
        except ValueError:
            return False
        return True

    def accepts(self, system) -> bool:
        """Any :class:`vijax.LieGroupSystem`; with constraints (holonomic or nonholonomic,
        not both) only for a tableau pair satisfying H1--H3 (Lobatto IIIA--IIIB)."""
        if not super().accepts(system):
            return False
        if isinstance(system, HolonomicSystem) and isinstance(system, NonholonomicSystem):
            return False
        if self.form == "hamiltonian" and self._mode(system) != "nonholonomic":
            return False
        return self._mode(system) == "free" or self._fits_constraints()

    def check_system(self, system) -> None:
        if not super().accepts(system):
            super().check_system(system)
        name = type(system).__name__
        if isinstance(system, HolonomicSystem) and isinstance(system, NonholonomicSystem):
            raise IncompatibleSystemError(
                f"{self.name} takes holonomic or nonholonomic constraints, not both; "
                f"{name} declares both.")
        if self.form == "hamiltonian" and self._mode(system) != "nonholonomic":
            raise IncompatibleSystemError(
                f"{self.name}: the Hamiltonian form (Martín de Diego & Sato Martín de Almagro "
                f"(2022), App. G) is written for nonholonomic systems, and {name} is not one; "
                f"use GroupVPRK(..., form='lagrangian') (the default).")
        if self._mode(system) != "free":
            try:
                _check_nonholonomic_hypotheses(self.tableau, self.name,
                                               f" on the constrained {name}",
                                               "GroupVPRK.lobatto(s)")
            except ValueError as err:
                raise IncompatibleSystemError(
                    f"{err} Methods that accept it: "
                    f"{', '.join('vijax.' + c for c in accepting(system))}.") from None
        self.retraction.check(system.group)

    def _mode(self, system) -> str:
        if isinstance(system, NonholonomicSystem):
            return "nonholonomic"
        if isinstance(system, HolonomicSystem):
            return "holonomic"
        return "free"

    def _solver(self, system) -> AbstractRootSolver:
        """The solver of an unconstrained or holonomic step (a nonholonomic step's comes with
        its preconditioner from :func:`~vijax.integrators._prk_core.nonholonomic_solver`)."""
        if self.solver is not None:
            return self.solver
        return FixedPoint() if self._mode(system) == "free" else Newton()

    # -- initial data -----------------------------------------------------------------------
    def check_initial(self, system, q0, v0: Vector, tol: float):
        """Refuse ``ξ0`` off a nonholonomic constraint, or ``(g0, ξ0)`` off a holonomic one
        or its tangency ``L*DΦ(g0) ξ0 = 0`` (``+ ∂Φ/∂t`` for a rheonomic one), naming the
        projection; ``system`` at the initial time."""
        mode = self._mode(system)
        if mode == "nonholonomic":
            return cons.check_nonholonomic_consistent(system, q0, v0, tol)
        if mode == "holonomic":
            name = type(system).__name__
            gap = jnp.max(jnp.abs(system.holonomic(q0)))
            rate = cons.constraint_rate(system, q0)   # a rheonomic constraint's ∂g/∂t
            tangency = system.group.left_jacobian(system.holonomic, q0) @ v0
            drift = jnp.max(jnp.abs(tangency if rate is None else tangency + rate))
            data = (q0, v0)
            for bad, what in ((gap, f"q0 violates {name}.holonomic"),
                              (drift, f"v0 violates the tangency L*DΦ(q0) v0 = 0 of {name}")):
                msg = (f"{what} (> {tol:.1e}); project the initial data onto the constraint "
                       f"(e.g. system.project_velocity(q0, v0) for the velocity).")
                data = refuse(data, ~(bad <= tol) if is_traced(bad) else not float(bad) <= tol,
                              msg, lambda m=msg, x=bad: m.replace("(>", f"by {float(x):.2e} (>"),
                              cons.InconsistentInitialData)
            return data
        return q0, v0

    def init(self, system, t0: ScalarLike, q0, v0: Vector) -> GroupPRKState:
        # (here, not in check_system: simulate caches that check per pair of types)
        if self._mode(system) != "free":
            _check_nonholonomic_hypotheses(self.tableau, "GroupVPRK",
                                           f" on the constrained {type(system).__name__}")
        dtype = v0.dtype
        t0 = jnp.asarray(t0, dtype)
        sys0 = system.at(t0)
        if self._mode(system) == "nonholonomic":
            lam0 = nonholonomic_multiplier(system, t0, q0, v0)
        else:
            m = system.holonomic(q0).shape[0] if self._mode(system) == "holonomic" else 0
            lam0 = jnp.zeros((m,), dtype)
        return initial_state(self.tableau, t0, q0, sys0.momentum(q0, v0), v0, lam0,
                             self._mode(system))

    # -- the stage equations ----------------------------------------------------------------
    def stage_equations(self, system, state: GroupPRKState, h: ScalarLike, X, force=None,
                        dd_term: bool = True):
        """Residuals of the step at the unknowns ``X = (H, μ, extra)`` (``μ`` the impulses
        ``h Λ^i``: ``i = 2..s`` nonholonomic, ``i = 1..s`` holonomic, empty otherwise;
        ``extra`` the node velocity ``ξ_{k+1}`` of the holonomic form, the stage velocities
        ``η^2..η^s`` of a nonholonomic Lagrangian not quadratic in ``ξ``, the stage momenta
        of the Hamiltonian form, else ``None``), and the step's
        :class:`~vijax.integrators._prk_core.StepOutput` ``(g_{k+1}, μ_{k+1}, ξ_{k+1}, F)``.
        ``dd_term=False`` drops the ``(dd^Lτ)*`` term (for the test that shows why it is
        there).  With holonomic constraints the state's multiplier starts at zero: it only
        seeds the predictor, every ``Λ^i`` being an unknown of each step."""
        return stage_equations(self.tableau, system.group, self.retraction, system,
                               self._mode(system), state, h, X, force, form=self.form,
                               dd_term=dd_term)

    def _predictor(self, system, state: GroupPRKState, h, mode):
        extra = ""
        if mode == "nonholonomic":
            extra = ("momenta" if self.form == "hamiltonian" else
                     "" if system.quadratic_in_velocity else "velocities")
        return predict(self.tableau, state, h, mode, extra, system=system, group=system.group,
                       retraction=self.retraction)

    def step(self, system, state: GroupPRKState, h: ScalarLike, u=None
             ) -> tuple[GroupPRKState, SolverStats]:
        mode = self._mode(system)
        force = self._force(system, state, h, u)
        X0 = self._predictor(system, state, h, mode)
        if mode == "nonholonomic":
            solver, precond = nonholonomic_solver(self.solver, self.tableau, self.form,
                                                  system.group, self.retraction, system, state,
                                                  h, X0[0])
        else:
            solver, precond = self._solver(system), None
        if mode == "free":
            at_t = system.at(state.t)
            minv = at_t.inverse_velocity_hessian(state.q, state.v)
            precond = free_precond(self.tableau, system.group, minv, state.p, state.v, h,
                                   momentum_coupling(at_t, system.group, state.q, state.v))

            def residual(H):
                return self.stage_equations(system, state, h, (H,) + X0[1:], force)

            H, out, stats = solver.solve(residual, state.misses.correct(X0)[0], precond,
                                         has_aux=True)
            X = (H,) + X0[1:]
            v1 = system.at(state.t + h).velocity(out.q, out.p, state.v)
        else:
            # the node velocity: η^s (nonholonomic) or the unknown ξ_{k+1} (holonomic), from
            # the last residual evaluation
            # holonomic: the rows g(G)/h carry round-off eps |g| / h (cons.row_round_off)
            stall = (cons.row_round_off(state.q, h, self.stages) if mode == "holonomic" else None)
            X, out, stats = solver.solve(
                lambda X: self.stage_equations(system, state, h, X, force),
                state.misses.correct(X0), precond, has_aux=True, stall_level=stall)
            v1 = None
        return next_state(state, mode, X, out, h, v1, X0=X0), stats

    def velocity(self, system, state: GroupPRKState) -> Vector:
        return state.v
