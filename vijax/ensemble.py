"""Ensembles: many initial states through one compiled, batched run.

:func:`simulate_ensemble` is :func:`vijax.simulate` under :func:`jax.vmap`, compiled once per
static configuration and run in chunks of ``batch_size`` members (:func:`jax.lax.map`), so
that an ensemble larger than the device's working memory runs in one call.  Every member
takes the same steps.  Under ``vmap`` the stage solver's loop does not make a chunk wait for
its slowest member: once at most an eighth of the members are still iterating, those are
gathered into a smaller batch and finished there
(:func:`vijax.solvers.lane_compacting_while`; ``benchmarks/lane_compaction.py`` measures it).

On several devices (``devices=``) the members are sharded over a mesh axis named
``"members"`` and each device runs the same batched program on its own block under
:func:`jax.shard_map`.  The blocks do not communicate: a device's stage loops wait only for
its own members.  (Left to the partitioner, a ``jax.jit`` of the vmapped run over sharded
inputs reduces every stage loop's convergence test over all devices, and a failing
``throw=True`` check on one device leaves the others waiting in a collective.)
"""

from __future__ import annotations

import importlib.metadata
import logging
import numbers
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from . import _xla
from ._checks import is_traced
from ._typing import ScalarLike
from .integrators import AbstractIntegrator
from .simulate import (Solution, _check_values, _controls, _dtype_of, _raise_if_failed,
                       _real_scalar, _warn_narrowing, _warn_precision, simulate)
from .systems import LagrangianSystem, LieGroupSystem

__all__ = ["simulate_ensemble"]

_AXIS = "members"  # the mesh axis the member axis is sharded over

