import os

import pytest

from rag.stores.local.versions import POINTER, current_version, save_version


def write_file(text):
    return lambda d: (d / "data.txt").write_text(text)


def test_versions_and_pointer(tmp_path):
    first = save_version(tmp_path, write_file("one"))
    second = save_version(tmp_path, write_file("two"))
    assert current_version(tmp_path) == second != first
    assert not first.exists()  # the old version is cleaned up
    assert (second / "data.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == [POINTER, second.name]


def test_failed_write_keeps_previous_version(tmp_path):
    good = save_version(tmp_path, write_file("good"))

    def crash(d):
        (d / "data.txt").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_version(tmp_path, crash)
    assert current_version(tmp_path) == good
    assert (good / "data.txt").read_text() == "good"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_missing_or_corrupt_pointer(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved index"):
        current_version(tmp_path)
    (tmp_path / POINTER).write_text("../elsewhere")
    with pytest.raises(FileNotFoundError, match="not a version directory"):
        current_version(tmp_path)


def test_leftovers_of_a_killed_save_are_ignored_then_removed(tmp_path):
    good = save_version(tmp_path, write_file("good"))
    os.mkdir(tmp_path / ".tmp-killed")  # what a process killed mid-write leaves behind
    (tmp_path / "v000099").mkdir()  # ... or killed after the rename, before the pointer switch
    assert current_version(tmp_path) == good
    newest = save_version(tmp_path, write_file("new"))
    assert newest.name == "v000100"
    assert sorted(p.name for p in tmp_path.iterdir()) == [POINTER, "v000100"]
