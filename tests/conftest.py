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
import tempfile

import jax
import pytest

jax.config.update("jax_enable_x64", True)

# Persistent compilation cache: the suite compiles some programs more than once (the same
# preset and problem in several tests, in both pytest-xdist workers); measured on
# tests/test_holonomic.py, a cold cache already saves 10 % of the run.  Keys include the
# program and the compile options, so a cached executable is the one XLA would build.
# Override the folder with VIJAX_TEST_JAX_CACHE ("" turns the cache off).
#
# Only compilations of at least a second are written.  Long-lived pytest-xdist workers have
# segfaulted in XLA in seven full runs (three different tests, each passing on its own; five
# times in tests/test_holonomic.py::test_constrained_lobatto_orders).  Of the three crashes
# caught with a traceback, two were in XLA's executable serialisation for this cache
# (compilation_cache.put_executable_and_time -> executable.serialize()), one of them with this
# one-second limit in place, and one in backend_compile_and_load itself.  Writing only the expensive executables serialises far
# fewer of them; the compile-time crash is not explained (make test re-runs a crashed test).
_CACHE = os.environ.get("VIJAX_TEST_JAX_CACHE",
                        os.path.join(tempfile.gettempdir(), f"vijax-test-jax-cache-{os.getuid()}"))
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
