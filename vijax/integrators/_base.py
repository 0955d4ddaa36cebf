"""The integrator contract: stateless modules with ``init``/``step``.

An integrator holds only its method hyper-parameters (tableau, quadrature, solver settings);
everything that changes from step to step lives in its state, a pytree.  It declares, as
class-level traits, what it is (``order``, ``stages``, ``symplectic``) and which systems it
integrates (``system_type``, ``supported`` and ``required`` capabilities), so that
:func:`vijax.simulate` asks the integrator instead of inspecting the system, and a new family
plugs in without touching ``simulate``.
"""

from __future__ import annotations

import abc
import inspect
from typing import ClassVar

import equinox as eqx
from jaxtyping import Array, Float

from ..solvers import SolverStats
from ..systems import LagrangianSystem, capabilities

__all__ = ["AbstractIntegrator", "AbstractState", "IncompatibleSystemError", "registry",
           "accepting"]


class IncompatibleSystemError(TypeError, ValueError):
    """The integrator cannot integrate this kind of system (the message names those that can)."""


class AbstractState(eqx.Module):
    """What an integrator carries between steps.  Every state has ``t``, ``q`` and ``p``."""

    t: eqx.AbstractVar[Float[Array, ""]]
    q: eqx.AbstractVar[Float[Array, " n"]]
    p: eqx.AbstractVar[Float[Array, " n"]]


class AbstractIntegrator(eqx.Module):
    """A one-step method.  Holds only method hyper-parameters (tableau, solver settings).

    Traits, declared by each family:

    * ``order`` and ``stages`` (properties), ``symplectic`` (class variable);
    * ``system_type``: the system base the method integrates (default
      :class:`vijax.LagrangianSystem`);
    * ``supported``: the capability bases (e.g. :class:`vijax.HolonomicSystem`) it can
      handle -- a system declaring any other capability is refused;
    * ``required``: the capability bases it needs -- a system lacking one is refused;
    * :meth:`presets`: the named configurations listed in the method table and run by the
      contract test.

    :meth:`check_system` and :meth:`check_initial` are what :func:`vijax.simulate` asks before
    a run; override :meth:`check_initial` to refuse inconsistent initial data.
    """

    symplectic: ClassVar[bool] = False
    system_type: ClassVar[type] = LagrangianSystem
    supported: ClassVar[frozenset] = frozenset()
    required: ClassVar[frozenset] = frozenset()

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

    @classmethod
    def presets(cls) -> list[tuple[str, "AbstractIntegrator"]]:
        """The named presets of this family, as ``(constructor call, integrator)`` pairs."""
        return []

    # -- what the method accepts -------------------------------------------------------------
    def accepts(self, system) -> bool:
        """Whether this method integrates ``system`` (its type and declared capabilities)."""
        if not isinstance(system, self.system_type):
            return False
        caps = capabilities(system)
        return self.required <= caps <= self.supported

    def check_system(self, system) -> None:
        """Raise :class:`IncompatibleSystemError` naming why and the methods that accept it."""
        if self.accepts(system):
            return
        sysname = type(system).__name__
        if not isinstance(system, self.system_type):
            base = self.system_type.__name__
            raise IncompatibleSystemError(
                f"system must be a vijax.{base} for {self.name}, got {sysname}; subclass "
                f"vijax.{base} and implement its abstract methods.")
        else:
            caps = capabilities(system)
            extra = sorted(c.__name__ for c in caps - self.supported)
            missing = sorted(c.__name__ for c in self.required - caps)
            parts = []
            if extra:
                parts.append(f"{sysname} is a {', '.join(extra)}, which {self.name} does not "
                             f"support")
            if missing:
                parts.append(f"{self.name} needs a {', '.join(missing)}, which {sysname} is not")
            why = "; ".join(parts)
        others = accepting(system)
        fix = (f"Methods that accept it: {', '.join(others)}." if others else
               "No vijax method accepts this combination of capabilities.")
        raise IncompatibleSystemError(f"{why}. {fix}")

    def check_initial(self, system, q0, v0, tol: float) -> None:
        """Refuse inconsistent initial data (concrete values only); nothing by default."""

    # -- stepping -----------------------------------------------------------------------------
    @abc.abstractmethod
    def init(self, system, t0, q0, v0) -> AbstractState:
        """State at ``t0`` from a consistent ``(q0, v0)``."""

    @abc.abstractmethod
    def step(self, system, state: AbstractState, h) -> tuple[AbstractState, SolverStats]:
        """Advance one step of size ``h``; returns the new state and the solve statistics."""

    @abc.abstractmethod
    def velocity(self, system, state: AbstractState) -> Float[Array, " n"]:
        """The velocity ``v`` at the state's node (through the inverse Legendre map)."""


def _concrete_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        if not inspect.isabstract(sub):
            out.append(sub)
        out.extend(_concrete_subclasses(sub))
    return list(dict.fromkeys(out))


def registry() -> list[tuple[str, AbstractIntegrator]]:
    """Every preset of every integrator family, generated from the classes themselves (each
    concrete :class:`AbstractIntegrator` with :meth:`~AbstractIntegrator.presets`)."""
    return [pair for cls in _concrete_subclasses(AbstractIntegrator) for pair in cls.presets()]


def accepting(system) -> list[str]:
    """The families (with an example preset) that accept ``system``."""
    out = {}
    for call, integrator in registry():
        family = type(integrator).__name__
        if family not in out and integrator.accepts(system):
            out[family] = f"{family} (e.g. vijax.{call})"
    return list(out.values())
