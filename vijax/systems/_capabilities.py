"""The capability bases a system may declare (what integrators accept or require)."""

from ._base import ForcedSystem, HolonomicSystem, NonholonomicSystem, TimeDependentSystem
from ._lie import LieGroupSystem

__all__ = ["CAPABILITIES", "capabilities"]

#: The capability bases a system may declare, in the order tables list them.  A new family
#: adds its base here.  :class:`LieGroupSystem` is one: the vector-space families do not list
#: it as supported, so they refuse a system on a Lie group.
CAPABILITIES: tuple[type, ...] = (HolonomicSystem, NonholonomicSystem, ForcedSystem,
                                  TimeDependentSystem, LieGroupSystem)


def capabilities(system) -> frozenset:
    """The capability bases (members of :data:`CAPABILITIES`) ``system`` declares."""
    return frozenset(c for c in CAPABILITIES if isinstance(system, c))