_DEVICES = (f'devices must be None (one device), "all" (every local device), a list of jax '
            f'devices (e.g. jax.local_devices()[:4]) or a jax.sharding.Mesh with an axis named '
            f'"{_AXIS}" (e.g. jax.sharding.Mesh(jax.devices(), ("{_AXIS}",)))')


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
    system_axes: Any = None,
    devices: Union[None, str, list, tuple, Mesh] = None,
) -> Solution:
    """:func:`vijax.simulate` for every row of ``q0`` (shape ``(members, n)``) with the rows
    of ``v0`` or ``p0``; returns one :class:`~vijax.Solution` whose arrays have a leading
    member axis (``sol.q``: ``(members, saves, n)``).

    ``batch_size`` members run at once under :func:`jax.vmap` (default: all); larger
    ensembles run chunk after chunk inside the same compiled call (:func:`jax.lax.map`),
    which bounds the working memory to that of one chunk.  On a CPU a called ensemble
    (concrete inputs, ``devices=None``, at least 32768 member-steps) runs one block of at least
    64 members per core, each from its own thread, in chunks of ``batch_size`` members
    (default there: 256): XLA:CPU spreads one program's large kernels over the cores at about
    half the per-core speed of narrow blocks (docs/ensembles.md).  The saved states of all members
    are returned, so choose ``save_every`` for the memory they take:
    ``members * (n_steps / save_every + 1) * (3 n + stage data) * 8`` bytes in float64.

    ``system_axes`` makes an ensemble over system parameters, like ``in_axes`` of
    :func:`jax.vmap` for the system: ``None`` (default) shares the system among the members;
    ``0`` gives every array field of the system a leading member axis (Python floats stay
    shared), e.g. ``eqx.tree_at(lambda s: s.l1, system, lengths)`` with ``lengths`` of shape
    ``(members,)``; a pytree prefix of the system with ``0`` or ``None`` at its leaves
    (``DoublePendulum(m1=None, m2=None, l1=0, l2=None, g=None)``) chooses field by field.

    ``devices`` spreads the members over several devices: ``None`` (default) runs on the
    default device; ``"all"`` on every local device (:func:`jax.local_devices`); a list of
    devices on those; a :class:`jax.sharding.Mesh` along its axis named ``"members"`` (other
    axes, if any, hold copies).  Each device runs its block of members without communicating
    with the others, in chunks of ``batch_size`` (which then bounds the working memory per
    device).  The members are padded to a multiple of the device count with copies of the
    last member, dropped from the result.  The result's arrays are sharded along the member
    axis (``NamedSharding(mesh, PartitionSpec("members"))``) when the member count is a
    multiple of the device count; otherwise they are gathered on every device, as a
    :class:`jax.Array` is sharded in equal blocks only.

    The call compiles once per static configuration (system and integrator types, shapes,
    ``n_steps``, ``save_every``, ``batch_size``, ``system_axes``, the devices); ``dt``,
    ``t0``, the initial states and array-valued system parameters are traced, so new values
    reuse the compilation.  With ``throw=True`` a stage solve that fails in any member raises
    :class:`vijax.ConvergenceError` naming the failed members and the first one's step, time
    and residual (called on concrete values; under your own ``jit``, a runtime error of the
    compiled call); with ``throw=False`` each member's ``sol.stats`` records it.  A member
    whose inputs fail a check of :func:`vijax.simulate` (a NaN in its initial state, a
    non-finite parameter) raises that check's error prefixed with the member's index
    (likewise on concrete values only).
    ``controls`` (a :class:`vijax.ForcedSystem` with controls) are shared by
    every member, in any form :func:`vijax.simulate` takes; for controls that differ per
    member, ``jax.vmap`` :func:`vijax.simulate` over them.
    """
    if (v0 is None) == (p0 is None):
        raise ValueError("Give exactly one of v0 (initial velocities) and p0 (initial momenta), "
                         "each with one row per member, shaped like q0.")
    _warn_precision(q0=q0, v0=v0, p0=p0, dt=dt)
    x0 = v0 if p0 is None else p0
    name = "v0" if p0 is None else "p0"
    if isinstance(system, LieGroupSystem):
        q0, x0 = _group_members(system, q0, jnp.asarray(x0), name)
    else:
        q0, x0 = jnp.asarray(q0), jnp.asarray(x0)
        if q0.ndim != 2 or (system.ndim is not None and q0.shape[1] != system.ndim):
            n = "n" if system.ndim is None else system.ndim
            raise ValueError(f"q0 must have shape (members, {n}) for "
                             f"{type(system).__name__}, got {q0.shape}; for one trajectory "
                             f"call vijax.simulate.")
        if x0.shape != q0.shape:
            raise ValueError(f"{name} must have the shape of q0, {q0.shape}, got {x0.shape}.")
    if batch_size is not None and (not isinstance(batch_size, numbers.Integral)
                                   or isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int (members per chunk), got "
                         f"{batch_size!r}.")
    if batch_size is not None:
        batch_size = int(batch_size)
    count = x0.shape[0]
    params, system = _split_system(system, system_axes, count)
    members = (params, q0, x0)
    # the clock in the dtype the run follows, q0's (as vijax.simulate does)
    dtype = _dtype_of(q0)
    _warn_narrowing(dtype, dt=dt, t0=t0, stacklevel=3)   # (v0 and p0: simulate warns)
    dt, t0 = _real_scalar("dt", dt, dtype), _real_scalar("t0", t0, dtype)
    shared = (system, integrator, dt, t0, controls)
    # Called on concrete values, a failed solve is reported from the statistics, naming the
    # member, the step and its time (in the graph, under the caller's jit, it is an error_if
    # that can name neither).
    concrete = not is_traced((members, shared))
    in_graph = throw and not concrete
    mesh = _mesh(devices)
    if mesh is not None:
        members, shared = _place(members, shared, mesh)
    threads = 1 if mesh is not None else _cpu_threads(members, count, n_steps)
    try:
        if threads > 1:
            sol = _run_threads(members, shared, threads, count, name, n_steps, save_every,
                               batch_size, in_graph, project)
        else:
            sol = _runner()(members, shared, mesh, name, n_steps, save_every, batch_size,
                            in_graph, project)
            if sol.q.shape[0] != count:
                sol = _unpad(sol, count, mesh)
    except (eqx.EquinoxRuntimeError, jax.errors.JaxRuntimeError):
        if concrete:   # a check on the inputs failed in a member's lane: name the member
            _refuse_member((params, q0, x0), (system, integrator, dt, t0, controls), name,
                           n_steps, project)
        raise
    if throw and concrete:
        _raise_if_failed(sol, integrator, t0, dt, save_every, members=True)
    return sol


# On a CPU a called (not traced) ensemble runs in one block of members per core, each its own
# call of the compiled program from its own thread (the XLA:CPU client runs them at once; one
# program spreads only its large kernels over the cores), each block in chunks of this many
# members unless ``batch_size`` says otherwise.  Measured on 2 cores, 4096 members, 50 steps,
# compiled with vj.compiler_options() (trajectory-steps per second, chunks of 64 / 256 / 1024 /
# the whole block of 2048): chaotic nonholonomic system, NonholonomicVPRK.lobatto(3), 6.8e5 /
# 7.7e5 / 6.3e5 / 5.9e5; Kepler, VPRK.gauss(2), 1.20e7 / 1.51e7 / 1.46e7 / 1.69e7; double
# pendulum, VPRK.gauss(6), 1.06e6 / 1.11e6 / 1.10e6 / 1.08e6; CVT gearbox,
# DiscreteGradient.gonzalez(), 1.20e6 / 1.31e6 / 1.31e6 / 1.34e6; SI-DLA 5.0e6 / 5.8e6 / 6.0e6 /
# 5.8e6; heavy top, GroupVPRK.gauss(2) Cayley, 1.50e6 / 1.68e6 / 1.69e6 / 1.63e6.  (With XLA's
# default options 64 had been best: wider chunks crossed the size from which XLA:CPU hands
# reductions to YNNPACK.)
_CPU_CHUNK = 256
_CPU_BLOCK = 64   # the fewest members a block (thread) gets


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


