"""The C kernels' cache is trusted only where no one else can write (issue 45): a directory of
this user's that is not group- or world-writable, a library checked (owner, mode) before it is
loaded, no shared fallback such as /tmp without a home; and the first build is serialised
across threads (a lock in library()) and processes (flock on a lock file in the cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tinyllm import native


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """library() as in a new process, its cache under tmp_path/cache."""
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "ENABLED", True)
    monkeypatch.setenv("TINYLLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kernels"


def test_a_new_cache_is_private(fresh):
    d = native.build.safe_cache_dir()
    assert d == fresh and (d.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("mode, says", [(0o770, "writable by its group"), (0o707, "writable by others")])
def test_a_group_or_world_writable_cache_is_refused_and_pytorch_runs(fresh, mode, says, caplog):
    fresh.mkdir(parents=True)
    fresh.chmod(mode)
    with caplog.at_level("WARNING", logger="tinyllm"):
        lib = native.library()
    assert lib is None and "unsafe kernel cache" in native.why_not and says in native.why_not, native.why_not
    assert "TINYLLM_CACHE" in native.why_not and not list(fresh.glob("*.so"))
    assert "PyTorch runs instead" in caplog.text
    assert native.library() is None  # once per process: said once


def test_a_cache_owned_by_another_user_is_refused(fresh, monkeypatch):
    fresh.mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(native.build, "_uid", lambda: os.geteuid() + 1)
    assert native.library() is None
    assert "owned by uid" in native.why_not and "not this user" in native.why_not


def test_no_home_means_no_cache_not_tmp(monkeypatch):
    for var in ("TINYLLM_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os.path, "expanduser", lambda p: p)  # no HOME, no passwd entry
    with pytest.raises(native.UnsafeCache, match="no home directory"):
        native.build.cache_dir()
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "ENABLED", True)
    assert native.library() is None and "no home directory" in native.why_not


def test_a_library_is_checked_before_it_is_loaded(tmp_path, monkeypatch):
    lib = tmp_path / "x.so"
    lib.write_bytes(b"not loaded")
    lib.chmod(0o775)
    with pytest.raises(native.UnsafeCache, match="writable by its group"):
        native.abi.load(lib)  # refused before ctypes sees it
    lib.chmod(0o755)
    monkeypatch.setattr(native.build, "_uid", lambda: os.geteuid() + 1)
    with pytest.raises(native.UnsafeCache, match="owned by uid"):
        native.build.check_library(lib)
    monkeypatch.undo()
    native.build.check_library(lib)  # ours, 0755: fine
    link = tmp_path / "link.so"
    link.symlink_to(lib)
    with pytest.raises(native.UnsafeCache, match="not a regular file"):
        native.build.check_library(link)


@pytest.fixture(scope="module")
def good_build(tmp_path_factory) -> bytes:
    """One real build's bytes: the tests below put copies in place of a build (seconds each).
    This process's library where it has one (built for the suite anyway), else one built now."""
    if native.build.compiler() is None:
        pytest.skip("no C compiler here")
    if native.library() is not None:
        return Path(native.library()._name).read_bytes()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native, "_lib", None)
        mp.setattr(native, "_tried", False)
        mp.setattr(native, "ENABLED", True)
        mp.setenv("TINYLLM_CACHE", str(tmp_path_factory.mktemp("build")))
        assert native.library() is not None, native.why_not
        (built,) = native.build.cache_dir().glob("*.so")
        return built.read_bytes()


@pytest.fixture
def quick_builds(fresh, good_build, monkeypatch) -> list[Path]:
    """``_compile`` writes a copy of the real build (renamed into place, as it does): the paths built."""
    built: list[Path] = []

    def copy(cc, sources, openmp, native_flags, defs, out: Path) -> Path:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_bytes(good_build)
        tmp.chmod(0o755)
        tmp.replace(out)
        built.append(out)
        return out

    monkeypatch.setattr(native.build, "_compile", copy)
    return built


