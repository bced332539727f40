"""``on_error`` is checked by one rule wherever it enters: pack options, a dataset, a source, the GPU decoder."""

from __future__ import annotations

import pytest

from shardfeed.readers.errors import ON_ERROR, check_on_error

BAD = ["ignore", "Skip", "", None]


@pytest.mark.parametrize("value", BAD)
def test_every_entry_refuses_a_bad_on_error_with_the_same_message(value, packed_wds, packed_lmdb, tmp_path):
    from shardfeed.convert.write.pack import PackOptions
    from shardfeed.readers import open_dataset
    from shardfeed.readers.decode.gpu_decode import GpuBatchDecoder

    message = rf"on_error must be 'raise' or 'skip', got {value!r}".replace("(", r"\(").replace(")", r"\)")
    entries = [lambda: PackOptions(on_error=value),
               lambda: open_dataset(packed_wds, on_error=value),
               lambda: open_dataset(tmp_path / "absent", on_error=value),  # checked before any I/O
               lambda: open_dataset(packed_lmdb, on_error=value),
               lambda: GpuBatchDecoder(32, device="cpu", on_error=value)]
    for entry in entries:
        with pytest.raises(ValueError, match=message):
            entry()


def test_the_accepted_values_pass_unchanged():
    assert ON_ERROR == ("raise", "skip")
    assert [check_on_error(v) for v in ON_ERROR] == ["raise", "skip"]