# ... when the run is long enough to repay the threads' fixed cost (about 1.5 ms a call: 128
# Kepler members for 10 steps took 1.6 ms called with threads against 0.15 ms as one
# program; 1024 members 2.6 ms against 1.4 ms).  Kepler, the cheapest catalogue step: 16384
# member-steps 2.5-3.1 ms called with threads against 1.5-2.2 ms as one program, 102400
# member-steps 8.2 against 13.3 ms; heavier steps repay the threads sooner.
_CPU_MIN_WORK = 1 << 15   # members x steps


def _refuse_member(members, shared, name: str, n_steps: int, project: bool) -> None:
    """Find the member whose inputs failed a check of :func:`vijax.simulate` in the batched
    run (where the check cannot say which lane failed) and raise that check's error for it,
    naming the member: the members are checked one at a time on concrete values, those with
    a non-finite initial state first."""
    params, q0, x0 = members
    system, integrator, dt, t0, controls = shared
    count = x0.shape[0]
    rows = lambda x: np.asarray(x).reshape(count, -1)  # noqa: E731
    finite = np.all(np.isfinite(np.concatenate(
        [rows(x) for x in jax.tree.leaves((q0, x0))], axis=1)), axis=1)
    for i in np.argsort(finite, kind="stable"):   # the non-finite members first
        member = jax.tree.map(lambda x: x[i], (params, q0, x0))
        one = eqx.combine(member[0], system)
        try:
            _check_values(one, integrator, q0=member[1],
                          **{"v0": None, "p0": None, name: member[2]}, dt=dt, t0=t0,
                          project=project,
                          controls=_controls(one, integrator, controls, n_steps, member[1], t0,
                                             dt))
        except Exception as e:   # the check's own error, the member named
            others = int(np.sum(~finite)) - (not finite[i])
            also = (f" ({others} other member{'s' if others > 1 else ''} ha"
                    f"{'ve' if others > 1 else 's'} a non-finite initial state too.)"
                    if others > 0 else "")
            message = f"member {int(i)} of {count}: {e}{also}"
            try:
                err = type(e)(message)
            except Exception:
                err = ValueError(message)
            raise err from None


