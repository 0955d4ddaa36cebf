"""vijax.simulate_ensemble: batched runs equal per-member runs, chunking changes nothing,
failures are reported per member or raised, and bad input is named."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import vijax as vj
from vijax import systems as S

pytestmark = pytest.mark.fast_compile  # compile-bound: see tests/conftest.py

SYSTEM = S.Kepler()
GAUSS2 = vj.VPRK.gauss(2)
Q0 = jnp.array([[0.5, 0.0], [0.7, 0.1], [0.9, -0.2], [1.1, 0.3], [0.6, -0.4]])
V0 = jnp.array([[0.0, 1.4], [0.1, 1.2], [-0.2, 1.0], [0.0, 0.9], [0.3, 1.1]])


def ensemble(**kwargs):
    args = dict(q0=Q0, v0=V0, dt=0.05, n_steps=20, save_every=5)
    args.update(kwargs)
    return vj.simulate_ensemble(SYSTEM, GAUSS2, **args)


def test_members_equal_single_runs_and_chunks_change_nothing():
    whole = ensemble()
    assert whole.q.shape == (5, 5, 2) and whole.stats.iterations.shape == (5, 4)
    for i in range(Q0.shape[0]):
        single = vj.simulate(SYSTEM, GAUSS2, q0=Q0[i], v0=V0[i], dt=0.05, n_steps=20,
                             save_every=5)
        for a, b in [(whole.q[i], single.q), (whole.p[i], single.p), (whole.v[i], single.v)]:
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
        np.testing.assert_array_equal(whole.stats.iterations[i], single.stats.iterations)
    chunked = ensemble(batch_size=2)   # 2 + 2 + 1 members
    for a, b in [(chunked.q, whole.q), (chunked.p, whole.p), (chunked.t, whole.t)]:
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_compacted_stage_loops_with_member_parameters():
    """80 members (the stage loop compacts the members still iterating from 64 on, on a CPU)
    with a parameter per member (batched data inside the loop): members equal single runs,
    iteration counts included."""
    system = S.DoublePendulum()
    lengths = jnp.linspace(0.8, 1.2, 80)
    q0, v0 = jnp.tile(jnp.array([1.0, 1.5]), (80, 1)), jnp.zeros((80, 2))
    sol = vj.simulate_ensemble(eqx.tree_at(lambda s: s.l2, system, lengths), vj.VPRK.gauss(3),
                               q0=q0, v0=v0, dt=0.05, n_steps=40, save_every=20,
                               system_axes=S.DoublePendulum(m1=None, m2=None, l1=None, l2=0,
                                                            g=None))
    counts = np.asarray(sol.stats.iterations)
    assert counts.min() < counts.max()      # the members' loops differ
    for i in (0, 17, 79):
        single = vj.simulate(eqx.tree_at(lambda s: s.l2, system, lengths[i]), vj.VPRK.gauss(3),
                             q0=q0[i], v0=v0[i], dt=0.05, n_steps=40, save_every=20)
        np.testing.assert_allclose(sol.q[i], single.q, rtol=1e-13, atol=1e-13)
        np.testing.assert_array_equal(counts[i], single.stats.iterations)


def test_momenta_as_initial_data():
    p0 = jnp.stack([SYSTEM.momentum(q, v) for q, v in zip(Q0, V0)])
    sol = vj.simulate_ensemble(SYSTEM, GAUSS2, q0=Q0, p0=p0, dt=0.05, n_steps=20,
                               save_every=5)
    np.testing.assert_allclose(sol.q, ensemble().q, rtol=1e-12, atol=1e-12)


class ControlledKepler(vj.ForcedSystem, S.Kepler):
    """Kepler with a tangential thrust ``u`` and a little drag."""

    control_dim = 1

    def force(self, t, q, v, u):
        return u[0] * v / jnp.linalg.norm(v) - 0.01 * v


def test_controls_are_shared_by_the_members():
    system = ControlledKepler()
    thrust = lambda t: 0.1 * jnp.sin(t)[None]  # noqa: E731
    sol = vj.simulate_ensemble(system, GAUSS2, q0=Q0[:2], v0=V0[:2], dt=0.05, n_steps=20,
                               save_every=5, controls=thrust)
    for i in range(2):
        single = vj.simulate(system, GAUSS2, q0=Q0[i], v0=V0[i], dt=0.05, n_steps=20,
                             save_every=5, controls=thrust)
        np.testing.assert_allclose(sol.q[i], single.q, rtol=1e-13, atol=1e-13)
    assert np.max(np.abs(sol.q[0] - ensemble().q[0])) > 1e-4  # the thrust acts


def test_a_failed_member_is_reported_or_raises():
    # a member starting almost at the centre of attraction: its first steps cannot converge
    q0 = Q0.at[2].set(jnp.array([1e-4, 0.0]))
    sol = ensemble(q0=q0, throw=False)
    ok = np.asarray(sol.stats.converged.all(axis=1))
    assert not ok[2] and ok[[0, 1, 3, 4]].all()
    with pytest.raises(vj.ConvergenceError, match="in 1 of 5 members .the first, member 2, "
                                                  "at step 0"):
        ensemble(q0=q0)
    # under the caller's jit the check is in the graph: it cannot name the member
    with pytest.raises(Exception, match="did not converge"):
        jax.block_until_ready(jax.jit(lambda q: ensemble(q0=q).q)(q0))


def test_a_bad_member_input_is_named():
    """A member whose inputs fail one of simulate's checks (a NaN, a parameter, an initial
    velocity off the hidden constraint) is named with that check's own error; under the
    caller's jit the check runs in the graph and cannot name it."""
    q0 = np.asarray(Q0).copy()
    q0[3, 0] = np.nan
    with pytest.raises(ValueError, match=r"^member 3 of 5: q0 contains non-finite values: "
                                         r"\[nan 0\.3\]; pass finite initial coordinates\.$"):
        ensemble(q0=q0)
    v0 = np.asarray(V0).copy()
    v0[1, 1], v0[4, 0] = np.inf, np.nan
    with pytest.raises(ValueError, match=r"^member 1 of 5: v0 contains non-finite .* \(1 other "
                                         r"member has a non-finite initial state too\.\)$"):
        ensemble(v0=v0)
    with pytest.raises(eqx.EquinoxRuntimeError, match="q0 contains non-finite values"):
        jax.block_until_ready(eqx.filter_jit(lambda q: ensemble(q0=q).q)(q0))
    pend = S.Pendulum(l=jnp.array([1.0, 1.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match=r"^member 2 of 4: Pendulum.l is not finite"):
        vj.simulate_ensemble(pend, GAUSS2, q0=np.ones((4, 1)), v0=np.zeros((4, 1)), dt=0.1,
                             n_steps=2, system_axes=0)
    cq0, cv0 = np.tile([1.0, 0.0], (4, 1)), np.tile([0.0, 1.0], (4, 1))
    cv0[2, 0] = 0.5
    with pytest.raises(vj.constraints.InconsistentInitialData,
                       match=r"^member 2 of 4: v0 violates the hidden constraint"):
        vj.simulate_ensemble(S.CartesianPendulum(), vj.HolonomicVPRK.rattle(), q0=cq0, v0=cv0,
                             dt=0.1, n_steps=2)
    rotations = np.tile(np.eye(3), (3, 1, 1))
    rotations[1, 0, 0] = 1.5
    with pytest.raises(ValueError, match=r"^member 1 of 3: q0 is not an element of SO3"):
        vj.simulate_ensemble(S.HeavyTop(), vj.VRKMK.midpoint(), q0=rotations,
                             v0=np.tile([0.5, -0.3, 2.0], (3, 1)), dt=0.1, n_steps=2)


def test_a_called_ensemble_runs_a_block_per_core(monkeypatch):
    """On a CPU a called ensemble runs one block of members per core from threads (three cores
    here, 131 members: the last block padded); a traced one is one program.  Both give the
    same members, statistics included; a failed member is reported at its own index, or
    raises."""
    import vijax.ensemble as E
    monkeypatch.setattr(E, "_cores", lambda: 3)
    rng = np.random.default_rng(1)
    q0 = jnp.asarray(np.stack([rng.uniform(0.5, 1.1, 131), rng.uniform(-0.3, 0.3, 131)], 1))
    v0 = jnp.asarray(np.stack([rng.uniform(-0.2, 0.2, 131), rng.uniform(0.9, 1.4, 131)], 1))
    monkeypatch.setattr(E, "_CPU_MIN_WORK", 1)
    if jax.default_backend() == "cpu":   # elsewhere a called ensemble is one program too
        assert E._cpu_threads((None, q0, v0), 131, 20) == 2   # at least 64 members a block
    args = dict(dt=0.05, n_steps=20, save_every=5)
    called = vj.simulate_ensemble(SYSTEM, GAUSS2, q0=q0, v0=v0, **args)
    traced = jax.jit(lambda q, v: vj.simulate_ensemble(SYSTEM, GAUSS2, q0=q, v0=v, **args))(
        q0, v0)
    assert called.q.shape == traced.q.shape == (131, 5, 2)
    np.testing.assert_allclose(called.q, traced.q, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(called.stats.iterations, traced.stats.iterations)
    for i in (0, 70, 130):
        single = vj.simulate(SYSTEM, GAUSS2, q0=q0[i], v0=v0[i], **args)
        np.testing.assert_allclose(called.q[i], single.q, rtol=1e-13, atol=1e-13)
    bad = q0.at[100].set(jnp.array([1e-4, 0.0]))
    sol = vj.simulate_ensemble(SYSTEM, GAUSS2, q0=bad, v0=v0, throw=False, **args)
    ok = np.asarray(sol.stats.converged.all(axis=1))
    assert not ok[100] and ok[np.arange(131) != 100].all()
    with pytest.raises(vj.ConvergenceError, match="in 1 of 131 members .the first, member 100"):
        vj.simulate_ensemble(SYSTEM, GAUSS2, q0=bad, v0=v0, **args)
    with pytest.raises(ValueError, match="^member 120 of 131: q0 contains non-finite"):
        vj.simulate_ensemble(SYSTEM, GAUSS2, q0=q0.at[120, 1].set(np.nan), v0=v0, **args)


def test_blocks_run_one_after_the_other_where_lapack_could_deadlock(monkeypatch):
    """jaxlib 0.10's batched LAPACK kernels on CPU wait on XLA:CPU's thread pool, and two
    large ones at once (one per block thread) can hang it: a called ensemble whose program
    calls LAPACK (here the initial check's singular values) runs its blocks one after the
    other when its chunks exceed the batch measured safe (lowered to 8 members here), and
    from threads otherwise; the members are the same either way."""
    import vijax.ensemble as E
    if jax.default_backend() != "cpu":
        pytest.skip("the block threads are a CPU feature")
    used = []

    class Recording(E.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            used.append(True)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(E, "ThreadPoolExecutor", Recording)
    monkeypatch.setattr(E, "_cores", lambda: 2)
    monkeypatch.setattr(E, "_CPU_MIN_WORK", 1)
    monkeypatch.setattr(E, "_LAPACK_SAFE_BATCH", 8)
    rng = np.random.default_rng(2)
    q0 = jnp.asarray(np.stack([rng.uniform(0.5, 1.1, 130), rng.uniform(-0.3, 0.3, 130)], 1))
    v0 = jnp.asarray(np.stack([rng.uniform(-0.2, 0.2, 130), rng.uniform(0.9, 1.4, 130)], 1))
    args = dict(q0=q0, v0=v0, dt=0.05, n_steps=20, save_every=5)
    wide = vj.simulate_ensemble(SYSTEM, GAUSS2, batch_size=32, **args)
    assert bool(used) == (not E._lapack_blocks_pool())
    used.clear()
    narrow = vj.simulate_ensemble(SYSTEM, GAUSS2, batch_size=8, **args)
    assert used == [True]
    np.testing.assert_allclose(wide.q, narrow.q, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kwargs, match", [
    (dict(q0=Q0[0], v0=V0[0]), r"q0 must have shape \(members, 2\)"),
    (dict(v0=V0[:3]), r"v0 must have the shape of q0"),
    (dict(p0=V0), "exactly one of v0"),
    (dict(batch_size=0), "batch_size must be a positive int"),
])
def test_bad_input_names_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ensemble(**kwargs)


def test_direct_calls_compile_with_vijax_xla_options(monkeypatch):
    """Direct calls of simulate, simulate_ensemble and diagnostics.advance compile with
    vj.compiler_options() (an option value XLA refuses makes them fail); calls under the
    caller's jit or grad with the caller's options (the same option changes nothing there,
    and no nested jit carries options, which JAX refuses); the options are empty on a TPU
    and on a machine without a CUDA GPU, and this XLA parses every GPU option."""
    import sys

    import vijax._xla as X
    M = sys.modules["vijax.simulate"]   # the module (vijax.simulate is the function)

    assert X.compiler_options("tpu") == {}
    if not X._is_cuda():
        assert X.compiler_options("gpu") == {}
    # the option names and enum values exist (XLA parses them on any backend; a misspelt
    # command type is refused: 'BOGUS' is not a valid enum value)
    assert all(X._accepted(name, value) for name, value in X._GPU)
    assert not X._accepted("xla_gpu_enable_command_buffer", "BOGUS")
    called = ensemble(n_steps=4, save_every=1).q[:, -1]
    bad = (("xla_cpu_experimental_ynn_fusion_type", "NOT_A_FUSION_TYPE"),)
    monkeypatch.setattr(X, "_for_backend", lambda backend: bad)
    monkeypatch.setattr(M, "_JITS", {})
    monkeypatch.setattr(M, "_CHECKED", {})
    args = dict(dt=0.05, n_steps=4)
    refused = ("NOT_A_FUSION_TYPE' is not a valid enum value"   # XLA's refusal (or, in an XLA
               "|No such compile option")                       # without the option, that)
    with pytest.raises(Exception, match=refused):
        vj.simulate(SYSTEM, GAUSS2, q0=Q0[0] + 0.01, v0=V0[0], **args)
    with pytest.raises(Exception, match=refused):
        vj.simulate_ensemble(SYSTEM, GAUSS2, q0=Q0 + 0.01, v0=V0, **args)
    with pytest.raises(Exception, match=refused):
        vj.diagnostics.advance(SYSTEM, GAUSS2, Q0[1], V0[1], jnp.asarray(0.05), jnp.asarray(4))
    loss = lambda q: vj.simulate(SYSTEM, GAUSS2, q0=q, v0=V0[0], **args).q[-1, 0]  # noqa: E731
    for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
        assert np.all(np.isfinite(grad(Q0[0])))
    assert np.all(np.isfinite(jax.vmap(loss)(Q0)))
    traced = jax.jit(lambda q, v: vj.simulate_ensemble(SYSTEM, GAUSS2, q0=q, v0=v, **args).q)
    np.testing.assert_allclose(traced(Q0, V0)[:, -1], called, rtol=1e-14, atol=1e-14)


def test_cpu_options_keep_batched_reductions_out_of_library_fusions():
    """On a CPU whose XLA knows the option, vj.compiler_options() keeps a vmapped reduction
    of an ensemble's size in XLA's own fused loops (no YNNPACK library fusion in the compiled
    program), where the default options hand it over."""
    options = vj.compiler_options("cpu")
    if jax.default_backend() != "cpu" or "xla_cpu_experimental_ynn_fusion_type" not in options:
        pytest.skip("the option applies to XLA:CPU versions that know it")
    x = jnp.ones((1024, 3, 7, 7))
    f = jax.jit(lambda x: jnp.sum(jnp.sin(x), axis=2))
    assert "__ynn_fusion" not in f.lower(x).compile(compiler_options=options).as_text()
