"""Systems: the :class:`LagrangianSystem` base and a catalogue of ready-made systems."""

from ._base import (ForcedSystem, HolonomicSystem, LagrangianSystem, MechanicalSystem,
                    NonholonomicSystem, PointMassSystem, TimeDependentSystem)
from ._lie import LieGroupSystem
from ._capabilities import CAPABILITIES, capabilities
from .lie_rolling import BallOnTurntable, Unicycle
from .rigid import DipoleOnStick, FreeRigidBody, HeavyTop
from .vehicles import Quadrotor
from .catalogue import (DoublePendulum, GeneralKepler, HarmonicOscillator, HenonHeiles, Kepler,
                        Pendulum, ShakenPendulum)
from .nonholonomic import ChaoticNonholonomic, NonholonomicParticle
from .rolling import (ChaplyginSleigh, CVTGearbox, PendulumDrivenCVT, QuarticNonholonomic,
                      SuslovProblem, VerticalDisk)
from .constrained import (AbstractCartesianPendulum, CartesianPendulum, DoublePendulum3D, PolarPendulum,
                          RotatingHoop, SphericalPendulum)

__all__ = ["LagrangianSystem", "MechanicalSystem", "PointMassSystem", "HolonomicSystem",
           "ForcedSystem", "NonholonomicSystem", "TimeDependentSystem", "LieGroupSystem",
           "CAPABILITIES", "capabilities", "AbstractCartesianPendulum", "HarmonicOscillator", "Pendulum", "ShakenPendulum",
           "DoublePendulum", "Kepler", "GeneralKepler", "HenonHeiles", "CartesianPendulum",
           "PolarPendulum", "SphericalPendulum", "DoublePendulum3D", "RotatingHoop",
           "NonholonomicParticle", "ChaoticNonholonomic",
           "VerticalDisk", "ChaplyginSleigh", "QuarticNonholonomic", "CVTGearbox", "PendulumDrivenCVT",
           "SuslovProblem", "LieGroupSystem", "Unicycle", "BallOnTurntable",
           "FreeRigidBody", "HeavyTop", "DipoleOnStick", "Quadrotor"]