def _cpu_threads(members, count: int, n_steps: int) -> int:
    """Blocks of members to run from threads: one per core, at least ``_CPU_BLOCK`` members
    each, on a CPU backend with concrete inputs (under a trace there is one program) and at
    least ``_CPU_MIN_WORK`` member-steps."""
    if jax.default_backend() != "cpu" or count * n_steps < _CPU_MIN_WORK:
        return 1
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(members)):
        return 1
    return max(1, min(_cores(), count // _CPU_BLOCK))


def _run_threads(members, shared, threads: int, count: int, name, n_steps, save_every,
                 batch_size, throw, project):
    """The members in ``threads`` equal blocks (padded, :func:`_pad`: one compilation), each
    run by :func:`_members_run` from its own thread, joined."""
    members = _pad(members, threads)
    per = members[2].shape[0] // threads
    blocks = [jax.tree.map(lambda x: x[i * per:(i + 1) * per], members) for i in range(threads)]
    chunk = _CPU_CHUNK if batch_size is None else batch_size
    static = (None, name, n_steps, save_every, chunk, throw, project)
    # compiled once, before the threads: called first from every thread at once, each thread
    # compiled it again (first call of a chaotic ensemble 3.9 s instead of 3.2 s).  (Running
    # the first block from this thread instead serialised it: 1.7e5 traj-steps/s, not 3.3e5.)
    run = _runner().lower(blocks[0], shared, *static).compile()

    def one(block):
        return jax.block_until_ready(run(block, shared, *static))

    # a failed check's error is raised (and its member named, simulate_ensemble); JAX's log
    # of the failed callback that carries it, a traceback printed before the error, is dropped
    # as equinox.filter_jit drops it around the calls it compiles
    quiet = _QuietCheckCallback()
    logging.getLogger("jax._src.callback").addFilter(quiet)
    try:
        if min(chunk, per) > _LAPACK_SAFE_BATCH and _blocking_lapack(run):
            return _join([one(block) for block in blocks], count)
        with ThreadPoolExecutor(threads) as pool:
            sols = list(pool.map(one, blocks))
        return _join(sols, count)
    finally:
        logging.getLogger("jax._src.callback").removeFilter(quiet)


class _QuietCheckCallback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "jax._src.callback"
                    and record.getMessage() == "jax.pure_callback failed")


#: The largest batch of a LAPACK kernel measured not to hang from two threads (below).
_LAPACK_SAFE_BATCH = 512


def _lapack_blocks_pool() -> bool:
    """Whether jaxlib's batched LAPACK kernels on CPU wait for chunks of their batch handed to
    XLA:CPU's thread pool (jaxlib 0.10): with as many of them running at once as the pool has
    threads, none of the chunks can run.  Measured with jaxlib 0.10.2 on 2 cores: a
    ``jax.jit(jax.vmap(jnp.linalg.solve))`` of 1024 8 x 8 systems called from two threads at
    once hung within 500 calls (4096 within 100), 256 did not in 500 calls; the singular
    values of 128, 256 and 512 7 x 7 matrices (the initial checks' batched SVD) did not in
    300--1000 calls; from one thread a single batched solve never hung."""
    try:
        text = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:   # a source build: JAX's own version
        text = jax.__version__
    return tuple(int(x) for x in text.split(".")[:2] if x.isdigit()) < (0, 11)


def _blocking_lapack(run) -> bool:
    """Whether the compiled ensemble program ``run`` calls a LAPACK kernel that could wait on
    the thread pool (:func:`_lapack_blocks_pool`): with chunks of more than
    ``_LAPACK_SAFE_BATCH`` members its blocks then run one after the other.  (The initial
    checks' singular values; the stage solves of more than six unknowns by
    :class:`vijax.solvers.Newton`; the full-space discrete gradient.  vijax's fixed-point
    stage solves and reduced metrics call none.)"""
    return _lapack_blocks_pool() and "lapack_" in run.compiled.as_text()


@eqx.filter_jit
def _join(sols, count: int):
    return jax.tree.map(lambda *xs: jnp.concatenate(xs)[:count], *sols)


def _group_members(system, q0, x0, name: str):
    """``q0`` of a :class:`vijax.LieGroupSystem`: group elements with a leading member axis
    (a ``(members, 3, 3)`` array of rotations, a tuple of such arrays for a product group),
    and ``x0`` of shape ``(members, d)``."""
    q0 = jax.tree.map(jnp.asarray, q0)
    identity = system.group.identity()
    element = [x.shape for x in jax.tree.leaves(identity)]
    count = x0.shape[0] if x0.ndim == 2 else None
    ok = (jax.tree.structure(q0) == jax.tree.structure(identity) and count is not None
          and all(x.shape == (count,) + e for x, e in zip(jax.tree.leaves(q0), element)))
    if not ok or x0.shape[1] != system.group.dim:
        raise ValueError(
            f"q0 must hold one element of {type(system.group).__name__} per member (shape "
            f"(members,) + {element[0] if len(element) == 1 else element}) and {name} one body velocity per member (shape (members, "
            f"{system.group.dim})), for {type(system).__name__}; got "
            f"{[x.shape for x in jax.tree.leaves(q0)]} and {x0.shape}. For one trajectory call "
            f"vijax.simulate.")
    return q0, x0


def _split_system(system, system_axes, count: int):
    """``(params, rest)``: the array fields of the system that carry a member axis and the
    rest of it (:func:`equinox.partition`; ``params`` is ``None`` without ``system_axes``)."""
    if system_axes is None:
        return None, system
    for axis in jax.tree.leaves(system_axes, is_leaf=lambda x: x is None):
        if not (axis is None or (type(axis) is int and axis == 0)):
            raise ValueError(f"system_axes takes 0 (the field carries a leading member axis) "
                             f"or None (shared by the members) at its leaves, got {axis!r}.")
    try:
        spec = jax.tree.map(lambda axis, sub: jax.tree.map(
            lambda x: axis == 0 and eqx.is_array(x), sub),
            system_axes, system, is_leaf=lambda x: x is None)
    except ValueError as e:
        raise ValueError(f"system_axes must be None, 0 or a pytree prefix of the system with 0 "
                         f"or None at its leaves (as jax.vmap's in_axes); it does not match "
                         f"{type(system).__name__}: {e}") from None
    params, rest = eqx.partition(system, spec)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    if not leaves:
        raise ValueError(f"system_axes={system_axes!r} selects no array field of "
                         f"{type(system).__name__}; a parameter that varies between members "
                         f"must be an array with a leading member axis, e.g. "
                         f"eqx.tree_at(lambda s: s.field, system, values) with values of "
                         f"shape ({count},).")
    for path, leaf in leaves:
        if leaf.ndim == 0 or leaf.shape[0] != count:
            raise ValueError(f"{type(system).__name__}{jax.tree_util.keystr(path)} has shape "
                             f"{leaf.shape}, but system_axes gives it a leading member axis: "
                             f"its first axis must have length {count}, the rows of q0.")
    return params, rest


def _mesh(devices) -> Optional[Mesh]:
    """The mesh whose ``"members"`` axis the members are sharded over, or ``None``."""
    if devices is None:
        return None
    if isinstance(devices, Mesh):
        if _AXIS not in devices.axis_names:
            raise ValueError(f"{_DEVICES}; got a mesh with axes {devices.axis_names}.")
        return devices
    if isinstance(devices, str):
        if devices != "all":
            raise ValueError(f"{_DEVICES}; got {devices!r}.")
        devices = jax.local_devices()
    if not isinstance(devices, (list, tuple)) or not devices or not all(
            isinstance(d, jax.Device) for d in devices):
        raise TypeError(f"{_DEVICES}; got {devices!r}.")
    if len(set(devices)) != len(devices):
        raise ValueError(f"{_DEVICES}; got a list that names a device more than once: "
                         f"{devices!r}.")
    return Mesh(np.asarray(devices), (_AXIS,))


def _pad(members, blocks: int):
    """The members padded to a multiple of ``blocks`` with copies of the last member (valid
    input, failing only if that member fails; dropped from the result)."""
    pad = -members[2].shape[0] % blocks
    if not pad:
        return members
    return jax.tree.map(lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]),
                        members)


