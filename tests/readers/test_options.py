"""The reading options as typed values (``ReadOptions``, ``OpenOptions``, ``LoaderOptions``): each
value checked where it enters, the sources built from them directly, and ``open_dataset``'s
keywords sorted into them. Expected samples come from the planted image folder
(``tiny_folder_expected``: bytes and labels by path), never from the readers."""

from __future__ import annotations

import dataclasses

import pytest

from shardfeed.readers import LoaderOptions, OpenOptions, ReadOptions, make_loader, open_dataset
from shardfeed.readers.sources.folder_source import FolderSource
from shardfeed.readers.storage.local_manifest import load_manifest
from shardfeed.readers.sources.lmdb_source import LMDBSource
from shardfeed.readers.sources.webdataset_source import WebDatasetSource


def _by_path(items):
    return {s.meta["path"]: (bytes(s.data), s.label) for s in items}


def test_read_options_are_frozen_and_checked_once_built():
    opts = ReadOptions(fields="txt", seed=7)
    assert opts.fields == ("txt",) and opts.seed == 7
    assert ReadOptions(fields=["txt", "json"]).fields == ("txt", "json")
    assert ReadOptions().fields == () and ReadOptions(fields=None).fields == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 8  # type: ignore[misc]
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', got 'ignore'"):
        ReadOptions(on_error="ignore")
    with pytest.raises(TypeError, match="fields must be a field name or a sequence of names, got int"):
        ReadOptions(fields=3)  # type: ignore[arg-type]


def test_open_options_check_the_cache():
    assert OpenOptions().check_files is True and OpenOptions().cache is None
    assert OpenOptions(cache="memory").cache == "memory"
    with pytest.raises(ValueError, match="cache must be None or 'memory', got 'disk'"):
        OpenOptions(cache="disk")


def test_open_dataset_refuses_bad_values_before_reading(tmp_path):
    missing = tmp_path / "nothing-here"  # checked before the path is looked at
    with pytest.raises(ValueError, match="on_error must be"):
        open_dataset(missing, on_error="ignore")
    with pytest.raises(ValueError, match="cache must be"):
        open_dataset(missing, cache="disk")
    with pytest.raises(ValueError, match="cache='memory' holds images"):
        open_dataset(missing, cache="memory", fields=("txt",))


@pytest.mark.parametrize("kind", ["wds", "lmdb", "folder"])
def test_sources_built_directly_from_read_options(kind, packed_wds, packed_lmdb, tiny_image_folder,
                                                  tiny_folder_expected):
    read = ReadOptions(decode=False, shuffle=False)
    if kind == "wds":
        ds = WebDatasetSource(packed_wds, load_manifest(packed_wds), read, shuffle_buffer=0)
        assert ds.buffer_size == 0
    elif kind == "lmdb":
        ds = LMDBSource(packed_lmdb, load_manifest(packed_lmdb), read, readahead=False, verify=True)
        assert ds.readahead is False
    else:
        ds = FolderSource(tiny_image_folder, read)
    assert ds.decode is False and ds.shuffle is False
    assert _by_path(ds) == tiny_folder_expected


def test_a_source_without_read_options_takes_the_defaults(packed_wds):
    ds = WebDatasetSource(packed_wds, load_manifest(packed_wds))
    assert (ds.decode, ds.shuffle, ds.on_error, ds.seed, ds.shuffle_buffer) == (True, True, "raise", 0, 1000)
    with pytest.raises(TypeError, match="one ReadOptions, got dict"):
        WebDatasetSource(packed_wds, load_manifest(packed_wds), {"decode": False})  # type: ignore[arg-type]


def test_open_dataset_passes_the_shared_options_to_the_source(packed_wds, tiny_folder_expected):
    ds = open_dataset(packed_wds, decode=False, shuffle=False, seed=5, on_error="skip", shuffle_buffer=3,
                      readahead=False)
    assert (ds.decode, ds.shuffle, ds.seed, ds.on_error, ds.shuffle_buffer) == (False, False, 5, "skip", 3)
    assert ds.location.readahead is False
    assert _by_path(ds) == tiny_folder_expected


def test_options_of_another_source_are_refused_by_name(tiny_image_folder, packed_wds):
    with pytest.raises(TypeError, match=r"'verify' does not apply to FolderSource"):
        open_dataset(tiny_image_folder, verify=False)
    with pytest.raises(TypeError, match=r"'timeout_s' does not apply to FolderSource"):
        open_dataset(tiny_image_folder, timeout_s=5)
    with pytest.raises(TypeError, match=r"'class_to_idx', 'verify' do not apply to WebDatasetSource"):
        open_dataset(packed_wds, verify=False, class_to_idx={"a": 0})


