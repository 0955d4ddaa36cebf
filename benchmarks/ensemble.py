"""Chaotic double-pendulum ensembles: vijax against diffrax Dopri8 at equal energy error.

The job many users come for: an ensemble of chaotic trajectories under ``jax.vmap``, run to
long times, judged by how well each member keeps its energy.  Members start at rest at
``theta1 ~ U(0.9, 1.1)``, ``theta2 ~ U(1.4, 1.6)`` (around the chaotic orbit of
``benchmarks/_problems.double_pendulum``), :class:`vijax.systems.DoublePendulum`.

Error measure: for each member the largest relative energy error over 100 evenly spaced
times in ``(0, T]``, then the root mean square over the members ("RMS energy error").

1. **Accuracy** at each final time ``T`` (default 10^3 and 10^4) on a sub-ensemble
   (``--acc-members``): vijax presets at several fixed steps (``vj.simulate_ensemble``), and
   Dopri8 at several tolerances (``rtol = atol``; diffrax, hand-written field).
2. **Throughput** for batch sizes 64 ... 4096: each configuration integrates a window of
   ``--window`` time units (best of ``--repeats`` calls after a compiling call); reported as
   trajectory-steps per second and trajectory-time-units per second.  A fixed-step method's
   cost is proportional to ``T``; an adaptive one's step density over a window of a
   stationary chaotic ensemble is that of the whole run (the accuracy runs record the steps
   over the whole of ``T``, for comparison: ``steps_per_time``), so the window's throughput
   holds for ``T``.  Under ``vmap`` the adaptive loop runs as many steps as its slowest
   member, so Dopri8's throughput at ``T`` is its measured wall time per loop step times the
   largest step count of the accuracy run over ``T`` (per unit time).  Dopri8 runs with the
   hand-written acceleration and with vijax's autodiff Euler--Lagrange field.
3. **Equal accuracy**: at each ``T``, Dopri8 at ``rtol = 1e-10`` is the anchor; the vijax
   configuration with the highest throughput whose RMS energy error at ``T`` is at most the
   anchor's gives the ratio ``vijax throughput / Dopri8 throughput`` per batch size.

Also the lane synchronisation of the stage solver under ``vmap``: per step, the iteration
count of the slowest member (what every member waits for) against the members' mean.

    python benchmarks/ensemble.py --out benchmarks/results      # -> ensemble_<platform>.json
    python benchmarks/ensemble.py --quick                       # smoke test (~1 min)

On a GPU machine the same command records the device; compare ratios, not seconds, between
machines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _problems as P  # noqa: E402

import vijax as vj  # noqa: E402

SYSTEM = vj.systems.DoublePendulum()
ANCHOR_TOL = 1e-10
# (name, integrator factory, step sizes)
VIJAX = [
    ("gauss2", lambda: vj.VPRK.gauss(2), (0.005, 0.01)),
    ("gauss3", lambda: vj.VPRK.gauss(3), (0.0075, 0.01, 0.0125, 0.015)),
    ("gauss4", lambda: vj.VPRK.gauss(4), (0.015, 0.0175, 0.02, 0.025, 0.03)),
    ("gauss6", lambda: vj.VPRK.gauss(6), (0.03, 0.035)),
]
TOLS = (1e-9, 1e-10, 1e-11, 1e-12)


def members(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q0 = np.stack([rng.uniform(0.9, 1.1, n), rng.uniform(1.4, 1.6, n)], axis=1)
    return jnp.asarray(q0), jnp.zeros((n, 2))


_energy = jax.jit(jax.vmap(jax.vmap(SYSTEM.energy)))


def rms_energy_error(q0, v0, q, v) -> float:
    e0 = np.asarray(jax.vmap(SYSTEM.energy)(q0, v0))[:, None]
    e = np.asarray(_energy(q, v))
    worst = np.max(np.abs(e - e0) / np.abs(e0), axis=1)
    return float(np.sqrt(np.mean(worst ** 2)))


def vijax_run(make, h: float, T: float, saves: int):
    n = int(round(T / h))
    n -= n % saves
    integ = make()

    def run(q0, v0):
        return vj.simulate_ensemble(SYSTEM, integ, q0=q0, v0=v0, dt=T / n, n_steps=n,
                                    save_every=n // saves, throw=False)

    return run, n


def dopri8_run(kind: str, T: float, saves: int):
    term = dfx.ODETerm(P.vector_field(SYSTEM, kind))
    ts = jnp.linspace(0.0, T, saves + 1)[1:]

    def one(y0, tol):
        sol = dfx.diffeqsolve(term, dfx.Dopri8(), 0.0, T, None, y0, saveat=dfx.SaveAt(ts=ts),
                              stepsize_controller=dfx.PIDController(rtol=tol, atol=tol),
                              max_steps=100_000_000, throw=False)
        return sol.ys, sol.stats["num_steps"], sol.result == dfx.RESULTS.successful

    run = jax.jit(jax.vmap(one, in_axes=(0, None)))

    def call(q0, v0, tol):
        return run(jnp.concatenate([q0, v0], axis=1), tol)

    return call


def timed(f, repeats: int):
    t = time.perf_counter()
    out = jax.block_until_ready(f())
    first = time.perf_counter() - t
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        out = jax.block_until_ready(f())
        best = min(best, time.perf_counter() - t)
    return out, first, best


def log(msg):
    print(msg, flush=True)


def accuracy(T: float, n_members: int, repeats_unused=None):
    q0, v0 = members(n_members)
    rows = {}
    for name, make, hs in VIJAX:
        for h in hs:
            run, n = vijax_run(make, h, T, 100)
            t = time.perf_counter()
            sol = jax.block_until_ready(run(q0, v0))
            wall = time.perf_counter() - t
            ok = bool(np.all(sol.stats.converged))
            err = rms_energy_error(q0, v0, sol.q, sol.v) if ok else float("nan")
            key = f"{name}@h={h:g}"
            rows[key] = dict(kind="vijax", preset=name, h=T / n, n_steps=n, error=err,
                             converged=ok, wall_incl_compile=wall,
                             mean_iterations=float(np.sum(sol.stats.iterations)) / n / n_members)
            log(f"  T={T:g} {key:16s} rms energy error {err:9.2e}  it/step "
                f"{rows[key]['mean_iterations']:.2f}  ({wall:.1f} s)")
    call = dopri8_run("hand-written", T, 100)
    for tol in TOLS:
        t = time.perf_counter()
        ys, steps, ok = jax.block_until_ready(call(q0, v0, tol))
        wall = time.perf_counter() - t
        ok = bool(np.all(ok))
        err = rms_energy_error(q0, v0, ys[..., :2], ys[..., 2:]) if ok else float("nan")
        key = f"dopri8@tol={tol:.0e}"
        rows[key] = dict(kind="dopri8", tol=tol, error=err, success=ok,
                         mean_steps=float(np.mean(steps)), max_steps=int(np.max(steps)),
                         steps_per_time=float(np.mean(steps)) / T, wall_incl_compile=wall)
        log(f"  T={T:g} {key:16s} rms energy error {err:9.2e}  steps/time "
            f"{rows[key]['steps_per_time']:.1f}  ({wall:.1f} s)")
    return dict(T=T, members=n_members, rows=rows)


def throughput(batches, window: float, repeats: int, configs=None, tols=TOLS):
    rows = {}
    for name, make, hs in VIJAX:
        for h in hs:
            key = f"{name}@h={h:g}"
            if configs and key not in configs:
                continue
            rows[key] = {}
            for b in batches:
                q0, v0 = members(b)
                run, n = vijax_run(make, h, window, 1)
                sol, first, best = timed(lambda: run(q0, v0), repeats)
                rows[key][b] = dict(wall=best, first_call=first, steps=n,
                                    traj_steps_per_s=b * n / best,
                                    traj_time_per_s=b * window / best,
                                    mean_iterations=float(np.sum(sol.stats.iterations)) / n / b)
                log(f"  {key:16s} batch {b:5d}: {b * n / best:10.4g} traj-steps/s  "
                    f"{b * window / best:9.4g} traj-time/s  (first call {first:.1f} s)")
    for kind in ("hand-written", "autodiff"):
        call = dopri8_run(kind, window, 1)
        for tol in tols:
            key = f"dopri8[{kind}]@tol={tol:.0e}"
            rows[key] = {}
            for b in batches:
                q0, v0 = members(b)
                (ys, steps, ok), first, best = timed(lambda: call(q0, v0, tol), repeats)
                mean_steps, max_steps = float(np.mean(steps)), int(np.max(steps))
                rows[key][b] = dict(wall=best, first_call=first, mean_steps=mean_steps,
                                    max_steps=max_steps, success=bool(np.all(ok)),
                                    wall_per_loop_step=best / max_steps,
                                    traj_steps_per_s=b * mean_steps / best,
                                    traj_time_per_s=b * window / best)
                log(f"  {key:28s} batch {b:5d}: {b * mean_steps / best:10.4g} traj-steps/s  "
                    f"{b * window / best:9.4g} traj-time/s  steps mean/max "
                    f"{mean_steps:.0f}/{max_steps}")
    return rows


def lane_sync(batch: int, window: float, repeats: int):
    """Per-step iterations of the slowest lane vs the mean over lanes, and the cost of a
    longer straight-line start (``min_steps``) of the fixed-point stage solver."""
    q0, v0 = members(batch)
    rows = {}
    for name, make, hs in VIJAX:
        h = hs[-1]
        run, n = vijax_run(make, h, window, 1)
        n_saves = n
        run_all = lambda: vj.simulate_ensemble(  # noqa: E731
            SYSTEM, make(), q0=q0, v0=v0, dt=window / n, n_steps=n, save_every=n // n_saves,
            throw=False)
        sol = jax.block_until_ready(run_all())
        it = np.asarray(sol.stats.iterations)            # (batch, steps)
        wait = float(np.sum(it.max(axis=0)) / np.sum(it.mean(axis=0)))
        typical = int(np.round(np.median(it)))
        variants = {}
        for m in sorted({2, typical - 1, typical}):
            if m < 1:
                continue
            integ = type(make())(make().tableau, solver=vj.solvers.FixedPoint(min_steps=m))
            f = lambda integ=integ: vj.simulate_ensemble(  # noqa: E731
                SYSTEM, integ, q0=q0, v0=v0, dt=window / n, n_steps=n, save_every=n,
                throw=False)
            out, _, best = timed(f, repeats)
            variants[m] = dict(wall=best, traj_steps_per_s=batch * n / best,
                               converged=bool(np.all(out.stats.converged)))
        key = f"{name}@h={h:g}"
        rows[key] = dict(batch=batch, mean_iterations=float(it.mean()),
                         slowest_lane_over_mean=wait, median_iterations=typical,
                         min_steps=variants)
        log(f"  {key:16s} batch {batch}: it/step mean {it.mean():.2f}, slowest lane / mean "
            f"{wait:.3f}; min_steps " + ", ".join(
                f"{m}: {v['traj_steps_per_s']:.4g} traj-steps/s" for m, v in variants.items()))
    return rows


def equal_accuracy(acc, thr, batches):
    out = {}
    for a in acc:
        T, rows = a["T"], a["rows"]
        anchor = rows[f"dopri8@tol={ANCHOR_TOL:.0e}"]
        ok = [k for k, r in rows.items()
              if r["kind"] == "vijax" and r["error"] <= anchor["error"] and k in thr]
        res = dict(anchor_error=anchor["error"], qualifying=ok, per_batch={})
        for b in batches:
            best = max(ok, key=lambda k: thr[k][b]["traj_time_per_s"]) if ok else None
            row = dict(vijax=best)
            density = anchor["max_steps"] / T      # loop steps per unit time over all of T
            for kind in ("hand-written", "autodiff"):
                per_step = thr[f"dopri8[{kind}]@tol={ANCHOR_TOL:.0e}"][b]["wall_per_loop_step"]
                peer = b / (per_step * density)
                row[f"ratio_vs_dopri8_{kind}"] = (
                    thr[best][b]["traj_time_per_s"] / peer if best else float("nan"))
            res["per_batch"][b] = row
        # the other way round: the best vijax throughput at any accuracy it reaches, with the
        # Dopri8 tolerance needed to match that error
        out[T] = res
        log(f"  T={T:g}: Dopri8 rtol {ANCHOR_TOL:g} RMS energy error {anchor['error']:.2e}; "
            f"vijax configurations at least as accurate: {ok or 'none'}")
        for b, row in res["per_batch"].items():
            log(f"    batch {b:5d}: best {row['vijax']}, throughput vs Dopri8 hand-written "
                f"{row['ratio_vs_dopri8_hand-written']:.2f}, autodiff "
                f"{row['ratio_vs_dopri8_autodiff']:.2f}")
    return out


def plot(res, path):
    """Throughput (trajectory-time units per second) against batch size, and the RMS energy
    error of every configuration at each final time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    thr = res["throughput"] or {}
    for key, rows in thr.items():
        bs = sorted(int(b) for b in rows)
        ys = [rows[b if b in rows else str(b)]["traj_time_per_s"] for b in bs]
        ls = "--" if key.startswith("dopri8") else "-"
        ax.loglog(bs, ys, ls, marker="o", ms=3, label=key)
    ax.set_xlabel("batch size (members)")
    ax.set_ylabel("trajectory-time units / s (window)")
    ax.set_title(f"throughput on {res['throughput_machine']['devices'][0]}")
    ax.legend(fontsize=6)
    ax = axes[1]
    for a in res["accuracy"] or []:
        keys = list(a["rows"])
        ax.semilogy(range(len(keys)), [a["rows"][k]["error"] for k in keys], "o-",
                    label=f"T = {a['T']:g}")
        ax.set_xticks(range(len(keys)), keys, rotation=70, fontsize=6)
    ax.set_ylabel("RMS over members of max relative energy error")
    ax.set_title("accuracy (double-pendulum ensemble)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine():
    return dict(platform=platform.platform(), python=platform.python_version(),
                cpu_count=os.cpu_count(), jax=jax.__version__, diffrax=dfx.__version__,
                devices=[f"{d.platform}:{d.device_kind}" for d in jax.devices()],
                xla_flags=os.environ.get("XLA_FLAGS"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: smoke test")
    ap.add_argument("--out", default=None, help="folder for ensemble_<platform>.json")
    ap.add_argument("--t-finals", default="1000,10000")
    ap.add_argument("--acc-members", type=int, default=16)
    ap.add_argument("--batches", default="64,256,1024,4096")
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", default="accuracy,throughput,sync",
                    help="comma-separated subset of accuracy, throughput, sync")
    ap.add_argument("--accuracy-from", default=None,
                    help="take the accuracy part from this earlier JSON (accuracy does not "
                         "depend on the machine; it is the slow part on a GPU)")
    ap.add_argument("--throughput-from", default=None,
                    help="take the throughput part from this earlier JSON (to combine with "
                         "--accuracy-from)")
    ap.add_argument("--configs", default=None,
                    help="vijax configurations to time, e.g. gauss3@h=0.01,gauss4@h=0.02 "
                         "(default: all)")
    ap.add_argument("--tols", default=None, help="Dopri8 tolerances to time (default: all)")
    ap.add_argument("--tag", default=None, help="output name suffix (default: the platform)")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    t_finals = [float(x) for x in args.t_finals.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    if args.quick:
        t_finals, batches, args.window, args.acc_members, args.repeats = [100.0], [64, 256], 2.0, 8, 1
    plat = jax.devices()[0].platform
    log(f"double-pendulum ensemble on {machine()['devices']}")
    t0 = time.perf_counter()
    acc = thr = eq = sync = thr_machine = None
    if args.accuracy_from:
        acc = json.loads(Path(args.accuracy_from).read_text())["accuracy"]
        log(f"[1] accuracy from {args.accuracy_from} (computed on "
            f"{json.loads(Path(args.accuracy_from).read_text())['machine']['devices']})")
    elif "accuracy" in parts:
        log("[1] accuracy")
        acc = [accuracy(T, args.acc_members) for T in t_finals]
    if args.throughput_from:
        old = json.loads(Path(args.throughput_from).read_text())
        thr = {k: {int(b): r for b, r in v.items()} for k, v in old["throughput"].items()}
        batches = sorted({b for v in thr.values() for b in v})
        args.window, thr_machine = old["window"], old["machine"]
        sync = old.get("lane_sync")
        log(f"[2] throughput from {args.throughput_from} ({old['machine']['devices']})")
    elif "throughput" in parts:
        log("[2] throughput")
        thr = throughput(batches, args.window, args.repeats,
                         configs=args.configs.split(",") if args.configs else None,
                         tols=[float(t) for t in args.tols.split(",")] if args.tols else TOLS)
    if acc and thr:
        log("[3] equal accuracy")
        eq = equal_accuracy(acc, thr, batches)
    if "sync" in parts:
        log("[4] lane synchronisation")
        sync = lane_sync(max(batches) if args.quick else 1024, args.window, args.repeats)
    res = dict(machine=machine(), throughput_machine=thr_machine or machine(), command=" ".join(sys.argv), window=args.window,
               anchor_tol=ANCHOR_TOL, accuracy=acc, throughput=thr, equal_accuracy=eq,
               lane_sync=sync, wall=time.perf_counter() - t0)
    if args.out:
        tag = args.tag or plat + ("_quick" if args.quick else "")
        path = Path(args.out) / f"ensemble_{tag}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1, default=str))
        log(f"wrote {path}")
        if res["throughput"] or res["accuracy"]:
            try:
                plot(json.loads(path.read_text()), path.with_suffix(".png"))
                log(f"wrote {path.with_suffix('.png')}")
            except ImportError:
                log("matplotlib not installed: no plot")


if __name__ == "__main__":
    main()