def _place(members, shared, mesh: Mesh):
    """The members padded to a multiple of the devices (:func:`_pad`) and sharded along the
    mesh's ``"members"`` axis; the arrays they share, replicated."""
    members = _pad(members, mesh.shape[_AXIS])
    arrays, static = eqx.partition(shared, eqx.is_array)
    members, arrays = jax.device_put((members, arrays), (
        NamedSharding(mesh, PartitionSpec(_AXIS)), NamedSharding(mesh, PartitionSpec())))
    return members, eqx.combine(arrays, static)


@eqx.filter_jit
def _unpad(sol, count: int, mesh: Mesh):
    """The first ``count`` members, gathered on every device (not a multiple of them)."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: jax.sharding.reshard(x, replicated)[:count], sol)


def _members_run(members, shared, mesh, name, n_steps, save_every, batch_size, throw,
                 project):
    def block(members, shared):
        """The members of one device (all of them without a mesh)."""
        system, integrator, dt, t0, controls = shared

        def one(member):
            params, q, x = member
            return simulate(eqx.combine(params, system), integrator, q0=q, dt=dt, t0=t0,
                            n_steps=n_steps, save_every=save_every, throw=throw,
                            project=project, controls=controls, **{name: x})

        count = members[2].shape[0]
        if batch_size is None or batch_size >= count:
            return jax.vmap(one)(members)
        # chunks of batch_size members, vmapped, one after the other (jax.lax.map's own
        # batch_size infers reshapes with -1, which fails on zero-size state fields such as the
        # empty multiplier of an unconstrained GroupVPRK state), then the remainder
        chunks, rest = divmod(count, batch_size)
        head = jax.tree.map(lambda x: x[:chunks * batch_size].reshape(
            (chunks, batch_size) + x.shape[1:]), members)
        out = jax.lax.map(jax.vmap(one), head)
        out = jax.tree.map(lambda x: x.reshape((chunks * batch_size,) + x.shape[2:]), out)
        if rest:
            tail = jax.vmap(one)(jax.tree.map(lambda x: x[chunks * batch_size:], members))
            out = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), out, tail)
        return out

    if mesh is None:
        return block(members, shared)
    arrays, static = eqx.partition(shared, eqx.is_array)
    # check_vma=False: the blocks never communicate, so there is nothing for the check to
    # find, and the solvers' loops and conds would need pvary annotations to pass it
    return jax.shard_map(lambda m, a: block(m, eqx.combine(a, static)), mesh=mesh,
                         in_specs=(PartitionSpec(_AXIS), PartitionSpec()),
                         out_specs=PartitionSpec(_AXIS), check_vma=False)(members, arrays)


def _runner():
    """The compiled ensemble run, with vijax's XLA options where they apply (not under a
    trace: there the caller's outermost ``jax.jit`` sets them)."""
    return _xla.filter_jit(_members_run)
