"""vijax.simulate_ensemble over several devices: 8 CPU devices (XLA's host platform device
count, which must be set before JAX starts its backend, hence a fresh process) give the
single-device results, the members are sharded, the devices do not communicate, and bad
``devices`` or ``system_axes`` are named with their fix."""

import os
import pathlib
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import vijax as vj
from vijax import systems as S

ROOT = pathlib.Path(__file__).resolve().parents[1]

Q0 = jnp.array([[0.5, 0.0], [0.7, 0.1], [0.9, -0.2]])
V0 = jnp.array([[0.0, 1.4], [0.1, 1.2], [-0.2, 1.0]])


def ensemble(system=S.Kepler(), **kwargs):
    return vj.simulate_ensemble(system, vj.VPRK.gauss(2), q0=Q0, v0=V0, dt=0.05, n_steps=4,
                                **kwargs)


PRELUDE = """
import re
import equinox as eqx, jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_disable_most_optimizations", True)  # as tests/conftest.py's fast_compile
import vijax as vj
from vijax import ensemble

assert jax.device_count() == 8, jax.devices()
SYSTEM, GAUSS2 = vj.systems.Kepler(), vj.VPRK.gauss(2)
k = jnp.arange(16.0)
Q0 = jnp.stack([0.5 + 0.05 * k, 0.01 * k], axis=1)
V0 = jnp.stack([0.02 * k, 1.4 - 0.03 * k], axis=1)
ARGS = dict(dt=0.05, n_steps=20, save_every=5)

def max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in [(a.q, b.q), (a.p, b.p)])
"""


def run_on_8_devices(code: str) -> None:
    # CPU devices, also where an accelerator is the default backend
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    out = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr


def test_sharded_parameter_ensemble_equals_one_device_and_runs_without_communication():
    run_on_8_devices("""
# 13 members (padded to 16 on 8 devices), each with its own mu
q0, v0, mus = Q0[:13], V0[:13], jnp.linspace(0.8, 1.2, 13)
systems = eqx.tree_at(lambda s: s.mu, SYSTEM, mus)
one = vj.simulate_ensemble(systems, GAUSS2, q0=q0, v0=v0, **ARGS, system_axes=0)
sol = vj.simulate_ensemble(systems, GAUSS2, q0=q0, v0=v0, **ARGS, system_axes=0,
                           devices="all")
assert sol.q.shape == one.q.shape == (13, 5, 2)
assert max_diff(sol, one) < 1e-14, max_diff(sol, one)
np.testing.assert_array_equal(sol.stats.iterations, one.stats.iterations)
# 13 rows cannot be split in equal blocks: the result is gathered on all 8 devices
assert len(sol.q.sharding.device_set) == 8 and sol.q.sharding.is_fully_replicated

# each member keeps its own energy |v|^2 / 2 - mu_i / |q|, and not that of mu = 1
q, v = np.asarray(sol.q), np.asarray(sol.v)
energy = lambda mu: 0.5 * np.sum(v**2, -1) - mu / np.linalg.norm(q, axis=-1)
drift = lambda E: np.max(np.abs(E - E[:, :1]))
assert drift(energy(np.asarray(mus)[:, None])) < 1e-5 < 1e-3 < drift(energy(1.0))

# each device integrates its block of 2 members, and the compiled program has no
# collective (all-gather, all-reduce, ...) anywhere, the stage solvers' loops included
mesh = ensemble._mesh("all")
params, rest = ensemble._split_system(systems, 0, 13)
members, shared = ensemble._place((params, q0, v0), (rest, GAUSS2, jnp.asarray(0.05),
                                                     jnp.asarray(0.0), None), mesh)
assert [s.data.shape for s in members[1].addressable_shards] == [(2, 2)] * 8
hlo = ensemble._runner().lower(members, shared, mesh, "v0", 20, 5, None, True,
                             False).lowered.compile().as_text()
found = re.findall(r"(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)\\(",
                   hlo)
assert not found, found

# a member that fails (near the centre of attraction) fails the call
try:
    vj.simulate_ensemble(systems, GAUSS2, q0=q0.at[5].set(jnp.array([1e-4, 0.0])), v0=v0,
                         **ARGS, system_axes=0, devices="all")
    raise AssertionError("no error")
except Exception as e:
    assert "did not converge" in str(e), e
""")


def test_ensemble_on_a_mesh_is_sharded_chunked_and_equals_single_runs():
    run_on_8_devices("""
# 16 members on a mesh, in chunks of one member per device; member 15 fails
q0 = Q0.at[15].set(jnp.array([1e-4, 0.0]))
sol = vj.simulate_ensemble(SYSTEM, GAUSS2, q0=q0, v0=V0, **ARGS, batch_size=1, throw=False,
                           devices=jax.make_mesh((8,), ("members",)))
assert sol.q.sharding.spec[0] == "members" and len(sol.q.sharding.device_set) == 8
assert [s.data.shape for s in sol.q.addressable_shards] == [(2, 5, 2)] * 8
ok = np.asarray(sol.stats.converged).all(axis=1)
assert not ok[15] and ok[:15].all(), ok
q, p = np.asarray(sol.q), np.asarray(sol.p)
for i in range(15):
    single = vj.simulate(SYSTEM, GAUSS2, q0=Q0[i], v0=V0[i], **ARGS)
    assert max(np.max(np.abs(q[i] - single.q)), np.max(np.abs(p[i] - single.p))) < 1e-14, i
""")


@pytest.mark.parametrize("devices, exc, match", [
    ("gpus", ValueError, r'devices must be None \(one device\), "all" .*got \'gpus\''),
    (jax.devices()[0], TypeError, r"a list of jax devices \(e\.g\. jax\.local_devices"),
    ([], TypeError, "devices must be None"),
    ([jax.devices()[0]] * 2, ValueError, "names a device more than once"),
    (jax.sharding.Mesh(jax.devices(), ("x",)), ValueError,
     r"Mesh with an axis named \"members\" \(e\.g\. jax\.sharding\.Mesh\(jax\.devices.*"
     r"got a mesh with axes"),
])
def test_bad_devices_names_the_fix(devices, exc, match):
    with pytest.raises(exc, match=match):
        ensemble(devices=devices)


@pytest.mark.parametrize("system, system_axes, match", [
    (S.Kepler(), 0, r"selects no array field of Kepler; .* eqx\.tree_at"),
    (eqx.tree_at(lambda s: s.mu, S.Kepler(), jnp.ones(4)), 0,
     r"Kepler\.mu has shape \(4,\), .*first axis must have length 3, the rows of q0"),
    (S.Kepler(), 1, "system_axes takes 0 .* or None .* got 1"),
    (S.Kepler(), (0, None), "pytree prefix of the system"),
])
def test_bad_system_axes_names_the_fix(system, system_axes, match):
    with pytest.raises(ValueError, match=match):
        ensemble(system, system_axes=system_axes)
