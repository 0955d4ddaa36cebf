"""Type aliases of the public signatures (jaxtyping shapes), shared by every module.

Dimension names: ``n`` generalised coordinates, ``m`` constraints, ``s`` stages, ``k`` nodes
of a step polynomial, ``N`` steps or saved times.
"""

from __future__ import annotations

from typing import Union

from jaxtyping import Array, ArrayLike, Bool, Float, Int

__all__ = ["Scalar", "ScalarLike", "Vector", "VectorLike", "Constraints", "Matrix", "Stages",
           "Times", "Trajectory", "BoolScalar", "IntScalar", "DenseLayout"]

#: A float scalar array (a time, a step size, an energy).
Scalar = Float[Array, ""]
#: What a user may pass for a scalar: a Python float or a 0-d array.
ScalarLike = Union[float, Float[ArrayLike, ""]]
#: Generalised coordinates, velocities, momenta or forces.
Vector = Float[Array, " n"]
#: What a user may pass for a vector (a list, a NumPy or JAX array).
VectorLike = Float[ArrayLike, " n"]
#: Constraint values ``g(q)`` or multipliers.
Constraints = Float[Array, " m"]
#: A mass matrix, velocity Hessian or Jacobian block.
Matrix = Float[Array, "n n"]
#: Stage values, one row per stage.
Stages = Float[Array, "s n"]
#: Saved or requested times.
Times = Float[Array, " N"]
#: Values along a trajectory, one row per time.
Trajectory = Float[Array, "N n"]
BoolScalar = Bool[Array, ""]
IntScalar = Int[Array, ""]
#: A dense-output layout: ``name -> (nodes on [0, 1], side, pinned)``.
DenseLayout = dict[str, tuple[tuple[float, ...], str, bool]]
