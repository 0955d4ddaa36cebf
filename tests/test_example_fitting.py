"""The parameter-fitting example runs end to end (``examples/fit_parameters.py --quick``, in a
fresh process): the loss falls to the noise level and every recovered parameter of the damped
double pendulum lies within 4 of its Gauss-Newton standard deviations of the truth."""

import json
import math
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_fit_parameters_quick(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "fit_parameters.py"), "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "fit_parameters.json").read_text())
    assert (tmp_path / "fit_parameters.png").stat().st_size > 0
    assert result["mode"] == "quick"
    assert result["loss_history_length"] == len(result["loss_history"]) > 10
    assert result["loss_initial"] > 50 * result["loss_final"]
    # the final loss is the noise variance, estimated and true, within 30 %
    assert 0.7 < result["noise_sigma_estimated"] / result["noise_sigma"] < 1.3
    for name in result["parameters"]:
        sigma = result["sigma"][name]
        assert math.isfinite(sigma) and sigma > 0, (name, sigma)
        assert abs(result["recovered"][name] - result["true"][name]) < 4 * sigma, (name, result)
        assert abs(result["z"][name]) < 4, (name, result["z"])
    # the fit moved every parameter from its initial guess towards the truth
    for name in result["parameters"]:
        assert (abs(result["recovered"][name] - result["true"][name])
                < 0.5 * abs(result["initial"][name] - result["true"][name])), name
    assert result["wall_time_s"] > 0