def _again(monkeypatch) -> None:
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", False)


@pytest.mark.parametrize("spoil", ["loosened", "no stamp", "another key", "changed"])
def test_a_library_that_is_loosened_or_not_its_stamps_build_is_rebuilt(fresh, quick_builds, monkeypatch, spoil, caplog):
    """A library others could write, or not the build its stamp describes (the stamp beside it
    holds the whole build key, of which the name has 16 hex digits, and the sha256), is built
    again in its place, never loaded."""
    assert native.library() is not None, native.why_not
    (built,) = fresh.glob("*.so")
    assert quick_builds == [built] and (built.stat().st_mode & 0o777) == 0o755
    stamp = native.build._stamp(built)
    good = json.loads(stamp.read_text())
    assert set(good) == {"key", "sha256"} and built.name == f"tinyllm-{good['key'][:16]}.so"
    if spoil == "loosened":  # e.g. written under a loose umask, or by someone in the group
        built.chmod(0o777)
    elif spoil == "no stamp":
        stamp.unlink()
    elif spoil == "another key":
        stamp.write_text(json.dumps({**good, "key": good["key"][:16] + "0" * 48}))
    else:
        other = built.with_name("other")  # (a new file in its place: the loaded one stays mapped intact)
        other.write_bytes(built.read_bytes() + b"\0")
        other.chmod(0o755)
        other.replace(built)
    _again(monkeypatch)
    with caplog.at_level("WARNING", logger="tinyllm"):
        assert native.library() is not None, native.why_not
    assert "rebuilding" in caplog.text and quick_builds == [built, built]
    assert (built.stat().st_mode & 0o777) == 0o755
    assert json.loads(stamp.read_text()) == {"key": good["key"], "sha256": native.build._sha256(built)}
    _again(monkeypatch)  # a sound one is loaded as it is
    assert native.library() is not None and len(quick_builds) == 2


def test_concurrent_first_callers_all_get_the_library_built_once(fresh, quick_builds, monkeypatch):
    """A caller that came while the first one built got None (and Linear then packed for oneDNN
    for good: different bits). Now every thread waits for the one build."""
    builds = []
    quick = native.build._compile

    def slow_compile(*a, **k):
        builds.append(1)
        time.sleep(0.3)  # the others arrive meanwhile
        return quick(*a, **k)

    monkeypatch.setattr(native.build, "_compile", slow_compile)
    got = []
    threads = [threading.Thread(target=lambda: got.append(native.library())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(got) == 4 and all(lib is not None for lib in got) and len({id(lib) for lib in got}) == 1
    assert len(builds) == 1


def test_processes_take_turns_on_the_cache_lock(fresh):
    """The lock is an flock on a file in the cache: while one process holds it, another waits; it
    gets the lock only once the first lets go (told to, so no timing decides it)."""
    pytest.importorskip("fcntl")
    d = native.build.safe_cache_dir()
    code = (
        "import sys; from pathlib import Path; from tinyllm import native\n"
        "with native.build._locked(Path(sys.argv[1])):\n    print('in', flush=True); sys.stdin.readline()\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(d)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    got: list[float] = []

    def take() -> None:
        with native.build._locked(d):
            got.append(time.monotonic())

    try:
        assert p.stdout.readline() == "in\n"  # the other process holds the lock now
        taker = threading.Thread(target=take)
        taker.start()
        taker.join(0.3)
        assert not got  # still waiting (on a slow machine it may not have tried yet: it waits then)
        let_go = time.monotonic()
        p.stdin.write("go\n")
        p.stdin.flush()
        taker.join(30)
        assert got and got[0] >= let_go  # it got the lock after the other process let go
        assert (d / native.build.LOCK_NAME).exists() and (os.stat(d / native.build.LOCK_NAME).st_mode & 0o077) == 0
    finally:
        p.stdin.close()
        p.wait(30)
