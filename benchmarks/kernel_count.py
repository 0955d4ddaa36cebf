"""Kernels per loop iteration of compiled vijax programs on XLA:CPU.

    python benchmarks/kernel_count.py cvt_dg,kepler            # kernels per while-loop body
    python benchmarks/kernel_count.py cvt_dg --where           # ... and by source line

XLA:CPU runs a ``while`` loop's body kernel by kernel (about 20--50 ns each on the benchmark
machine), so for small systems the number of kernels per iteration, not the arithmetic, sets
the step time.  This script compiles the cases of ``ab_versions.py`` (``jax.jit`` of
``vj.simulate``), reads the optimised HLO and counts, for every ``while`` body, the
instructions that become kernels (fusions, dots, copies, custom calls, nested loops; not
parameters, tuples, constants or bitcasts).  The innermost loop is a stage solve's iteration,
the one around it a step.  ``--where`` groups a body's kernels by the first vijax source line
of their stack trace (``[file:line]`` when only the solver or ``_linalg`` is on it).

Why some code costs more kernels than its arithmetic suggests (measured this way): a
reduction or a ``dot`` ends a fusion, and an expensive elementwise op (division, square root,
sine) whose value is used by two fusions becomes a kernel of its own.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_versions import CASES, build  # noqa: E402

NOT_KERNELS = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "after-all",
               "opt-barrier", "partition-id", "replica-id"}
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$")
_OP = re.compile(r"(ROOT )?%?[\w.\-]+ = .*?\s([a-z][a-z0-9\-]*)\(")


def computations(text: str) -> dict[str, list[str]]:
    """Instruction lines of every computation of an HLO module's text."""
    comps, cur = {}, None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m and not line.startswith(" "):
            cur = comps.setdefault(m.group(2), [])
        elif line.startswith("}"):
            cur = None
        elif cur is not None and " = " in line:
            cur.append(line.strip())
    return comps


def opcode(line: str):
    m = _OP.match(line)
    return m.group(2) if m else None


def loop_bodies(text: str) -> list[tuple[str, str, Counter]]:
    """``(computation, body, kernels by opcode)`` for every ``while`` in the module."""
    comps = computations(text)
    out = []
    for name, lines in comps.items():
        for line in lines:
            if opcode(line) == "while":
                body = re.search(r"body=%?([\w.\-]+)", line).group(1)
                kernels = Counter(op for op in map(opcode, comps[body])
                                  if op and op not in NOT_KERNELS)
                out.append((name, body, kernels))
    return out


def _stack_frames(text: str):
    """``frame id -> [(file, function, line), ...]`` (innermost first) from the module's
    FileNames / FunctionNames / FileLocations / StackFrames tables."""
    tables = {k: {} for k in ("FileNames", "FunctionNames", "FileLocations", "StackFrames")}
    section = None
    for line in text.splitlines():
        if line in tables:
            section = line
        elif section and not line.strip():
            section = None
        elif section:
            key, rest = line.split(" ", 1)
            tables[section][int(key)] = rest
    fields = lambda rest: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", rest)}  # noqa: E731
    name = lambda table, i: tables[table][i].strip('"')  # noqa: E731

    def chain(frame):
        out, seen = [], set()
        while frame in tables["StackFrames"] and frame not in seen:
            seen.add(frame)
            f = fields(tables["StackFrames"][frame])
            loc = fields(tables["FileLocations"][f["file_location_id"]])
            out.append((name("FileNames", loc["file_name_id"]),
                        name("FunctionNames", loc["function_name_id"]), loc["line"]))
            frame = f["parent_frame_id"]
        return out

    return chain


def where(text: str, body: str) -> Counter:
    """A loop body's kernels by ``(opcode, source)``."""
    chain = _stack_frames(text)
    found = Counter()
    for line in computations(text)[body]:
        op = opcode(line)
        if not op or op in NOT_KERNELS:
            continue
        m = re.search(r"stack_frame_id=(\d+)", line)
        frames = chain(int(m.group(1))) if m else []
        mine = [f for f in frames if "/vijax/" in f[0] and not f[0].endswith(
            ("/solvers.py", "/_linalg.py"))]
        if mine:
            f, fn, ln = mine[0]
            label = f"{f.split('/vijax/')[-1]}:{ln} {fn}"
        elif frames:
            f, fn, ln = frames[0]
            label = f"[{f.split('/')[-1]}:{ln} {fn}]"
        else:
            label = "?"
        found[(op, label)] += 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--where", action="store_true", help="group kernels by source line")
    args = ap.parse_args()
    import jax

    jax.config.update("jax_enable_x64", True)
    import vijax as vj

    for case in args.cases.split(","):
        text = build(vj, case)[2].as_text()
        print(f"{case}:")
        for name, body, kernels in loop_bodies(text):
            detail = ", ".join(f"{k} {v}" for k, v in kernels.most_common())
            print(f"  loop body {body} (in {name}): {sum(kernels.values())} kernels ({detail})")
            if args.where:
                for (op, label), n in where(text, body).most_common():
                    print(f"      {n:4d} {op:12s} {label}")


if __name__ == "__main__":
    main()
