"""`atomic_path`: a write appears whole under its name or not at all, and leaves no temporary behind."""

import os

import pytest

from coevo_jax.atomic_files import atomic_path


def test_a_completed_write_replaces_the_file(tmp_path):
    target = tmp_path / "data.json"
    target.write_text("old")
    with atomic_path(target) as tmp, open(tmp, "w") as f:
        f.write("new")
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["data.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "data.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(target) as tmp:
        with open(tmp, "w") as f:
            f.write("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["data.json"]


def test_a_failed_first_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "new") as tmp:
        os.mkdir(tmp)
        raise RuntimeError
    assert os.listdir(tmp_path) == []


def test_a_directory_is_replaced_only_when_asked(tmp_path):
    target = tmp_path / "checkpoint"
    target.mkdir()
    (target / "old.bin").write_text("old")

    def write(**kwargs):
        with atomic_path(target, **kwargs) as tmp:
            os.mkdir(tmp)
            with open(os.path.join(tmp, "new.bin"), "w") as f:
                f.write("new")

    with pytest.raises(OSError):
        write()  # a plain rename does not replace a directory that holds files
    assert os.listdir(target) == ["old.bin"]
    write(replace_directory=True)
    assert os.listdir(target) == ["new.bin"]
    assert os.listdir(tmp_path) == ["checkpoint"]


def test_replacing_a_directory_refuses_a_file(tmp_path):
    target = tmp_path / "checkpoint"
    target.write_text("a file")
    with (
        pytest.raises(FileExistsError, match="not a directory"),
        atomic_path(target, replace_directory=True) as tmp,
    ):
        os.mkdir(tmp)
    assert target.read_text() == "a file"
    assert os.listdir(tmp_path) == ["checkpoint"]
