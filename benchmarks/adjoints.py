"""Reverse-mode cost and memory of vijax's adjoints against diffrax, and the reversible
adjoint's reconstruction error.

    python benchmarks/adjoints.py                  # full run, N = 1e3 ... 1e6 (~40 min, 2 cores)
    python benchmarks/adjoints.py --quick          # smoke test, N = 1e3, 1e4 (5-10 min: compiles)
    python benchmarks/adjoints.py --max-n 100000   # stop at N = 1e5 (file suffix _maxn100000)
    python benchmarks/adjoints.py --summary-only   # re-print the table and re-plot from JSON

Part a -- cost and memory.  Loss ``L(q0) = sum(q_N^2) + sum(p_N)`` after ``N`` steps of
``dt = 0.01`` (final state only), gradient with respect to ``q0``:

* vijax ``VPRK.gauss(2)`` (order 4, symplectic, implicit; default ``FixedPoint`` solver,
  implicit-function-theorem derivatives of the stage solves) through ``vj.simulate(...,
  save_every=N, adjoint=a)`` for ``a`` in ``store_all``, ``checkpointed``, ``reversible``;
* diffrax ``Tsit5`` (order 5, explicit: what a user differentiating a long trajectory with
  diffrax picks) at the same fixed step (``ConstantStepSize``, ``dt0 = dt``, ``max_steps =
  N``, ``SaveAt(t1=True)``) on the hand-written vector field (``_problems.hand_written_rhs``:
  closed-form accelerations, cheaper than vijax's autodiff Lagrangian), with
  ``RecursiveCheckpointAdjoint(checkpoints=c)`` for ``c`` = diffrax's default (``None``:
  about ``sqrt(2 N)`` with ``max_steps`` given), 10, 100 and ``N`` (every step stored).

Measured per configuration: compile time (``lower`` + ``compile`` of the jitted gradient),
memory = ``temp_size_in_bytes`` of the compiled gradient program's
``memory_analysis()`` (the scratch XLA allocates beyond arguments and outputs: the stored
residuals/checkpoints of the reverse pass), the median wall time of the jitted gradient and of
the jitted forward run (the same loss without ``grad``; vijax's ratio uses the plain
``store_all`` forward, the fastest), all timed calls interleaved round-robin over the
configurations of one ``(problem, N)`` so that background load falls on all alike (one
untimed call first for N < 1e5; 3 timed calls, 2 at N = 1e6; the process CPU time of every
call is stored next to its wall time).
vijax vs diffrax "at comparable memory": for each vijax adjoint, the fastest diffrax
configuration whose gradient needs at most the same temp memory; if none does, the diffrax
configuration with the least memory (flagged, with its memory ratio).

Part b -- reversibility.  With the step API (``integ.init``, ``integ.step``), ``N`` steps of
``+dt`` then ``N`` of ``-dt`` (``lax.fori_loop``): ``max |q_back - q0|`` and
``max |p_back - p0|`` against ``N``, next to the largest singular value of the Jacobian
``d(q_N, p_N) / d(q_0, p_0)`` (forward mode, the amplification of a perturbation over the
run): the reversible adjoint rebuilds each state by such backward steps, so it is exact to
round-off as long as ``eps * amplification`` is small.  Also, from part a, the relative
difference of the reversible (and checkpointed) gradient from the ``store_all`` one.

Part c -- the reversible adjoint anchored at the saves.  It rebuilds each block between two
saves from the saved state, so round-off grows over ``save_every`` steps at most: on the
chaotic double pendulum, 2e4 steps (T = 200), the gradient of ``sum(q_N^2)`` with
``adjoint="reversible"`` against ``"store_all"`` (relative difference) and both gradients'
time per step, for ``save_every`` = N, 1000, 200, 1.

float64, CPU, default XLA flags.  Problems: Kepler e = 0.5 from pericentre (regular) and the
double pendulum (``vj.systems.DoublePendulum``) released at rest from theta = (1.0, 1.5) rad
(chaotic; the state used by ``run.py`` and ``ensemble.py``); part b also from (2.0, 2.0) rad.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import diffrax as dfx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import vijax as vj  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _problems as P  # noqa: E402
from run import command_line, fmt, jsonable, log, machine_info, unjson  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DT = 0.01
ADJOINTS = ("store_all", "checkpointed", "reversible")
DFX_CHECKPOINTS = ("default", 10, 100, "all")
EPS = float(np.finfo(np.float64).eps)


# --------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------


def problems():
    """name -> (label, system, q0, v0)."""
    kep = P.kepler()
    dp = P.double_pendulum((1.0, 1.5))
    dp2 = P.double_pendulum((2.0, 2.0))
    return {
        "kepler": ("Kepler e = 0.5", kep.system, kep.q0, kep.v0),
        "double_pendulum": ("double pendulum theta0 = (1.0, 1.5)", dp.system, dp.q0, dp.v0),
        "double_pendulum_2": ("double pendulum theta0 = (2.0, 2.0)", dp2.system, dp2.q0,
                              dp2.v0),
    }


PART_A_PROBLEMS = ("kepler", "double_pendulum")
PART_B_PROBLEMS = ("kepler", "double_pendulum", "double_pendulum_2")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def loadavg():
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


# --------------------------------------------------------------------------------------------
# The functions measured: final state -> loss, for each method
# --------------------------------------------------------------------------------------------


def vijax_final(system, v0, n: int, adjoint: str):
    integ = vj.VPRK.gauss(2)

    def final(q0):
        sol = vj.simulate(system, integ, q0=q0, v0=v0, dt=DT, n_steps=n, save_every=n,
                          adjoint=adjoint)
        return sol.q[-1], sol.p[-1], sol.mean_iterations

    return final


def diffrax_final(system, v0, n: int, checkpoints):
    f = P.hand_written_rhs(system)
    term = dfx.ODETerm(lambda t, y, args: f(y))
    c = None if checkpoints == "default" else (n if checkpoints == "all" else int(checkpoints))
    adjoint = dfx.RecursiveCheckpointAdjoint(checkpoints=c)
    k = v0.shape[0]

    def final(q0):
        y0 = jnp.concatenate([q0, v0])
        sol = dfx.diffeqsolve(term, dfx.Tsit5(), 0.0, n * DT, DT, y0,
                              saveat=dfx.SaveAt(t1=True),
                              stepsize_controller=dfx.ConstantStepSize(), max_steps=n,
                              adjoint=adjoint)
        y = sol.ys[-1]
        q, v = y[:k], y[k:]
        return q, system.momentum(q, v), sol.stats["num_steps"]

    return final


def loss_of(final):
    def loss(q0):
        q, p, _ = final(q0)
        return jnp.sum(q * q) + jnp.sum(p)

    return loss


def compiled(fn, x, options=None):
    """AOT-compiled ``jax.jit(fn)`` at ``x`` with the XLA ``options``; (executable, lower s,
    compile s, temp bytes, argument+output bytes)."""
    t0 = time.perf_counter()
    low = jax.jit(fn).lower(x)
    t1 = time.perf_counter()
    exe = low.compile(compiler_options=options or None)
    t2 = time.perf_counter()
    mem = exe.memory_analysis()
    temp = int(mem.temp_size_in_bytes) if mem is not None else None
    io = (int(mem.argument_size_in_bytes + mem.output_size_in_bytes) if mem is not None
          else None)
    return exe, t1 - t0, t2 - t1, temp, io


def call(exe, x):
    t0 = time.perf_counter()
    c0 = time.process_time()
    out = jax.block_until_ready(exe(x))
    return out, time.perf_counter() - t0, time.process_time() - c0


# --------------------------------------------------------------------------------------------
# Part a: cost and memory
# --------------------------------------------------------------------------------------------


def part_a(cfg, save=lambda partial: None):
    probs = problems()
    out = {}
    for name in cfg["problems"]:
        label, system, q0, v0 = probs[name]
        rows = []
        for n in cfg["ns"]:
            t_n = time.perf_counter()
            repeats = cfg["repeats"] if n < cfg["large_n"] else cfg["repeats_large"]
            log(f"[a] {name} N = {n:.0e}: compiling ...")
            confs = []  # (key, library, adjoint label, fwd exe, grad exe, info)
            for a in ADJOINTS:
                final = vijax_final(system, v0, n, a)
                confs.append(("vijax/" + a, "vijax", a, final))
            for c in cfg["checkpoints"]:
                final = diffrax_final(system, v0, n, c)
                confs.append((f"diffrax/{c}", "diffrax", c, final))
            entries = []
            for key, lib, adj, final in confs:
                e = dict(key=key, library=lib, adjoint=adj, n=n, loadavg_compile=loadavg())
                # a forward run per vijax adjoint (the denominator is store_all's); diffrax's
                # forward does not depend on the number of checkpoints: timed once
                need_fwd = lib == "vijax" or adj == cfg["checkpoints"][0]
                # vijax as its docs tell users to compile it; diffrax with XLA's defaults
                options = P.vijax_options() if lib == "vijax" else None
                if need_fwd:
                    fexe, flow, fcomp, ftemp, _ = compiled(final, q0, options)
                    e.update(fwd_lower_s=flow, fwd_compile_s=fcomp, fwd_temp_bytes=ftemp)
                else:
                    fexe = None
                gexe, glow, gcomp, gtemp, gio = compiled(jax.grad(loss_of(final)), q0, options)
                e.update(grad_lower_s=glow, grad_compile_s=gcomp, grad_temp_bytes=gtemp,
                         grad_io_bytes=gio)
                log(f"    {key:22s} grad temp {gtemp / 1e6:9.4f} MB, compile "
                    f"{glow + gcomp:5.1f} s")
                entries.append((e, fexe, gexe))
            # first (untimed) calls: results, and allocation effects out of the timings
            for e, fexe, gexe in entries:
                if fexe is not None:
                    (q, p, extra), w, _ = call(fexe, q0)
                    e["fwd_first_s"] = w
                    e["q_final"], e["p_final"] = np.asarray(q), np.asarray(p)
                    if e["library"] == "vijax":
                        e["mean_iterations"] = float(extra)
                    else:
                        e["num_steps"] = int(extra)
                        assert int(extra) == n, (extra, n)
                if n < cfg["no_warm_from"]:
                    g, w, _ = call(gexe, q0)
                    e["grad_first_s"] = w
                    e["grad"] = np.asarray(g)
            # timed calls, round-robin
            for r in range(repeats):
                for e, fexe, gexe in entries:
                    if fexe is not None:
                        _, w, c = call(fexe, q0)
                        e.setdefault("fwd_wall", []).append(w)
                        e.setdefault("fwd_cpu", []).append(c)
                    g, w, c = call(gexe, q0)
                    e.setdefault("grad_wall", []).append(w)
                    e.setdefault("grad_cpu", []).append(c)
                    e["grad"] = np.asarray(g)
            for e, _, _ in entries:
                for k in ("fwd", "grad"):
                    if f"{k}_wall" in e:
                        e[f"{k}_s"] = float(np.median(e[f"{k}_wall"]))
                        e[f"{k}_cpu_s"] = float(np.median(e[f"{k}_cpu"]))
                        e[f"{k}_wall_min_s"] = float(np.min(e[f"{k}_wall"]))
                e["loadavg_end"] = loadavg()
                rows.append(e)
            del entries
            derive(rows, n)
            log(f"[a] {name} N = {n:.0e} done in {time.perf_counter() - t_n:.1f} s")
            for line in table_rows(rows, n):
                log("    " + line)
            save({**out, name: dict(label=label, dt=DT, rows=rows, partial=True)})
        out[name] = dict(label=label, q0=np.asarray(q0), v0=np.asarray(v0), dt=DT,
                         rows=rows, accuracy=accuracy(name, system, q0, v0, rows))
    return out


def derive(rows, n):
    """Ratios of one N: grad / forward, gradient differences, memory-paired time ratios."""
    here = [r for r in rows if r["n"] == n]
    by = {r["key"]: r for r in here}
    v_fwd = by["vijax/store_all"]["fwd_s"]
    v_fwd_cpu = by["vijax/store_all"]["fwd_cpu_s"]
    d_fwd_row = next(r for r in here if r["library"] == "diffrax" and "fwd_s" in r)
    d_fwd, d_fwd_cpu = d_fwd_row["fwd_s"], d_fwd_row["fwd_cpu_s"]
    g_ref = np.asarray(by["vijax/store_all"]["grad"])
    gd_ref = np.asarray(by[f"diffrax/{DFX_CHECKPOINTS[-1]}"]["grad"]) if \
        f"diffrax/{DFX_CHECKPOINTS[-1]}" in by else None
    for r in here:
        fwd, fwd_cpu = (v_fwd, v_fwd_cpu) if r["library"] == "vijax" else (d_fwd, d_fwd_cpu)
        r["forward_ref_s"] = fwd
        r["grad_over_fwd"] = r["grad_s"] / fwd
        r["grad_over_fwd_cpu"] = r["grad_cpu_s"] / fwd_cpu
        g = np.asarray(r["grad"])
        ref = g_ref if r["library"] == "vijax" else gd_ref
        r["grad_finite"] = bool(np.all(np.isfinite(g)))
        r["grad_norm"] = float(np.linalg.norm(g))
        if ref is not None and np.all(np.isfinite(ref)) and np.all(np.isfinite(g)):
            r["grad_rel_diff_vs_store_all"] = float(np.linalg.norm(g - ref)
                                                    / np.linalg.norm(ref))
        else:
            r["grad_rel_diff_vs_store_all"] = None
    dfx_rows = [r for r in here if r["library"] == "diffrax"]
    for r in here:
        if r["library"] != "vijax":
            continue
        fits = [d for d in dfx_rows if d["grad_temp_bytes"] <= r["grad_temp_bytes"]]
        if fits:
            d = min(fits, key=lambda d: d["grad_s"])
            flag = "diffrax within vijax's memory"
        else:
            d = min(dfx_rows, key=lambda d: d["grad_temp_bytes"])
            flag = "no diffrax config fits: its least-memory one"
        r["paired_diffrax"] = d["key"]
        r["paired_rule"] = flag
        r["paired_mem_ratio"] = d["grad_temp_bytes"] / r["grad_temp_bytes"]
        r["diffrax_over_vijax_grad_time"] = d["grad_s"] / r["grad_s"]
        r["diffrax_over_vijax_grad_cpu"] = d["grad_cpu_s"] / r["grad_cpu_s"]


def accuracy(name, system, q0, v0, rows):
    """Final-state accuracy of the two methods per N: |dE| and, for Kepler, the max-norm
    error of (q, p) against Kepler's equation (so that the two are of comparable accuracy)."""
    e0 = float(system.energy(q0, v0))
    out = []
    for n in sorted({r["n"] for r in rows}):
        for key in ("vijax/store_all", f"diffrax/{DFX_CHECKPOINTS[0]}"):
            r = next((r for r in rows if r["n"] == n and r["key"] == key), None)
            if r is None or "q_final" not in r:
                continue
            q, p = jnp.asarray(r["q_final"]), jnp.asarray(r["p_final"])
            v = system.velocity(q, p)
            item = dict(n=n, method=r["library"], energy_error=abs(float(system.energy(q, v))
                                                                    - e0))
            if name == "kepler":
                qe, ve = P.kepler_exact(n * DT, 0.5)
                item["state_error"] = float(max(np.max(np.abs(np.asarray(q) - qe)),
                                                np.max(np.abs(np.asarray(p) - ve))))
            out.append(item)
    return out


