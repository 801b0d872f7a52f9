"""The wheel installs one top-level package, ``ninefold`` (with its data files and py.typed), and nothing from
the sample generators, the tests or the benchmarks."""
import subprocess
import sys
import zipfile

from conftest import ROOT


def test_the_wheel_holds_one_top_level_package(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("ninefold-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert {n.split("/")[0] for n in names} == {"ninefold", whl.name.split("-py")[0] + ".dist-info"}
    assert {"ninefold/py.typed", "ninefold/analysis/cost_model/hardware.toml", "ninefold/api.py"} <= set(names)
    assert not any(n.startswith(("sample_traces", "tests", "bench")) for n in names)
