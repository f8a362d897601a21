"""An installed package (a wheel, not an editable install) has what the app needs: the bundled
prompt workloads, found through importlib.resources, and `--prompts NAME` resolves them."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tinyllm.workload import WorkloadError, bundled_workloads, load_workload, resolve_workload

ROOT = Path(__file__).resolve().parent.parent
REPO_PROMPTS = sorted(p.name for p in (ROOT / "prompts").glob("*.jsonl"))

CHECK = """
import json, sys
import tinyllm
from tinyllm.workload import bundled_workloads, load_workload, resolve_workload
found = bundled_workloads()
print(json.dumps({"package": tinyllm.__file__,
                  "names": sorted(found),
                  "counts": {n: len(load_workload(p)) for n, p in found.items()},
                  "burst": str(resolve_workload("burst")), "burst_jsonl": str(resolve_workload("burst.jsonl")),
                  "torch_imported": "torch" in sys.modules}))
"""


def test_bundled_workloads_are_the_repos_prompts():
    assert REPO_PROMPTS, "prompts/ is empty"
    assert sorted(p.name for p in bundled_workloads().values()) == REPO_PROMPTS
    for path in bundled_workloads().values():
        assert path.read_bytes() == (ROOT / "prompts" / path.name).read_bytes()
        assert load_workload(path)


def test_resolve_accepts_names_paths_and_explains_the_rest(tmp_path):
    assert resolve_workload("burst") == resolve_workload("burst.jsonl") == bundled_workloads()["burst"]
    mine = tmp_path / "burst.jsonl"  # a real path wins over a bundled name
    mine.write_text('{"prompt": "x"}\n')
    assert resolve_workload(mine) == mine
    with pytest.raises(
        WorkloadError, match=r"nope: no such file, and not a bundled workload \(bundled: batch_and_chat, burst,"
    ):
        resolve_workload("nope")


def test_wheel_installs_the_prompt_workloads(tmp_path):
    """Build the wheel, install it (no deps: the check needs none) into a fresh venv, and read
    the workloads from there, far from the source tree. The wheel carries the C kernels'
    sources (tinyllm/native/build.py builds them on first use). Built with this environment's
    setuptools (no build isolation): offline, nothing is fetched."""
    wheels = tmp_path / "wheels"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = wheels.glob("tinyllm-*.whl")
    import zipfile

    shipped = set(zipfile.ZipFile(wheel).namelist())
    sources = {f"tinyllm/csrc/{p.name}" for p in (ROOT / "tinyllm" / "csrc").iterdir() if p.suffix in (".c", ".h")}
    assert sources and sources <= shipped, f"C kernel sources missing from the wheel: {sources - shipped}"
    for model in ("shakespeare", "shakespeare-draft"):  # the bundled model and its draft, whole
        files = {f"tinyllm/data/{model}/{p.name}" for p in (ROOT / "tinyllm" / "data" / model).iterdir()}
        assert "tinyllm/data/" + model + "/model.safetensors" in files and files <= shipped, files - shipped
    meta = next(n for n in shipped if n.endswith(".dist-info/METADATA"))
    requires = [line.split(":", 1)[1].strip() for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]  # fmt: skip
    # without NumPy every command that imports torch warned "Failed to initialize NumPy"
    assert any(r.startswith("numpy") for r in requires) and any(r.startswith("torch") for r in requires), requires
    env_dir = tmp_path / "venv"
    venv.create(env_dir)  # no pip of its own (ensurepip takes seconds): this pip installs into it
    py = env_dir / "bin" / "python"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(py), "-c", CHECK], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["package"].startswith(str(env_dir))  # the installed copy, not the repo
    assert [n + ".jsonl" for n in got["names"]] == REPO_PROMPTS
    assert all(n > 0 for n in got["counts"].values())
    assert got["burst"] == got["burst_jsonl"] and got["burst"].startswith(str(env_dir))
    assert not got["torch_imported"]  # workloads load without torch
