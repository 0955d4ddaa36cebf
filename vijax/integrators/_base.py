"""The integrator contract: stateless modules with ``init``/``step``.

An integrator holds only its method hyper-parameters (tableau, quadrature, solver settings);
everything that changes from step to step lives in its state, a pytree.  It declares, as
class-level traits, what it is (``order``, ``stages``, ``symplectic``) and which systems it
integrates (``system_type``, ``supported`` and ``required`` capabilities), so that
:func:`vijax.simulate` asks the integrator instead of inspecting the system, and a new family
plugs in without touching ``simulate``.
"""

import abc
import copy
import inspect
from typing import ClassVar, Optional

import equinox as eqx
import jax
import numpy as np
from equinox import AbstractVar
from jaxtyping import Array, Float

from .._typing import DenseLayout, ScalarLike, Stages, Vector
from ..interpolation import DenseInterpolation
from ..solvers import AbstractRootSolver, SolverStats
from ..systems import LagrangianSystem, capabilities
from ._forcing import stage_force

__all__ = ["AbstractIntegrator", "AbstractDenseIntegrator", "AbstractState",
           "IncompatibleSystemError", "registry", "accepting"]


class IncompatibleSystemError(TypeError, ValueError):
    """The integrator cannot integrate this kind of system (the message names those that can)."""


class AbstractState(eqx.Module):
    """What an integrator carries between steps.  Every state has ``t``, ``q`` and ``p``."""

    t: AbstractVar[Float[Array, ""]]
    q: AbstractVar[Float[Array, " n"]]
    p: AbstractVar[Float[Array, " n"]]

    def step_momenta(self) -> tuple[Float[Array, " n"], ...]:
        """The momentum fields the one-step map reads, in which it is symplectic: a check sets
        them all to one value and reads the first back from the new state
        (:func:`vijax.diagnostics.symplectic_forms`).  ``(p,)``; a state whose step reads
        another variable says so by overriding this."""
        return (self.p,)


