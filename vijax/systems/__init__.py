"""Systems: the :class:`LagrangianSystem` base and a catalogue of ready-made systems."""

from ._base import LagrangianSystem, MechanicalSystem, PointMassSystem
from .catalogue import (DoublePendulum, GeneralKepler, HarmonicOscillator, HenonHeiles, Kepler,
                        Pendulum)
from .constrained import CartesianPendulum, DoublePendulum3D, PolarPendulum, SphericalPendulum

__all__ = ["LagrangianSystem", "MechanicalSystem", "PointMassSystem", "HarmonicOscillator", "Pendulum",
           "DoublePendulum", "Kepler", "GeneralKepler", "HenonHeiles", "CartesianPendulum",
           "PolarPendulum", "SphericalPendulum", "DoublePendulum3D"]
