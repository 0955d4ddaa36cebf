"""XLA options for the programs vijax compiles itself.

A direct call of :func:`vijax.simulate` or :func:`vijax.simulate_ensemble` compiles its run
with :func:`compiler_options`; under your own :func:`jax.jit` the options of your program
apply, and you can pass the same ones (``jax.jit(f, compiler_options=vj.compiler_options())``).
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import numpy as np

__all__ = ["compiler_options"]

# XLA:CPU hands reductions (with the elementwise code that feeds them) to its YNNPACK library
# fusions once they read a few thousand elements, as a vmapped ensemble's do (members x stages
# x n ...); in float64 these ran 1.4-2.3x slower than XLA's own fused loops.  Measured on
# 1024-member ensembles, 50 steps, one process, trajectory-steps per second with the default
# options -> these (jax 0.10.2, 2-core CPU): heavy top GroupVPRK.gauss(2) Cayley 4.1e5 ->
# 8.2e5, CVT gearbox DiscreteGradient.gonzalez() 2.7e5 -> 6.3e5, SI-DLA 2.1e6 -> 4.1e6,
# Kepler VPRK.gauss(2) 6.0e6 -> 8.8e6, unicycle GroupVPRK.lobatto(3) 2.5e5 -> 3.7e5, double
# pendulum VPRK.gauss(6) 5.6e5 -> 6.1e5, chaotic NonholonomicVPRK.lobatto(3) 3.3e5 -> 3.4e5.
# Matrix products alone stay with YNNPACK (faster than XLA's: turning YNNPACK off entirely
# gave the same numbers except the chaotic system, 3.1e5).
_CPU = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


@functools.lru_cache(maxsize=None)
def _accepted(options: tuple) -> bool:
    """Whether this jaxlib's XLA knows the options (they are experimental: a version without
    them refuses the compilation)."""
    try:
        jax.jit(lambda x: x + 1, compiler_options=dict(options)).lower(np.zeros(1)).compile()
    except Exception:   # noqa: BLE001 -- any refusal means: compile without them
        return False
    return True


def compiler_options(backend: Optional[str] = None) -> dict:
    """The XLA options vijax compiles its own runs with on ``backend`` (default: JAX's
    default backend): on a CPU, reductions stay in XLA's fused loops rather than going to
    YNNPACK (several times faster for the small float64 reductions of integrators, up to
    2.3x for whole ensembles); empty elsewhere, or where this jaxlib does not know the
    option.

    Pass them to your own :func:`jax.jit` around vijax calls, e.g.
    ``jax.jit(f, compiler_options=vj.compiler_options())``: the options of the outermost
    compiled program are the ones that apply."""
    backend = jax.default_backend() if backend is None else backend
    if backend != "cpu" or not _accepted(tuple(sorted(_CPU.items()))):
        return {}
    return dict(_CPU)


def jit_options() -> dict:
    """Keyword arguments of :func:`jax.jit` for vijax's own compiled runs."""
    options = compiler_options()
    return {"compiler_options": options} if options else {}