# --------------------------------------------------------------------------------------------
# Part b: reversibility of the steps
# --------------------------------------------------------------------------------------------


def part_b(cfg):
    probs = problems()
    integ = vj.VPRK.gauss(2)
    out = {}
    for name in cfg["problems_b"]:
        label, system, q0, v0 = probs[name]
        n_max = max(cfg["ns_b"])

        def there_and_back(q0, v0, n):
            s0 = integ.init(system, 0.0, q0, v0)

            def fwd(i, c):
                s, ok = c
                s, st = integ.step(system, s, DT)
                return s, ok & st.converged

            def bwd(i, c):
                s, ok = c
                s, st = integ.step(system, s, -DT)
                return s, ok & st.converged

            s1, ok1 = jax.lax.fori_loop(0, n, fwd, (s0, jnp.asarray(True)))
            s2, ok2 = jax.lax.fori_loop(0, n, bwd, (s1, jnp.asarray(True)))
            return s0.q, s0.p, s1.q, s1.p, s2.q, s2.p, ok1 & ok2

        rt = jax.jit(there_and_back)
        p0 = system.momentum(q0, v0)

        def flow(x, n):
            k = q0.shape[0]
            s = integ.init(system, 0.0, x[:k], system.velocity(x[:k], x[k:]))
            s = jax.lax.fori_loop(0, n, lambda i, s: integ.step(system, s, DT)[0], s)
            return jnp.concatenate([s.q, s.p])

        jac = jax.jit(jax.jacfwd(flow))
        x0 = jnp.concatenate([q0, p0])
        rows = []
        t0 = time.perf_counter()
        for n in cfg["ns_b"]:
            nn = jnp.asarray(n, jnp.int32)
            a0, b0, q1, p1, q2, p2, ok = jax.block_until_ready(rt(q0, v0, nn))
            J = np.asarray(jac(x0, nn))
            amp = float(np.linalg.svd(J, compute_uv=False)[0]) if np.all(np.isfinite(J)) \
                else float("inf")
            rows.append(dict(
                n=n, t=n * DT, converged=bool(ok),
                q_back_err=float(np.max(np.abs(np.asarray(q2) - np.asarray(a0)))),
                p_back_err=float(np.max(np.abs(np.asarray(p2) - np.asarray(b0)))),
                amplification=amp, eps_times_amplification=EPS * amp))
            r = rows[-1]
            log(f"[b] {name:18s} N = {n:8d}: |q_back - q0| = {r['q_back_err']:.2e}, "
                f"|p_back - p0| = {r['p_back_err']:.2e}, amplification {amp:.2e}")
        first = {}
        for tol in (1e-12, 1e-8, 1e-4):
            bad = [r["n"] for r in rows if not (max(r["q_back_err"], r["p_back_err"]) <= tol)]
            first[f"{tol:g}"] = bad[0] if bad else None
        out[name] = dict(label=label, q0=np.asarray(q0), v0=np.asarray(v0), dt=DT, rows=rows,
                         first_n_above=first, seconds=time.perf_counter() - t0)
    return out


