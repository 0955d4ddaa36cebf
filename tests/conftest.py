"""Shared pytest configuration: the whole suite runs in float64 under strict promotion.

vijax never touches global JAX configuration (see ``vijax/__init__.py``), so the tests set it
themselves, at import time, before any array is created:

* ``jax_enable_x64``: double precision;
* ``jax_numpy_dtype_promotion = "strict"``: no implicit promotion between dtypes (a float32
  array meeting a float64 one is an error, not a silent float64 result);
* ``jax_numpy_rank_promotion = "raise"``: no implicit broadcasting between arrays of different
  ranks (``x[None, :]`` must be written out).

The library works with and without the strict flags (users run with JAX's defaults); tests
that deliberately exercise loosely written user code relax them locally with
``jax.numpy_rank_promotion("allow")`` / ``jax.numpy_dtype_promotion("standard")`` and say why.

Modules marked ``pytestmark = pytest.mark.fast_compile`` run with XLA's optimisation passes
off (``jax_disable_most_optimizations``): their cost is compiling many small programs that run
for milliseconds, and optimisation changes results by round-off only (XLA does not reassociate
floating point without fast-math).  The VPRK order and energy modules
(``test_vprk_numerics.py``), the solver tests and the paper experiments (``tests/papers/``)
keep the optimised programs users run.
"""

import os

import jax
import pytest

jax.config.update("jax_enable_x64", True)

# Persistent compilation cache: off by default, on with VIJAX_TEST_JAX_CACHE=<folder>.
#
# Long-lived pytest-xdist workers segfault in XLA now and then (twelve times in nine full
# runs; each crashed test passes on its own, and `make test` re-runs it alone).  With the
# cache on (eight runs), three of the five tracebacks were in its executable serialisation
# (compilation_cache.put_executable_and_time -> executable.serialize()); with it off (the run
# of 2026-11-25, 1374 s) both crashes were in the compiler itself (backend_compile_and_load),
# in tests/test_galerkin.py and tests/test_gradients.py.  So the cache is not the only cause;
# it stays off because CI starts from a cold cache anyway (it only ever saved the compilations
# the two workers share, about 10 % of tests/test_holonomic.py).
_CACHE = os.environ.get("VIJAX_TEST_JAX_CACHE", "")
if _CACHE:
    try:
        jax.config.update("jax_compilation_cache_dir", _CACHE)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    except AttributeError:  # a JAX without these options: run without the cache
        pass
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(autouse=True)
def _fast_compilation(request):
    if request.node.get_closest_marker("fast_compile") is None:
        yield
        return
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