class AbstractIntegrator(eqx.Module):
    """A one-step method.  Holds only method hyper-parameters (tableau, solver settings).

    Traits, declared by each family:

    * ``order`` and ``stages`` (properties), ``symplectic`` (class variable);
    * ``system_type``: the system base the method integrates (default
      :class:`vijax.LagrangianSystem`);
    * ``supported``: the capability bases (e.g. :class:`vijax.HolonomicSystem`) it can
      handle -- a system declaring any other capability is refused;
    * ``required``: the capability bases it needs -- a system lacking one is refused;
    * ``refused_because``: for a capability it does not support, why (said in the refusal);
    * :meth:`presets`: the named configurations listed in the method table and run by the
      contract test.

    :meth:`check_system` and :meth:`check_initial` are what :func:`vijax.simulate` asks before
    a run; override :meth:`check_initial` to refuse inconsistent initial data.
    """

    symplectic: ClassVar[bool] = False
    system_type: ClassVar[type] = LagrangianSystem
    supported: ClassVar[frozenset] = frozenset()
    required: ClassVar[frozenset] = frozenset()
    refused_because: ClassVar[dict] = {}

    def __check_init__(self):
        solver = getattr(self, "solver", None)  # a field of most families, never a capability
        if solver is None or isinstance(solver, AbstractRootSolver):
            return
        if isinstance(solver, type) and issubclass(solver, AbstractRootSolver):
            raise TypeError(f"{type(self).__name__}: solver={solver.__name__} is the class; pass "
                            f"an instance, e.g. solver={solver.__name__}().")
        raise TypeError(f"{type(self).__name__}: solver must be a vijax.solvers solver "
                        f"instance (e.g. vijax.solvers.Newton()), got {solver!r}.")

    @property
    @abc.abstractmethod
    def order(self) -> int:
        """Classical (global) order of the method."""

    @property
    @abc.abstractmethod
    def stages(self) -> int:
        """Stage (or unknown control-point) count per step."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def symmetric(self) -> bool:
        """Whether the method is symmetric (time reversible): its step with ``-h`` inverts its
        step with ``h`` (Hairer, Lubich & Wanner (2006), §V.1), which
        ``simulate(..., adjoint="reversible")`` relies on.  ``False`` unless the family
        says otherwise."""
        return False

    def retracing(self) -> "AbstractIntegrator":
        """This method set up to re-take a step it has just taken backwards: from the state
        its step with ``-h`` reached, the step with ``h`` returns to where that step started,
        and for a symmetric method its stage unknowns are those the step with ``-h`` found,
        in reverse order (Hairer, Lubich & Wanner (2006), §V.1), so a family that carries
        them in its state starts its solve there instead of at its predictor.
        ``simulate(..., adjoint="reversible")`` re-takes every step this way to linearise it.
        The results are those of the method itself; by default it is the method itself."""
        return self

    @classmethod
    def presets(cls) -> list[tuple[str, "AbstractIntegrator"]]:
        """The named presets of this family, as ``(constructor call, integrator)`` pairs."""
        return []

    # -- what the method accepts -------------------------------------------------------------
    def accepts(self, system: object) -> bool:
        """Whether this method integrates ``system`` (its type and declared capabilities)."""
        if not isinstance(system, self.system_type):
            return False
        caps = capabilities(system)
        return self.required <= caps <= self.supported

    def check_system(self, system: object) -> None:
        """Raise :class:`IncompatibleSystemError` naming why and the methods that accept it."""
        if self.accepts(system):
            return
        sysname = type(system).__name__
        if not isinstance(system, self.system_type):
            base = self.system_type.__name__
            why = (f"system must be a vijax.{base} for {self.name}, got {sysname} (subclass "
                   f"vijax.{base} and implement its abstract methods)")
        else:
            caps = capabilities(system)
            extra = sorted(caps - self.supported, key=lambda c: c.__name__)
            missing = sorted(c.__name__ for c in self.required - caps)
            parts = []
            if extra:
                reasons = [self.refused_because[c] for c in extra if c in self.refused_because]
                parts.append(f"{sysname} is a {', '.join(c.__name__ for c in extra)}, which "
                             f"{self.name} does not support"
                             + "".join(f" ({reason})" for reason in reasons))
            if missing:
                parts.append(f"{self.name} needs a {', '.join(missing)}, which {sysname} is not")
            why = "; ".join(parts) or f"{self.name} does not accept {sysname}"
        others = accepting(system)
        fix = (f"Methods that accept it: {', '.join(others)}." if others else
               "No vijax method accepts this combination of capabilities.")
        raise IncompatibleSystemError(f"{why}. {fix}")

    def check_initial(self, system: LagrangianSystem, q0: Vector, v0: Vector, tol: float
                      ) -> tuple[Vector, Vector]:
        """Refuse inconsistent initial data: raise on concrete values; on traced ones return
        ``(q0, v0)`` carrying run-time checks (:func:`equinox.error_if`).  Nothing to check
        by default."""
        return q0, v0

    # -- stepping -----------------------------------------------------------------------------
    @abc.abstractmethod
    def init(self, system: LagrangianSystem, t0: ScalarLike, q0: Vector, v0: Vector) -> AbstractState:
        """State at ``t0`` from a consistent ``(q0, v0)``."""

    @abc.abstractmethod
    def step(self, system: LagrangianSystem, state: AbstractState, h: ScalarLike,
             u: Optional[Array] = None) -> tuple[AbstractState, SolverStats]:
        """Advance one step of size ``h``; returns the new state and the solve statistics.

        ``u`` is the control of a :class:`vijax.ForcedSystem` over the step: shape ``(c,)``
        (held) or ``(len(force_nodes()), c)`` (one per force node); ``None`` without
        controls."""

    def force_weights(self) -> np.ndarray:
        """The quadrature weights (summing to 1) that go with :meth:`force_nodes`: a cost on
        the controls integrated with them is consistent with the method's forcing
        (:class:`vijax.control.OptimalControl`)."""
        raise NotImplementedError(f"{self.name} does not declare force_weights().")

    @abc.abstractmethod
    def force_nodes(self) -> np.ndarray:
        """The times, as fractions of the step, at which a step evaluates the force of a
        :class:`vijax.ForcedSystem` (its stage or quadrature nodes): stage controls give one
        control per node."""

    def _force(self, system, state: AbstractState, h: ScalarLike, u):
        """The step's force at the force nodes, ``(Q, V) -> F`` (``None`` for an unforced
        system): :func:`vijax.integrators.stage_force` at :meth:`force_nodes`."""
        return stage_force(system, state.t, h, self.force_nodes(), u)

    @abc.abstractmethod
    def velocity(self, system: LagrangianSystem, state: AbstractState) -> Vector:
        """The velocity ``v`` at the state's node (through the inverse Legendre map)."""