def part_c(cfg):
    """The reversible adjoint rebuilds each block between two saves from the saved state:
    its gradient's difference from store_all's, and both gradients' time per step, against
    ``save_every`` on the chaotic double pendulum."""
    _, system, q0, v0 = problems()["double_pendulum"]
    n = cfg["n_c"]
    rows = []
    for every in cfg["save_every_c"]:
        def loss(x, adjoint):
            sol = vj.simulate(system, vj.VPRK.gauss(2), q0=q0 * x, v0=v0, dt=DT, n_steps=n,
                              save_every=every, adjoint=adjoint)
            return jnp.sum(sol.q[-1] ** 2)

        row = dict(save_every=every, n=n)
        for adjoint in ("store_all", "reversible"):
            exe = compiled(jax.grad(lambda x: loss(x, adjoint)), jnp.asarray(1.0),
                           P.vijax_options())[0]
            g = call(exe, jnp.asarray(1.0))[0]
            times = [call(exe, jnp.asarray(1.0))[1] for _ in range(cfg["repeats"])]
            row[adjoint] = dict(grad=float(g), us_per_step=1e6 * min(times) / n)
        row["rel_diff"] = abs(row["reversible"]["grad"] / row["store_all"]["grad"] - 1.0)
        log(f"[c] save_every = {every:6d}: reversible vs store_all {row['rel_diff']:.2e}, "
            f"{row['reversible']['us_per_step']:.2f} vs {row['store_all']['us_per_step']:.2f} "
            f"us/step")
        rows.append(row)
    return dict(label="double pendulum theta0 = (1.0, 1.5), VPRK.gauss(2)", dt=DT, rows=rows)


