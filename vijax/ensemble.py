"""Ensembles: many initial states through one compiled, batched run.

:func:`simulate_ensemble` is :func:`vijax.simulate` under :func:`jax.vmap`, compiled once per
static configuration and run in chunks of ``batch_size`` members (:func:`jax.lax.map`), so
that an ensemble larger than the device's working memory runs in one call.  Every member
takes the same steps: under ``vmap`` the stage solver's loop runs until the slowest member of
a chunk has converged (the others are masked), which costs little because the stage loop
starts with the solver's ``min_steps`` straight-line updates and a good predictor leaves one
or two more iterations at most (``benchmarks/ensemble.py`` measures this).
"""

from __future__ import annotations

from typing import Optional

import equinox as eqx
import jax
import jax.numpy as jnp

from ._typing import ScalarLike
from .integrators import AbstractIntegrator
from .simulate import Solution, simulate
from .systems import LagrangianSystem

__all__ = ["simulate_ensemble"]


def simulate_ensemble(
    system: LagrangianSystem,
    integrator: AbstractIntegrator,
    *,
    q0,
    v0=None,
    p0=None,
    dt: ScalarLike,
    n_steps: int,
    save_every: int = 1,
    batch_size: Optional[int] = None,
    t0: ScalarLike = 0.0,
    throw: bool = True,
    project: bool = False,
    controls=None,
) -> Solution:
    """:func:`vijax.simulate` for every row of ``q0`` (shape ``(members, n)``) with the rows
    of ``v0`` or ``p0``; returns one :class:`~vijax.Solution` whose arrays have a leading
    member axis (``sol.q``: ``(members, saves, n)``).

    ``batch_size`` members run at once under :func:`jax.vmap` (default: all); larger
    ensembles run chunk after chunk inside the same compiled call (:func:`jax.lax.map`),
    which bounds the working memory to that of one chunk.  The saved states of all members
    are returned, so choose ``save_every`` for the memory they take:
    ``members * (n_steps / save_every + 1) * (3 n + stage data) * 8`` bytes in float64.

    The call compiles once per static configuration (system and integrator types, shapes,
    ``n_steps``, ``save_every``, ``batch_size``); ``dt``, ``t0``, the initial states and
    array-valued system parameters are traced, so new values reuse the compilation.  With
    ``throw=True`` a stage solve that fails in any member raises (a runtime error of the
    compiled call); with ``throw=False`` each member's ``sol.stats`` records it.
    ``controls`` (a :class:`vijax.ForcedSystem` with controls) are shared by every member, in
    any form :func:`vijax.simulate` takes; for controls that differ per member, ``jax.vmap``
    :func:`vijax.simulate` over them.  For an
    ensemble over system parameters, ``jax.vmap`` :func:`vijax.simulate` over the system
    directly.
    """
    if (v0 is None) == (p0 is None):
        raise ValueError("Give exactly one of v0 (initial velocities) and p0 (initial momenta), "
                         "each with one row per member, shaped like q0.")
    x0 = v0 if p0 is None else p0
    name = "v0" if p0 is None else "p0"
    q0, x0 = jnp.asarray(q0), jnp.asarray(x0)
    if q0.ndim != 2 or (system.ndim is not None and q0.shape[1] != system.ndim):
        n = "n" if system.ndim is None else system.ndim
        raise ValueError(f"q0 must have shape (members, {n}) for "
                         f"{type(system).__name__}, got {q0.shape}; for one trajectory call "
                         f"vijax.simulate.")
    if x0.shape != q0.shape:
        raise ValueError(f"{name} must have the shape of q0, {q0.shape}, got {x0.shape}.")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int (members per chunk), got "
                         f"{batch_size!r}.")
    dtype = q0.dtype
    return _run(system, integrator, q0, x0, jnp.asarray(dt, dtype), jnp.asarray(t0, dtype),
                name, n_steps, save_every, batch_size, throw, project, controls)


@eqx.filter_jit
def _run(system, integrator, q0, x0, dt, t0, name, n_steps, save_every, batch_size, throw,
         project, controls):
    def one(qx):
        q, x = qx
        return simulate(system, integrator, q0=q, dt=dt, t0=t0, n_steps=n_steps,
                        save_every=save_every, throw=throw, project=project,
                        controls=controls, **{name: x})

    if batch_size is None or batch_size >= q0.shape[0]:
        return jax.vmap(one)((q0, x0))
    return jax.lax.map(one, (q0, x0), batch_size=batch_size)
