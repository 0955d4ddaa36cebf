"""XLA options for the programs vijax compiles itself.

A direct call of :func:`vijax.simulate` or :func:`vijax.simulate_ensemble` (concrete inputs,
no transformation around it) compiles its run with :func:`compiler_options`; under your own
``jax.jit``, ``jax.grad`` or ``jax.vmap`` the options of your program apply (JAX takes them
from the outermost ``jit`` only and refuses them on a nested one), and you can pass the same
ones: ``jax.jit(f, compiler_options=vj.compiler_options())``.
"""

from __future__ import annotations

import functools
from typing import Optional

import equinox as eqx
import jax
import numpy as np

from ._checks import is_traced

__all__ = ["compiler_options"]

# Each option is probed on its own (they are experimental: an XLA that does not know one
# refuses the compilation, and only that one is dropped).  Measured with jax 0.10.2 on the
# 2-core benchmark CPU, both programs alternating in one process:
#
# * ``xla_cpu_experimental_ynn_fusion_type``: XLA:CPU hands reductions (with the elementwise
#   code that feeds them) to its YNNPACK library fusions once they read a few thousand
#   elements, as a vmapped ensemble's do (members x stages x n ...); in float64 these ran
#   1.4-2.3x slower than XLA's own fused loops.  1024-member ensembles inside jit, 50 steps,
#   trajectory-steps per second, default -> this option: heavy top GroupVPRK.gauss(2) Cayley
#   4.4e5 -> 8.9e5, CVT gearbox DiscreteGradient.gonzalez() 2.8e5 -> 6.4e5, SI-DLA 2.2e6 ->
#   4.3e6, Kepler VPRK.gauss(2) 6.1e6 -> 8.9e6, unicycle GroupVPRK.lobatto(3) 2.6e5 -> 3.7e5,
#   double pendulum VPRK.gauss(6) 5.7e5 -> 6.2e5.  Matrix products alone stay with YNNPACK
#   (faster than XLA's: YNNPACK turned off entirely gave the same numbers, the chaotic
#   nonholonomic ensemble 0.9x).
# * ``xla_cpu_use_fusion_emitters=False``: XLA:CPU's loop emitters instead of its newer fusion
#   emitters for fused loops.  Compilation 1.5-2.6x faster for every benchmark case (e.g. the
#   heavy top 1.84 -> 1.11 s, the CVT Gonzalez-R 1.98 -> 1.36 s), and per step (20000 steps,
#   single trajectories): GalerkinVI.gauss(4) 0.61-0.62x, NonholonomicVPRK.lobatto(3) on the
#   CVT 0.58x, RATTLE 0.82-0.90x, the heavy top 0.81-0.86x, the ball on the turntable 0.90x,
#   Kepler 0.97-0.98x, the CVT's discrete gradients 0.93-0.95x; slower: AVF-R with the
#   system's frame 1.26-1.28x, Gonzalez-R with it 1.03-1.04x.  1024-member ensembles: Kepler
#   0.78x, chaotic 0.82x, heavy top 0.93x, CVT Gonzalez-R 0.94x, double pendulum 1.06x,
#   SI-DLA 1.21x.  Kepler's gradient 0.88-0.93x per step.
_CPU = (("xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),
        ("xla_cpu_use_fusion_emitters", False))
# On a CUDA GPU (jax 0.11.2, NVIDIA H200; benchmarks/gpu_options.py, one process per option
# set, best of five calls): XLA:GPU launches the kernels of every loop iteration one by one and
# reads the loop predicate back on the host, so an ensemble below some ten thousand members is
# bound by launches.  With the loops among the command types (XLA's defaults plus ``WHILE``
# and ``CONDITIONAL``: CUDA graphs with conditional nodes, the predicate stays on the device)
# and graphs of any size recorded (``xla_gpu_graph_min_graph_size=1``; 2 measured the same),
# ensembles of 1024 / 65536 members ran in 0.71 / 0.88x the time (Kepler VPRK.gauss(2)),
# 0.76 / 0.94x (double pendulum VPRK.gauss(6)), 0.81 / 0.96x (chaotic nonholonomic
# NonholonomicVPRK.lobatto(3)), with identical results.  With XLA's minimum graph size of 5
# the loops were slower than with no command buffers at all (Kepler 2.4x, double pendulum
# 1.7x the default time at 1024 members); ``xla_gpu_command_buffer_unroll_loops`` failed at
# run time in every program ("Command executor can be recorded into the command buffer at
# most once").
_GPU_COMMANDS = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL"
_GPU = (("xla_gpu_enable_command_buffer", _GPU_COMMANDS),
        ("xla_gpu_graph_min_graph_size", 1))


@functools.lru_cache(maxsize=None)
def _accepted(name: str, value) -> bool:
    """Whether this jaxlib's XLA knows the option (and the value)."""
    try:
        probe = jax.jit(lambda x: x + 1, compiler_options={name: value})
        probe.lower(np.zeros(1, np.float32)).compile()
    except Exception:   # noqa: BLE001 -- any refusal means: compile without it
        return False
    return True


@functools.lru_cache(maxsize=None)
def _for_backend(backend: str) -> tuple:
    """The options on ``backend`` as sorted ``(name, value)`` pairs (probed once)."""
    if backend == "cpu":
        options = _CPU
    elif backend in ("gpu", "cuda") and _is_cuda():
        options = _GPU
    else:
        return ()
    return tuple(sorted((name, value) for name, value in options if _accepted(name, value)))


def _is_cuda() -> bool:
    """Whether JAX's GPU backend is CUDA (conditional CUDA graph nodes; not ROCm)."""
    try:
        return "cuda" in jax.devices("gpu")[0].client.platform_version.lower()
    except Exception:   # noqa: BLE001 -- no GPU client, or one that does not say
        return False


def compiler_options(backend: Optional[str] = None) -> dict:
    """The XLA options vijax compiles its own runs with on ``backend`` (default: JAX's
    default backend).  On a CPU: reductions stay in XLA's fused loops rather than going to
    YNNPACK (several times faster for the small float64 reductions of integrators; up to 2.3x
    for whole ensembles), and fused loops are generated by XLA's loop emitters (compilation
    about 2x faster, most steps faster).  On a CUDA GPU: the loops (the step scan and the
    stage solve's while loop) recorded into CUDA graphs, whose loop predicates stay on the
    device (ensembles of a thousand members 1.2-1.4x faster, identical results).  Empty
    elsewhere; an option this jaxlib does not know is left out.

    Pass them to your own :func:`jax.jit` around vijax calls,
    ``jax.jit(f, compiler_options=vj.compiler_options())``: JAX applies the options of the
    outermost compiled program only."""
    return dict(_for_backend(jax.default_backend() if backend is None else backend))


try:
    from jax._src.core import trace_state_clean as _trace_state_clean
except ImportError:  # pragma: no cover - a JAX without it: stage a constant and look
    def _trace_state_clean() -> bool:
        return not is_traced(jax.lax.full((), 0))


def traced() -> bool:
    """Whether this call is being traced (by ``jit``, ``grad``, ``vmap``, ...), whatever its
    arguments.  JAX refuses compiler options on a ``jit`` called under any trace."""
    return not _trace_state_clean()


def active() -> tuple:
    """The options, as sorted ``(name, value)`` pairs, for a program vijax compiles and calls
    itself: none while tracing."""
    return () if traced() else _for_backend(jax.default_backend())


@functools.lru_cache(maxsize=None)
def _filter_jit(fn, options: tuple):
    return eqx.filter_jit(fn, compiler_options=dict(options) or None)


def filter_jit(fn):
    """:func:`equinox.filter_jit` of ``fn`` with the :func:`active` options; one compiled
    function per ``fn`` and options."""
    return _filter_jit(fn, active())