# --------------------------------------------------------------------------------------------
# Tables and plots
# --------------------------------------------------------------------------------------------


def mb(x):
    return "n/a" if x is None else (f"{x / 1e6:.3g} MB" if x >= 1e5 else f"{x / 1e3:.3g} kB")


def table_rows(rows, n):
    here = [r for r in rows if r["n"] == n]
    lines = [f"{'method':22s} {'grad mem':>10s} {'compile':>8s} {'fwd':>9s} {'grad':>9s} "
             f"{'grad/fwd':>8s} {'(cpu)':>6s} {'rel.diff':>9s}  paired diffrax (time ratio d/v, "
             f"mem ratio d/v)"]
    for r in here:
        pair = ""
        if r["library"] == "vijax":
            pair = (f"{r['paired_diffrax']:18s} {r['diffrax_over_vijax_grad_time']:6.2f}x "
                    f"(cpu {r['diffrax_over_vijax_grad_cpu']:.2f}x), mem "
                    f"{r['paired_mem_ratio']:.2g}x"
                    + ("" if r["paired_rule"].startswith("diffrax within") else " [> vijax mem]"))
        rd = r.get("grad_rel_diff_vs_store_all")
        lines.append(
            f"{r['key']:22s} {mb(r['grad_temp_bytes']):>10s} "
            f"{r['grad_lower_s'] + r['grad_compile_s']:7.1f}s "
            f"{r['forward_ref_s'] * 1e3:7.1f}ms {r['grad_s'] * 1e3:7.0f}ms "
            f"{r['grad_over_fwd']:8.1f} {r['grad_over_fwd_cpu']:6.1f} "
            f"{'n/a' if rd is None else format(rd, '.1e'):>9s}  {pair}")
    return lines


