"""Measured orders of the nonholonomic Lobatto IIIA–IIIB methods on the nonholonomic particle
of Martín de Diego & Sato Martín de Almagro (2022), §7.1 (their Fig. 3), next to the orders
of their Corollary 5.2.1, with the exact initial multiplier and with one off by 1/4.

The harness (reference by DOP853 on the index-1 equations, step sizes, error norms) is the
test suite's (tests/test_nonholonomic.py), so the table is what the tests assert.

    python examples/nonholonomic_orders.py       # prints a Markdown table
"""

import os
import sys
import warnings

import jax

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from test_nonholonomic import (ALT_Q0, ALT_V0, CASES, PARTICLE, errors,  # noqa: E402
                               expected_orders, reference, slopes)

import vijax as vj  # noqa: E402


def main():
    system = PARTICLE()
    data = {"default": PARTICLE.initial_conditions(), "alt": (ALT_Q0, ALT_V0)}
    refs = {k: reference(system, *x) for k, x in data.items()}
    print("| s | h | measured (q, p, λ) | expected | λ0 off by 1/4: (q, p), final λ error |")
    print("|---|---|---|---|---|")
    for s in (2, 3, 4, 5):
        which, steps = CASES[s]
        integ = vj.NonholonomicVPRK.lobatto(s)
        hs, errs = errors(integ, system, *data[which], steps, refs[which])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hs0, errs0 = errors(integ, system, *data[which], steps, refs[which],
                                lam0=vj.constraints.nonholonomic_multiplier(
                                    system, *data[which]) + 0.25)
        got = ", ".join(f"{g:.2f}" for g in slopes(hs, errs))
        wrong = ", ".join(f"{g:.2f}" for g in slopes(hs0, errs0[:2]))
        hs_txt = ", ".join(f"{h:.4g}" for h in hs)
        print(f"| {s} | {hs_txt} | {got} | {expected_orders(s)} | {wrong}; "
              f"{errs0[2, -1]:.2e} |")


if __name__ == "__main__":
    main()
