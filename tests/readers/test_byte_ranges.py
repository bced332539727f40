"""A byte range no storage serves alike (negative start, end before start, a non-integer bound) is
the same error on a local disk, over HTTP and in a bucket, before any request is made."""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed.readers.storage.http_io import HttpLocation
from shardfeed.readers.storage.location import LocalLocation, check_byte_range
from shardfeed.readers.storage.objstore import StoreLocation

BAD = [(-5, None, ValueError), (10, 4, ValueError), (1.5, None, TypeError), (True, None, TypeError),
       (0, "9", TypeError)]


@pytest.mark.parametrize("start,end,error", BAD)
def test_bad_ranges_are_refused_alike_before_any_request(start, end, error, tmp_path):
    (tmp_path / "f.bin").write_bytes(bytes(range(16)))
    locations = [LocalLocation(tmp_path),
                 HttpLocation("http://127.0.0.1:9/ds/"),   # port 9: nothing listens, so no request may be made
                 StoreLocation("s3://bucket/ds/", storage_options={"endpoint_url": "http://127.0.0.1:9"})]
    for loc in locations:
        with pytest.raises(error, match="byte range"):
            loc.open("f.bin", start, end)


def test_good_ranges_pass_and_a_local_read_starts_at_start(tmp_path):
    data = bytes(range(16))
    (tmp_path / "f.bin").write_bytes(data)
    for start, end in ((0, None), (3, 3), (np.int64(4), np.int64(9))):
        check_byte_range("f.bin", start, end)
    f, offset = LocalLocation(tmp_path).open("f.bin", np.int64(4), 9)
    with f:
        assert offset == 4 and f.read(5) == data[4:9]