def summary(res) -> list[str]:
    lines = ["", "=" * 100, "ADJOINTS: reverse-mode cost and memory (temp_size_in_bytes of the "
             "compiled gradient)", "=" * 100]
    for name, pr in res.get("a", {}).items():
        lines.append(f"\n{pr['label']}, dt = {pr['dt']}")
        for n in sorted({r["n"] for r in pr["rows"]}):
            lines.append(f"-- N = {n:.0e} (T = {n * pr['dt']:g})")
            lines += ["   " + s for s in table_rows(pr["rows"], n)]
        for it in pr.get("accuracy", []):
            lines.append(f"   accuracy N = {it['n']:.0e} {it['method']:8s}: |dE| = "
                         f"{it['energy_error']:.2e}"
                         + (f", |x - exact| = {it['state_error']:.2e}" if "state_error" in it
                            else ""))
    if "b" in res:
        lines.append("\nReversibility (N steps of +dt then N of -dt, step API), max-norm errors:")
        for name, pb in res["b"].items():
            lines.append(f"  {pb['label']}:")
            for r in pb["rows"]:
                lines.append(f"    N = {r['n']:8d} (T = {r['t']:8g}): |q_back - q0| = "
                             f"{r['q_back_err']:.2e}, |p_back - p0| = {r['p_back_err']:.2e}, "
                             f"amplification |dx_N/dx_0| = {r['amplification']:.2e}"
                             + ("" if r["converged"] else "  [a solve did not converge]"))
            lines.append(f"    first N with error above 1e-12 / 1e-8 / 1e-4: "
                         + " / ".join(str(pb["first_n_above"][k]) for k in
                                      ("1e-12", "1e-08", "0.0001")))
    if "c" in res:
        pc = res["c"]
        lines.append(f"\nReversible adjoint anchored at the saves ({pc['label']}, dt = "
                     f"{pc['dt']}, N = {pc['rows'][0]['n']}, loss of the final state):")
        for r in pc["rows"]:
            lines.append(f"    save_every = {r['save_every']:6d}: gradient vs store_all "
                         f"{r['rel_diff']:.2e} relative; {r['reversible']['us_per_step']:.2f} "
                         f"us/step (store_all {r['store_all']['us_per_step']:.2f})")
    return lines


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res.get("a", {}))
    fig, axes = plt.subplots(2, 3, figsize=(16, 9.5))
    styles = {"vijax/store_all": dict(color="C0", marker="o"),
              "vijax/checkpointed": dict(color="C1", marker="s"),
              "vijax/reversible": dict(color="C2", marker="^"),
              "diffrax/default": dict(color="C3", marker="v", ls="--"),
              "diffrax/10": dict(color="C4", marker="<", ls="--"),
              "diffrax/100": dict(color="C5", marker=">", ls="--"),
              "diffrax/all": dict(color="C7", marker="D", ls="--")}
    for i, name in enumerate(names[:2]):
        pr = res["a"][name]
        keys = list(dict.fromkeys(r["key"] for r in pr["rows"]))
        ax_m, ax_r = axes[i, 0], axes[i, 1]
        for key in keys:
            rs = sorted((r for r in pr["rows"] if r["key"] == key), key=lambda r: r["n"])
            ns = [r["n"] for r in rs]
            st = styles.get(key, {})
            ax_m.loglog(ns, [r["grad_temp_bytes"] for r in rs], label=key.replace(
                "diffrax/", "diffrax Tsit5 ckpt=").replace("vijax/", "vijax Gauss-2 "), **st)
            ax_r.loglog(ns, [r["grad_over_fwd"] for r in rs], **st)
        ns = np.array(sorted({r["n"] for r in pr["rows"]}), float)
        ref = min(r["grad_temp_bytes"] for r in pr["rows"] if r["key"] == "vijax/checkpointed"
                  and r["n"] == ns[0])
        ax_m.loglog(ns, ref * np.sqrt(ns / ns[0]), "k:", lw=1, label="~ sqrt(N)")
        ax_m.set_title(f"{pr['label']}: gradient temp memory")
        ax_m.set_xlabel("N steps")
        ax_m.set_ylabel("XLA temp_size_in_bytes")
        ax_m.grid(True, which="both", alpha=0.3)
        ax_r.axhline(4, color="k", ls=":", lw=1, label="target 4")
        ax_r.set_title(f"{pr['label']}: gradient time / forward time")
        ax_r.set_xlabel("N steps")
        ax_r.set_ylabel("ratio (wall, median)")
        ax_r.grid(True, which="both", alpha=0.3)
        if i == 0:
            ax_m.legend(fontsize=7)
            ax_r.legend(fontsize=7)
    ax = axes[0, 2]
    for j, (name, pb) in enumerate(res.get("b", {}).items()):
        rs = pb["rows"]
        ns = [r["n"] for r in rs]
        ax.loglog(ns, [max(r["q_back_err"], r["p_back_err"], 1e-18) for r in rs], "o-",
                  color=f"C{j}", label=f"{pb['label']}: |x_back - x0|")
        ax.loglog(ns, [min(r["eps_times_amplification"], 1e30) for r in rs], ":",
                  color=f"C{j}", label="eps * |dx_N/dx_0|")
    ax.set_ylim(1e-18, 1e3)
    ax.set_title("reversibility: N steps forward, N back (Gauss-2)")
    ax.set_xlabel("N steps (dt = 0.01)")
    ax.set_ylabel("max-norm error")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    ax = axes[1, 2]
    for j, (name, pr) in enumerate(res.get("a", {}).items()):
        for key, ls in (("vijax/reversible", "-"), ("vijax/checkpointed", "--")):
            rs = sorted((r for r in pr["rows"] if r["key"] == key), key=lambda r: r["n"])
            pts = [(r["n"], r["grad_rel_diff_vs_store_all"]) for r in rs
                   if r["grad_rel_diff_vs_store_all"] is not None]
            if pts:
                ax.loglog([p[0] for p in pts], [max(p[1], 1e-18) for p in pts], ls,
                          marker="o", color=f"C{j}", label=f"{pr['label']}: {key}")
    ax.set_title("gradient: relative difference from store_all (0 drawn at 1e-18)")
    ax.set_xlabel("N steps")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 1e3, 1e4 only: smoke test")
    ap.add_argument("--max-n", type=float, default=1e6, help="largest N (default 1e6)")
    ap.add_argument("--parts", default="a,b,c", help="subset of a (cost, memory), b "
                    "(reversibility), c (the reversible adjoint against save_every)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per configuration")
    ap.add_argument("--repeats-large", type=int, default=2,
                    help="timed calls per configuration at N >= 1e6")
    ap.add_argument("--summary-only", action="store_true",
                    help="re-print the table and re-plot from the JSON file")
    ap.add_argument("--out", default=str(RESULTS), help="output folder")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    max_n = int(1e4 if args.quick else args.max_n)
    tag = "_quick" if args.quick else ("" if max_n == 1_000_000 else f"_maxn{max_n}")
    path = out_dir / f"adjoints{tag}.json"
    if args.summary_only:
        res = unjson(json.loads(path.read_text()))["results"]
        print("\n".join(summary(res)))
        plot(res, out_dir / f"adjoints{tag}.png")
        return
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    ns = [n for n in (1_000, 10_000, 100_000, 1_000_000) if n <= max_n]
    ns_b = sorted({int(round(10 ** (k / 2))) for k in range(4, 13)} | set(ns))
    ns_b = [n for n in ns_b if n <= max_n]
    cfg = dict(problems=PART_A_PROBLEMS, problems_b=PART_B_PROBLEMS, ns=ns, ns_b=ns_b,
               checkpoints=DFX_CHECKPOINTS, repeats=2 if args.quick else args.repeats,
               n_c=min(20_000, max_n), save_every_c=[min(20_000, max_n), 1000, 200, 1],
               repeats_large=args.repeats_large, large_n=1_000_000, no_warm_from=100_000, dt=DT,
               vijax="VPRK.gauss(2), FixedPoint (default), save_every = N",
               diffrax="Tsit5, ConstantStepSize, SaveAt(t1=True), max_steps = N, "
                       "hand-written vector field",
               loss="sum(q_N^2) + sum(p_N), grad w.r.t. q0",
               memory="compiled.memory_analysis().temp_size_in_bytes of jax.jit(jax.grad(loss))")
    info = machine_info()
    info["uptime_start"] = uptime()
    la = info.get("loadavg_start")
    log(f"machine: {info['platform']} | {info['cpu']} x {info['cpu_count']} | jax {info['jax']}"
        f" | diffrax {info['diffrax']} | {info['uptime_start']}")
    if la and la[0] > 2.5:
        log(f"NOTE: 1-min load average {la[0]:.2f} > 2.5 at the start: wall times are inflated "
            f"by other processes; ratios within this run are still comparable (timed calls are "
            f"interleaved), and process CPU times are stored next to every wall time.")
    t_start = time.perf_counter()
    res = {}
    if path.exists():  # a run with --parts replaces only its own parts
        try:
            res = unjson(json.loads(path.read_text())).get("results", {})
        except (OSError, ValueError):
            res = {}
    def save_partial(partial_a):
        # after every (problem, N): a long run that dies keeps what it measured
        payload = dict(title="adjoints (partial: part a in progress)", machine=info,
                       config=cfg, results={**res, "a": partial_a})
        path.with_name(path.stem + "_partial.json").write_text(json.dumps(jsonable(payload),
                                                                          indent=1))

    if "a" in parts:
        res["a"] = part_a(cfg, save_partial)
    if "b" in parts:
        res["b"] = part_b(cfg)
    if "c" in parts:
        res["c"] = part_c(cfg)
    seconds = time.perf_counter() - t_start
    lines = summary(res)
    lines.append(f"\ntotal wall time {seconds:.1f} s; command: "
                 f"{command_line('adjoints.py', argv)}")
    print("\n".join(lines))
    payload = dict(title="adjoints", command=command_line("adjoints.py", argv), machine=info,
                   loadavg_start=la, loadavg_end=loadavg(), uptime_end=uptime(),
                   high_load_note=bool(la and la[0] > 2.5), config=cfg, seconds=seconds,
                   results=res, summary=lines)
    path.write_text(json.dumps(jsonable(payload), indent=1))
    path.with_name(path.stem + "_partial.json").unlink(missing_ok=True)
    plot(res, out_dir / f"adjoints{tag}.png")
    log(f"wrote {path} and {out_dir / f'adjoints{tag}.png'}")


if __name__ == "__main__":
    main()
