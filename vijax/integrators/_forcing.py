"""Forces and controls at a step's force nodes: what every family shares to take a
:class:`vijax.ForcedSystem` through the discrete Lagrange--d'Alembert principle."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .._typing import Stages, Vector
from ..quadrature import lagrange_extrapolation_matrix
from ..systems import ForcedSystem

__all__ = ["stage_controls", "stage_force", "end_force"]


def stage_controls(u, nodes: int):
    """``u`` at each of ``nodes`` force nodes: ``None`` stays ``None``, a control held over the
    step (shape ``(c,)``) is repeated, stage controls (shape ``(nodes, c)``) pass."""
    if u is None:
        return None
    u = jnp.asarray(u)
    return jnp.broadcast_to(u, (nodes,) + u.shape) if u.ndim == 1 else u


def stage_force(system, t, h, nodes: np.ndarray, u
                ) -> Optional[Callable[[Stages, Stages], Stages]]:
    """``(Q, V) -> F(t + c_i h, Q^i, V^i, U^i)`` at the force nodes ``c_i`` (fractions of the
    step), or ``None`` when ``system`` is not a :class:`vijax.ForcedSystem`."""
    if not isinstance(system, ForcedSystem):
        return None
    ts = t + h * jnp.asarray(nodes, jnp.result_type(t, h))
    U = stage_controls(u, len(nodes))
    batched = jax.vmap(system.force, in_axes=(0, 0, 0, None if U is None else 0))
    return lambda Q, V: batched(ts, Q, V, U)


def end_force(system, t, h, nodes: np.ndarray, u, q: Vector, v: Vector) -> Optional[Vector]:
    """``F(t + h, q, v, u(t + h))`` at the end of a step (``None`` for an unforced system):
    the control extrapolated to ``τ = 1`` by the polynomial through the force nodes (exact
    for held controls; ``O(h^k)`` for stage samples of a smooth control at ``k`` nodes)."""
    if not isinstance(system, ForcedSystem):
        return None
    U = stage_controls(u, len(nodes))
    if U is not None:
        U = jnp.asarray(lagrange_extrapolation_matrix(np.asarray(nodes), np.ones(1)), U.dtype) @ U
        U = U[0]
    return system.force(t + h, q, v, U)
