"""CPU ensembles with every core as a device: vijax and diffrax Tsit5 side by side.

XLA:CPU runs one program per device and spreads only its large kernels over the cores.  With
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (set before JAX starts) each core is a
device, and an ensemble sharded over them runs one program per core.  This benchmark runs the
chaotic nonholonomic ensemble of ``benchmarks/nonholonomic.py`` part 4 (energy sheet
E0 = 3.06, T = 10) both ways, for both integrators at the pair of steps that part 4 found equally
accurate (``NonholonomicVPRK.lobatto(3)`` at h = 0.2: RMS energy error 4.3e-5; Tsit5 at
dt = 0.2: 3.0e-5), each with chunks of ``--chunks`` members (``None``: all at once):

* vijax: ``vj.simulate_ensemble(..., devices="all", batch_size=chunk)``, called as users call
  it (on one device: one block of members per core from threads, chunks of 64 by default);
* Tsit5: ``jax.vmap`` of ``diffrax.diffeqsolve`` (field:
  ``vj.constraints.nonholonomic_acceleration``) in chunks (``jax.lax.map``), under
  ``jax.shard_map`` over the same devices.

Run it once per device count (the flag cannot change inside a process):

    python benchmarks/host_devices.py --devices 1 --out benchmarks/results
    python benchmarks/host_devices.py --devices 2 --out benchmarks/results

Each run writes ``host_devices_<N>.json``; the throughput ratio vijax / Tsit5 (trajectory-time
per second, equal accuracy) is printed per configuration and for the best of each.
"""

from __future__ import annotations

import argparse
import os
import sys

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--devices", type=int, default=1)
ap.add_argument("--members", type=int, default=4096)
ap.add_argument("--chunks", default="none,64,256")
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--out", default=None)
ARGS = ap.parse_args()
if ARGS.devices > 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={ARGS.devices}")

import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import diffrax as dfx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

jax.config.update("jax_enable_x64", True)
import vijax as vj  # noqa: E402

T, H_VIJAX, DT_PEER, E0 = 10.0, 0.2, 0.2, 3.06


def best_time(fn, repeats):
    jax.block_until_ready(fn())
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return best


def peer_runner(system, chunk, mesh):
    def field(t, y, args):
        n = y.shape[-1] // 2
        return jnp.concatenate([y[n:], vj.constraints.nonholonomic_acceleration(
            system, y[:n], y[n:])[0]])

    term = dfx.ODETerm(field)

    def one(y0):
        return dfx.diffeqsolve(term, dfx.Tsit5(), 0.0, T, DT_PEER, y0,
                               saveat=dfx.SaveAt(t1=True),
                               stepsize_controller=dfx.ConstantStepSize(),
                               max_steps=int(round(T / DT_PEER)) + 2).ys[0]

    def block(y0):
        if chunk is None or chunk >= y0.shape[0]:
            return jax.vmap(one)(y0)
        out = jax.lax.map(jax.vmap(one), y0.reshape((-1, chunk) + y0.shape[1:]))
        return out.reshape((-1,) + out.shape[2:])

    if mesh is None:
        return jax.jit(block)
    return jax.jit(jax.shard_map(block, mesh=mesh, in_specs=PartitionSpec("members"),
                                 out_specs=PartitionSpec("members"), check_vma=False))


def main():
    system = vj.systems.ChaoticNonholonomic()
    integ = vj.NonholonomicVPRK.lobatto(3)
    q0, v0 = system.sample_energy_sheet(jax.random.PRNGKey(2), ARGS.members, energy=E0)
    n = int(round(T / H_VIJAX))
    devices = "all" if ARGS.devices > 1 else None
    mesh = Mesh(np.asarray(jax.devices()), ("members",)) if ARGS.devices > 1 else None
    y0 = jnp.concatenate([q0, v0], axis=1)
    rows = {}
    for c in ARGS.chunks.split(","):
        chunk = None if c == "none" else int(c)

        def vijax_call(chunk=chunk):
            return vj.simulate_ensemble(system, integ, q0=q0, v0=v0, dt=H_VIJAX, n_steps=n,
                                        save_every=n, throw=False, batch_size=chunk,
                                        devices=devices).q

        peer = peer_runner(system, chunk, mesh)
        tv = best_time(vijax_call, ARGS.repeats)
        tp = best_time(lambda: peer(y0), ARGS.repeats)
        rows[c] = dict(vijax_s=tv, tsit5_s=tp, ratio=tp / tv,
                       vijax_traj_steps_per_s=ARGS.members * n / tv,
                       tsit5_traj_steps_per_s=ARGS.members * T / DT_PEER / tp)
        print(f"devices {ARGS.devices} chunk {c:>5s}: vijax {tv:.3f} s, Tsit5 {tp:.3f} s, "
              f"vijax / Tsit5 throughput {tp / tv:.3f}", flush=True)
    bv = min(r["vijax_s"] for r in rows.values())
    bp = min(r["tsit5_s"] for r in rows.values())
    print(f"devices {ARGS.devices}: best vijax {bv:.3f} s, best Tsit5 {bp:.3f} s, "
          f"ratio {bp / bv:.3f}")
    res = dict(machine=dict(platform=platform.platform(), cpu_count=os.cpu_count(),
                            jax=jax.__version__, devices=[str(d) for d in jax.devices()]),
               command=" ".join(["python", "benchmarks/host_devices.py", *sys.argv[1:]]),
               members=ARGS.members, T=T, h_vijax=H_VIJAX, dt_tsit5=DT_PEER, rows=rows,
               best=dict(vijax_s=bv, tsit5_s=bp, ratio=bp / bv))
    if ARGS.out:
        path = Path(ARGS.out) / f"host_devices_{ARGS.devices}.json"
        path.write_text(json.dumps(res, indent=1))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
