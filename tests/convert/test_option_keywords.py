"""A misspelt field of ``PackOptions`` or ``ReencodeOptions`` names the right one, as the CLI's
"did you mean" does for its flags; correct fields and ``dataclasses.replace`` work as before."""

from __future__ import annotations

import dataclasses

import pytest

from shardfeed.convert import PackOptions, ReencodeOptions


def test_pack_options_typo_names_the_field():
    with pytest.raises(TypeError, match=r"PackOptions\(\) got an unexpected keyword argument 'max_byte'; "
                                        r"did you mean 'max_bytes'\?"):
        PackOptions(max_byte=1_000_000)


def test_reencode_options_typo_names_the_field():
    with pytest.raises(TypeError, match=r"did you mean 'resize'\?"):
        ReencodeOptions(resise=256)


def test_correct_fields_and_replace_still_work():
    opts = PackOptions(max_bytes=1_000_000, workers=1, on_error="skip")
    assert (opts.max_bytes, opts.workers, opts.on_error) == (1_000_000, 1, "skip")
    again = dataclasses.replace(opts, resume=True)
    assert again.resume is True and again.max_bytes == 1_000_000
    assert ReencodeOptions(resize=256).resize == 256
