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

The suite runs XLA:CPU's loop emitters instead of its fusion emitters (the ``XLA_FLAGS`` set in
:func:`pytest_configure` below): the same optimised HLO, compiled in about half the time.
"""

import gc
import os
import subprocess
import sys

import jax
import pytest

jax.config.update("jax_enable_x64", True)

# Persistent compilation cache: off by default, on with VIJAX_TEST_JAX_CACHE=<folder>.  It
# stays off because CI starts from a cold cache anyway (it only ever saved the compilations the
# two workers share, about 10 % of tests/test_holonomic.py).
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


# XLA:CPU's fusion emitters (its newer code generator for fused loops) take about twice as long
# to compile as the loop emitters they replace, and the suite's cost is compilation: with
# ``--xla_cpu_use_fusion_emitters=false`` the contract's heaviest programs compiled in 4.5-6.5 s
# instead of 9-11 s (GroupVPRK on the unicycle, the Gonzalez discrete gradient; two rounds).
# The flag changes how fused loops become machine code, not the optimised HLO program, so
# results move by round-off at most.  An XLA that does not know a flag aborts the process, so
# the controller first tries it in a subprocess and passes it on (pytest-xdist workers inherit
# the environment) only if that starts; VIJAX_TEST_XLA_FLAGS="" keeps XLA's defaults.
_TEST_XLA_FLAGS = os.environ.get("VIJAX_TEST_XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false")


def _xla_accepts(flags: str) -> bool:
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip(),
               JAX_PLATFORMS="cpu")
    probe = "import jax.numpy as jnp; jnp.zeros(2).block_until_ready()"
    try:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER") or not _TEST_XLA_FLAGS.strip():
        return  # a worker has the controller's environment
    if _TEST_XLA_FLAGS in os.environ.get("XLA_FLAGS", "") or not _xla_accepts(_TEST_XLA_FLAGS):
        return
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_TEST_XLA_FLAGS}".strip()


# Long-lived workers segfaulted in XLA's compiler late in full runs (two or three times per run
# of the default suite, each crashed test passing on its own).  The cause: every compiled
# program keeps its machine code in memory mappings of its own, and JAX's caches keep every
# program compiled in the process, so a worker's mapping count grows without bound (measured:
# 31 000 after tests/test_contract.py and tests/test_tstar.py in one process) until it reaches
# the kernel's limit (vm.max_map_count, 65 530 by default) and the compiler's next mapping
# fails.  So a worker whose count passes half the limit drops JAX's caches (measured: 23 400
# mappings -> 1 000); the tests that follow recompile what they need.
def _map_count_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read()) // 2
    except (OSError, ValueError):  # not Linux: no such limit to keep under
        return 0


_MAP_LIMIT = _map_count_limit()


def _map_count() -> int:
    with open("/proc/self/maps", "rb") as f:
        return sum(1 for _ in f)


def pytest_runtest_teardown(item, nextitem):
    if _MAP_LIMIT and _map_count() > _MAP_LIMIT:
        jax.clear_caches()
        gc.collect()


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


# --------------------------------------------------------------------------------------------
# The extended tier
# --------------------------------------------------------------------------------------------
# ``make test`` (the default suite) runs in under ten minutes on two cores; ``make
# test-extended`` runs the tests below with those marked ``slow``, and CI runs both on every
# change.  What moves here is a
# repeat of a check the default suite makes on a representative: another preset of a code path
# the default suite covers, another problem for the same property, or an example script run
# end to end.  Each entry names where the default suite covers the property.  (The contract
# test marks its own cases: tests/test_contract.py.)  An entry that matches no test fails
# tests/test_packaging.py, so the table cannot go stale silently.
EXTENDED = {
    # adjoints
    "test_adjoints.py::test_reverse_mode_memory_against_the_step_count":
        "memory at several step counts; the adjoints' gradients agree in the default suite",
    "test_adjoints.py::test_adjoints_give_the_same_gradient[HolonomicVPRK.rattle()]":
        "same adjoint code as the VPRK case",
    "test_adjoints.py::test_adjoints_agree_whatever_the_saves[1]":
        "save_every = 4 covers the same checkpointed layout (saves grouped into chunks), 16 the "
        "segmented one",
    # dense solves
    "test_linalg.py::test_solve_switches_to_array_code_under_vmap[7]":
        "n = 8 takes the same path (LAPACK for one system, the elimination under vmap)",
    # Lie-group PRK
    "test_group_prk.py::test_quadrotor_hovers_and_keeps_its_energy_balance":
        "forcing on a group: test_body_torques_keep_the_order_and_the_energy_balance",
    "test_group_prk.py::test_gradient_wrt_initial_velocity_and_inertia_matches_central_diff":
        "GroupVPRK gradients (initial data and a system parameter) in the contract test",
    "test_group_prk.py::test_ensembles_of_group_elements":
        "GroupVPRK under vmap in the contract test",
    "test_contract.py::test_forced_contract[GroupVPRK.lobatto(2)-heavy_top]":
        "the unicycle's forced contract and test_body_torques_keep_the_order_and_the_"
        "energy_balance (SO(3)) stay",
    "test_nonholonomic.py::test_default_fixed_point_and_simplified_newton_agree_with_newton"
    "[unicycle]": "the chaotic system stays",
    "test_group_prk.py::test_free_predictor_misses_remove_a_power_of_h_each[exp]":
        "the Cayley retraction stays (the same predictor code, another chart map)",
    "test_group_prk.py::test_free_predictor_maps_the_body_velocities_into_the_new_chart[exp]":
        "the Cayley retraction stays",
    # Lie groups
    "test_lie.py::test_taylor_branches_and_derivatives_at_zero[SE3]":
        "SO(3), whose series SE(3) reuses, and SE(2) stay",
    "test_group_prk.py::test_unicycle_orders_and_prototype_errors[4]": "s = 2, 3 stay",
    "test_group_prk.py::test_on_rn_it_is_the_nonholonomic_vprk[4]": "s = 2, 3 stay",
    # T*G methods
    "test_tstar.py::test_symplectic_in_canonical_exponential_coordinates[VRKMK.gauss2]":
        "VCG.triple_jump stays; every VRKMK preset's symplecticity in the contract test",
    "test_tstar.py::test_one_step_regression[VRKMK.gauss3]": "the other presets stay",
    "test_tstar.py::test_one_step_regression[VCG.yoshida6]": "the other presets stay",
    # long runs and example scripts
    "test_cvt_energy.py::test_cvt_long_run_example_quick": "example script",
    "test_cvt_energy.py::test_chaotic_energy_error_is_a_random_walk":
        "statistics of a 10^4-step ensemble; bounded energy errors stay",
    "test_example_fitting.py::test_fit_parameters_quick":
        "example script; gradients for fitting: test_gradients.py",
    "test_control.py::test_gradient_matches_central_differences_multiple_shooting_constrained":
        "single shooting stays; constrained gradients in the contract test",
    "test_control.py::test_cartpole_swing_up_quick":
        "example script; test_small_swing_up_reaches_the_target stays",
    "test_muehlebach2016.py::test_table_ii": "their orders and §6.1, §6.3 stay",
    # further presets of a checked code path
    "test_gradients.py::test_gradient_matches_finite_differences[double_pendulum-gauss2]":
        "Kepler stays; every family's gradients in the contract test",
    "test_dense.py::test_dense_output_passes_through_the_nodes_and_ignores_save_every"
    "[DGVI(1)-Pendulum]": "DGVI(1) on the Cartesian pendulum stays",
    "test_dense.py::test_dense_output_passes_through_the_nodes_and_ignores_save_every"
    "[GalerkinVI.gauss(1)-Pendulum]": "GalerkinVI.gauss(1) on the Cartesian pendulum stays",
    "test_galerkin.py::test_table_orders[G-s4-": "s = 1..3 stay",
    "test_galerkin.py::test_table_orders[L-s4-": "s = 1..3 stay",
    "test_holonomic.py::test_constrained_lobatto_orders[4-spring]": "s = 2, 3 stay",
    "test_holonomic.py::test_constrained_lobatto_orders[5-spring]": "s = 2, 3 stay",
    "test_vprk_numerics.py::test_energy_bounded_without_drift_kepler[gauss4]": "s <= 3 stay",
    "test_vprk_numerics.py::test_energy_bounded_without_drift_kepler[lobatto4]": "s <= 3 stay",
    "test_vprk_numerics.py::test_energy_bounded_without_drift_kepler[lobatto5]": "s <= 3 stay",
    "test_vprk_numerics.py::test_time_reversible[gauss4]": "s <= 3 stay",
    "test_vprk_numerics.py::test_time_reversible[lobatto4]": "s <= 3 stay",
    "test_vprk_numerics.py::test_time_reversible[lobatto5]": "s <= 3 stay",
}
for _tableau in ("midpoint", "stormer_verlet", "gauss3", "gauss4", "lobatto3", "lobatto4",
                 "lobatto5"):
    EXTENDED[f"test_vprk_numerics.py::test_symplecticity_defect[{_tableau}-double_pendulum]"] = (
        "every tableau on Kepler and Gauss(2) on the double pendulum stay")


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.nodeid.rsplit("/", 1)[-1]
        if any(name.startswith(key) for key in EXTENDED):
            item.add_marker(pytest.mark.extended)


def stale_extended_entries(nodeids) -> list[str]:
    """The EXTENDED entries that match none of ``nodeids`` (a full collection of the suite;
    tests/test_packaging.py checks that there are none, so the table cannot go stale)."""
    names = [nodeid.rsplit("/", 1)[-1] for nodeid in nodeids]
    return [key for key in EXTENDED if not any(name.startswith(key) for name in names)]
