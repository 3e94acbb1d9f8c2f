"""Where named data sets are looked up: $PARETOLAB_DATA_DIR and the checkout's shared/data, never any folder above the cwd."""

from __future__ import annotations

from paretolab.data import files as data


def _shared(root):
    folder = root / "shared" / "data"
    (folder / "wikitext2").mkdir(parents=True)
    return folder


def test_a_shared_data_folder_above_the_working_directory_is_not_searched(tmp_path, monkeypatch):
    stray = _shared(tmp_path / "somewhere")
    work = tmp_path / "somewhere" / "project" / "runs"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.delenv("PARETOLAB_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "CHECKOUT", None)  # an installed (not checked-out) paretolab
    assert stray not in data.data_dirs()
    assert data.data_dirs() == [data.cache_dir() / "data"]


def test_the_env_folder_then_the_checkouts_shared_data(tmp_path, monkeypatch):
    beside = _shared(tmp_path)  # ../shared/data of a checkout at tmp_path/paretolab
    checkout = tmp_path / "paretolab"
    checkout.mkdir()
    monkeypatch.setattr(data, "CHECKOUT", checkout)
    monkeypatch.setenv("PARETOLAB_DATA_DIR", str(tmp_path / "mine"))
    monkeypatch.chdir(tmp_path)
    assert data.data_dirs() == [tmp_path / "mine", beside, data.cache_dir() / "data"]
    inside = _shared(checkout)
    assert data.data_dirs()[1:3] == [inside, beside]
