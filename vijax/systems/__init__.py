"""Systems: the :class:`LagrangianSystem` base and a catalogue of ready-made systems."""

from ._base import LagrangianSystem, MechanicalSystem
from .catalogue import (DoublePendulum, GeneralKepler, HarmonicOscillator, HenonHeiles, Kepler,
                        Pendulum)

__all__ = ["LagrangianSystem", "MechanicalSystem", "HarmonicOscillator", "Pendulum",
           "DoublePendulum", "Kepler", "GeneralKepler", "HenonHeiles"]
