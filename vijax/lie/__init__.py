"""Lie groups as configuration spaces: the interface, its members and the retractions."""

from ._base import AbstractCayleyGroup, AbstractLieGroup, AbstractMatrixLieGroup
from ._product import ProductGroup
from ._retraction import AbstractRetraction, Cayley, Exp
from ._rn import Rn
from ._se2 import SE2
from ._se3 import SE3
from ._so2 import SO2
from ._so3 import SO3

__all__ = ["AbstractLieGroup", "AbstractCayleyGroup", "AbstractMatrixLieGroup",
           "AbstractRetraction", "Exp", "Cayley", "Rn", "SO2", "SO3", "SE2", "SE3",
           "ProductGroup"]
