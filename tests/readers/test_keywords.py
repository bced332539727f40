"""A misspelt keyword of the Python API names the right one, as the CLI's "did you mean" does;
messages about storage options use the spelling of the caller (API dict or CLI flag)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from shardfeed.readers import make_loader, open_dataset
from shardfeed.readers.errors import UnsupportedURLError
from shardfeed.readers.storage.objstore import option_hint, split_store_url, use_cli_spelling


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        buf = io.BytesIO()
        Image.new("RGB", (8, 6), (10, 20, 30)).save(buf, "PNG")
        (tmp_path / "src" / c / "x.png").write_bytes(buf.getvalue())
    return tmp_path / "src"


def test_make_loader_typo_names_the_keyword(folder):
    with pytest.raises(TypeError) as info:
        make_loader(folder, batch_size=2, image_sz=64)
    msg = str(info.value)
    assert msg.startswith("make_loader() got an unexpected keyword argument 'image_sz'; did you mean 'image_size'?")
    assert "_init_common" not in msg


def test_open_dataset_typos_each_named(folder):
    with pytest.raises(TypeError) as info:
        open_dataset(folder, shufle=False, num_wrkers=2)
    msg = str(info.value)
    assert "open_dataset() got unexpected keyword arguments" in msg
    assert "'shufle'; did you mean 'shuffle'?" in msg
    assert "'num_wrkers'" in msg  # not an open_dataset option at all (a make_loader one): no suggestion here


def test_valid_source_and_loader_keywords_still_pass(folder):
    loader = make_loader(folder, batch_size=2, num_workers=0, image_size=4, shuffle_buffer=10, check_files=True,
                         max_pixels=10_000, timeout=0, class_to_idx={"a": 0, "b": 1})
    labels = sorted(int(y) for _, ys in loader for y in ys)
    assert labels == [0, 1]


def test_storage_option_hints_follow_the_caller():
    try:
        use_cli_spelling(False)
        assert option_hint(("anon", True)) == "storage_options={'anon': True}"
        with pytest.raises(UnsupportedURLError) as api:
            split_store_url("s3://user:pw@bucket/x")
        assert "storage_options={'key': ..., 'secret': ...}" in str(api.value)
        assert "--storage-option" not in str(api.value)
        use_cli_spelling(True)
        assert option_hint(("anon", True)) == "--storage-option anon=true"
        assert option_hint(("endpoint_url", ...)) == "--storage-option endpoint_url=..."
    finally:
        use_cli_spelling(False)