class AbstractDenseIntegrator(AbstractIntegrator):
    """An integrator whose step defines polynomials in time over the step (collocation and
    Galerkin methods): it has dense output, ``simulate(..., dense=True)`` and
    :meth:`vijax.Solution.evaluate` (the interpolation classes of :mod:`vijax.interpolation`).

    A family implements three methods: which variables it interpolates at which nodes
    (:meth:`dense_layout`), their node values at a state (:meth:`dense_knots`) and the values of
    one step's polynomials at the nodes (:meth:`dense_interval`).
    """

    @abc.abstractmethod
    def dense_layout(self, system: LagrangianSystem) -> DenseLayout:
        """``name -> (nodes, side, pinned)``: the static nodes on ``[0, 1]`` at which
        :meth:`dense_interval` gives each variable's polynomial, what is returned at a grid
        point (``"node"`` or ``"right"``, :data:`vijax.interpolation.SIDES`) and whether the
        polynomial takes the node values at ``τ = 0, 1``."""

    @abc.abstractmethod
    def dense_knots(self, system: LagrangianSystem, state: AbstractState
                    ) -> dict[str, Vector]:
        """Node values at ``state`` (``name -> (n,)``) of the variables that have them."""

    @abc.abstractmethod
    def dense_interval(self, system: LagrangianSystem, prev: AbstractState,
                       new: AbstractState, h: ScalarLike) -> dict[str, Stages]:
        """``name -> (k, n)``: the polynomials of the step ``prev -> new`` at the layout's
        nodes."""

    def interpolation(self, system: LagrangianSystem, states: AbstractState,
                      h: Optional[ScalarLike] = None) -> DenseInterpolation:
        """Dense output from states saved at every step (``simulate(..., save_every=1)``);
        ``h`` is the step size (default: the differences of ``states.t``).  ``simulate(...,
        dense=True)`` builds the same object during the run, whatever ``save_every``."""
        prev = jax.tree_util.tree_map(lambda x: x[:-1], states)
        new = jax.tree_util.tree_map(lambda x: x[1:], states)
        hs = new.t - prev.t if h is None else jax.numpy.broadcast_to(h, new.t.shape)
        values = jax.vmap(lambda a, b, hk: self.dense_interval(system, a, b, hk))(prev, new, hs)
        knots = jax.vmap(lambda st: self.dense_knots(system, st))(states)
        return DenseInterpolation.build(self.dense_layout(system), states.t, values, knots)


def with_fields(module: eqx.Module, **fields) -> eqx.Module:
    """A copy of ``module`` with the given fields replaced (static ones, like a method's
    ``retrace`` flag, or not, like its solver), its ``__init__`` not run again: the values
    are taken as they are."""
    new = copy.copy(module)
    for name, value in fields.items():
        object.__setattr__(new, name, value)
    return new


def _concrete_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        if not inspect.isabstract(sub):
            out.append(sub)
        out.extend(_concrete_subclasses(sub))
    return list(dict.fromkeys(out))


def registry() -> list[tuple[str, AbstractIntegrator]]:
    """Every preset of every integrator family, generated from the classes themselves: each
    concrete :class:`AbstractIntegrator` that defines :meth:`~AbstractIntegrator.presets`
    (a subclass that only inherits them is not a family of its own)."""
    return [pair for cls in _concrete_subclasses(AbstractIntegrator)
            if "presets" in vars(cls) for pair in cls.presets()]


def accepting(system) -> list[str]:
    """The families (with an example preset) that accept ``system``."""
    out = {}
    for call, integrator in registry():
        family = type(integrator).__name__
        if family not in out and integrator.accepts(system):
            out[family] = f"{family} (e.g. vijax.{call})"
    return list(out.values())
