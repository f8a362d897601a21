"""tinyllm.machine: the CPU named in a benchmark's report, a cost profile's key and the suite's summary."""

from tinyllm import machine

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC   7B13
flags\t\t: fpu sse2 avx avx2 fma

processor\t: 1
model name\t: AMD EPYC 7B13
"""


def test_the_cpu_is_named_with_its_cores_and_vector_width(tmp_path, monkeypatch):
    (tmp_path / "cpuinfo").write_text(EPYC)
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "cpuinfo")
    monkeypatch.setattr(machine, "cpus", lambda: 2)
    assert machine.cpu_name() == "AMD EPYC 7B13"
    assert machine.cpuinfo("vendor_id") == "AuthenticAMD"
    assert machine.describe() == "AMD EPYC 7B13, 2 CPUs (AVX2)"
    (tmp_path / "cpuinfo").write_text(EPYC.replace("avx2", "avx2 avx512f"))
    assert machine.describe().endswith("(AVX-512)")


def test_without_cpuinfo_the_platform_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "CPUINFO", tmp_path / "absent")
    monkeypatch.setattr(machine.platform, "processor", lambda: "")
    monkeypatch.setattr(machine.platform, "machine", lambda: "arm64")
    assert machine.cpuinfo("model name") == ""
    assert machine.describe() == f"arm64, {machine.cpus()} CPUs"