def test_options_a_source_has_no_use_for_are_ignored_as_before(tiny_image_folder, packed_lmdb, packed_wds,
                                                               tiny_folder_expected):
    # map-style sources shuffle by index: no stream buffer; a folder has no manifest to check
    folder = open_dataset(tiny_image_folder, decode=False, shuffle_buffer=10, check_files=False,
                          storage_options={"anon": True})
    lmdb = open_dataset(packed_lmdb, decode=False, shuffle_buffer=10, timeout_s=3, retries=1)
    wds = open_dataset(packed_wds, decode=False, timeout_s=3, retries=1, storage_options={"anon": True})
    for ds in (folder, lmdb, wds):
        assert _by_path(ds) == tiny_folder_expected


def test_loader_options_reach_the_data_loader(tiny_image_folder, tiny_folder_expected):
    seen = []
    loader = make_loader(tiny_image_folder, batch_size=8, num_workers=0, decode=False, shuffle=False,
                         collate_fn=lambda batch: seen.append(len(batch)) or batch, timeout=0)
    got = {s.meta["path"]: (bytes(s.data), s.label) for batch in loader for s in batch}
    assert got == tiny_folder_expected
    n = len(tiny_folder_expected)
    assert seen == [8] * (n // 8) + ([n % 8] if n % 8 else [])
    assert LoaderOptions().decode_device is None and LoaderOptions().timeout == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        LoaderOptions().timeout = 1  # type: ignore[misc]


@pytest.mark.parametrize("seed", ["1", 1.5, 1.0, True, None])
def test_a_seed_that_is_not_an_integer_is_refused_naming_it(seed, packed_wds):
    match = rf"seed must be an integer, got {seed!r}".replace("(", r"\(").replace(".", r"\.")
    with pytest.raises(TypeError, match=match):
        ReadOptions(seed=seed)
    with pytest.raises(TypeError, match=match):
        open_dataset(str(packed_wds), seed=seed)
    with pytest.raises(TypeError, match=match):
        make_loader(str(packed_wds), 4, num_workers=0, seed=seed)


def test_an_integer_seed_of_any_integer_type_is_kept(packed_wds):
    import numpy as np

    assert ReadOptions(seed=np.int64(5)).seed == 5 and type(ReadOptions(seed=np.int64(5)).seed) is int
    assert open_dataset(str(packed_wds), seed=3).seed == 3


def test_a_negative_or_non_integer_shuffle_buffer_is_refused(packed_wds, tiny_image_folder, tiny_folder_expected):
    for source in (packed_wds, tiny_image_folder):  # an image folder ignores it, but not a wrong value
        with pytest.raises(ValueError, match="shuffle_buffer must be >= 0 samples .*got -1"):
            open_dataset(str(source), shuffle_buffer=-1)
        with pytest.raises(TypeError, match="shuffle_buffer must be an integer number of samples, got '8'"):
            make_loader(str(source), 4, num_workers=0, shuffle_buffer="8")
    with pytest.raises(ValueError, match="got -5"):
        WebDatasetSource(packed_wds, load_manifest(packed_wds), shuffle_buffer=-5)
    ds = open_dataset(str(packed_wds), shuffle_buffer=0, decode=False)
    assert ds.buffer_size == 0 and _by_path(ds) == tiny_folder_expected


@pytest.mark.parametrize("name", ["decode", "shuffle", "pad"])
@pytest.mark.parametrize("value", ["false", "no", 2, 0.0, None])
def test_a_flag_that_is_not_true_or_false_is_refused_naming_it(name, value, packed_wds):
    with pytest.raises(TypeError, match=f"{name} must be True or False"):
        ReadOptions(**{name: value})
    with pytest.raises(TypeError, match=f"{name} must be True or False"):
        open_dataset(packed_wds, **{name: value})


def test_flags_take_bools_of_any_kind_and_the_integers_one_and_zero():
    import numpy as np

    assert ReadOptions(shuffle=np.bool_(False)).shuffle is False
    assert ReadOptions(shuffle=1, pad=0).shuffle is True and ReadOptions(pad=0).pad is False
    assert OpenOptions(check_files=np.bool_(True)).check_files is True


def test_bad_open_options_and_field_names_are_refused(packed_wds):
    with pytest.raises(TypeError, match="check_files must be True or False, got 'no'"):
        open_dataset(packed_wds, check_files="no")
    with pytest.raises(ValueError, match="retries must be an integer >= 0"):
        OpenOptions(retries=-1)
    for fields in (("txt", 5), ("",)):
        with pytest.raises(TypeError, match="fields must be non-empty field names"):
            ReadOptions(fields=fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("batch_size,error", [(2.5, TypeError), ("8", TypeError), (True, TypeError), (0, ValueError)])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(batch_size, error, packed_wds):
    with pytest.raises(error, match="batch_size must be"):
        make_loader(packed_wds, batch_size, num_workers=0)
