"""The integrator contract: stateless modules with ``init``/``step``; all state is a pytree."""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
from jaxtyping import Array, Float

from ..solvers import SolverStats

__all__ = ["AbstractIntegrator", "AbstractState"]


class AbstractState(eqx.Module):
    """What an integrator carries between steps.  Every state has ``t``, ``q`` and ``p``."""

    t: eqx.AbstractVar[Float[Array, ""]]
    q: eqx.AbstractVar[Float[Array, " n"]]
    p: eqx.AbstractVar[Float[Array, " n"]]


class AbstractIntegrator(eqx.Module):
    """A one-step method.  Holds only method hyper-parameters (tableau, solver settings).

    Traits (class variables or properties) describe the method for tables and checks:
    ``order``, ``symplectic``, ``supports_holonomic``, ``supports_nonholonomic``.
    """

    symplectic: ClassVar[bool] = False
    supports_holonomic: ClassVar[bool] = False
    supports_nonholonomic: ClassVar[bool] = False
    requires_holonomic: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def order(self) -> int:
        """Classical (global) order of the method."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @abc.abstractmethod
    def init(self, system, t0, q0, v0) -> AbstractState:
        """State at ``t0`` from a consistent ``(q0, v0)``."""

    @abc.abstractmethod
    def step(self, system, state: AbstractState, h) -> tuple[AbstractState, SolverStats]:
        """Advance one step of size ``h``; returns the new state and the solve statistics."""

    @abc.abstractmethod
    def velocity(self, system, state: AbstractState) -> Float[Array, " n"]:
        """The velocity ``v`` at the state's node (through the inverse Legendre map)."""
