#!/usr/bin/env python3
"""Pack and convert one image folder every way; print each output file's size and sha256 prefix.

For refactors that must not change a byte: run it with the code before and after the change on
the same folder and the same OUT path (manifests record the source and input paths), then diff
the two listings. ``lock.mdb`` (LMDB's runtime lock table) is left out: it is not part of a dataset.

Usage::

    python scripts/make_sample_data.py /tmp/fp/src --num-images 400 --min-size 32 --max-size 96
    printf 'not an image' > /tmp/fp/src/$(ls /tmp/fp/src | head -1)/zz_broken.jpg   # for --on-error skip
    python scripts/pack_fingerprints.py /tmp/fp/src /tmp/fp/out > before.txt     # old code
    python scripts/pack_fingerprints.py /tmp/fp/src /tmp/fp/out > after.txt      # new code
    diff before.txt after.txt
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import warnings
from pathlib import Path

__all__ = ["CASES", "LAYOUT_CASES", "make_outputs", "fingerprints"]

#: pack cases: name -> PackOptions fields (WebDataset by count and by bytes, skip + decode check,
#: LMDB, re-encoded WebDataset and LMDB)
CASES = {
    "wds_count": dict(format="wds", max_count=37, workers=2),
    "wds_bytes": dict(format="wds", max_bytes=150_000, workers=1, shuffle=False),
    "wds_skip": dict(format="wds", max_count=50, workers=2, on_error="skip", decode_check=True),
    "lmdb": dict(format="lmdb", workers=2, on_error="skip"),
    "wds_reenc": dict(format="wds", max_bytes=60_000, workers=2, reencode={"resize": 48}, on_error="skip"),
    "lmdb_reenc": dict(format="lmdb", workers=2, reencode={"resize": 40, "image_format": "png"}, on_error="skip"),
}

#: the same folder packed unlabelled (``pack --no-labels``), by the layout packer
LAYOUT_CASES = {
    "layout_unlabelled_wds": dict(format="wds", max_count=41, workers=1),
    "layout_unlabelled_lmdb": dict(format="lmdb", workers=1),
}

def make_outputs(src: Path, out: Path) -> None:
    """Every :data:`CASES` pack of ``src`` under ``out``, plus the two conversions (LMDB -> WebDataset
    through the streaming writer, WebDataset -> LMDB)."""
    from shardfeed.convert.write.pack import PackOptions, pack

    try:
        from shardfeed.convert.tools.convert import convert_dataset
    except ImportError:  # before the tools were split by command
        from shardfeed.convert.tools import convert_dataset

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name, fields in CASES.items():
            pack(src, out / name, PackOptions(**fields))
    convert_dataset(out / "lmdb", out / "conv_wds", format="wds", max_count=29, max_bytes=100_000)
    convert_dataset(out / "wds_count", out / "conv_lmdb", format="lmdb")
    try:  # the layouts beyond the class folder (absent from older code: nothing to compare there)
        from shardfeed.convert.write.layouts import LayoutOptions, pack_layout
    except ImportError:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name, fields in LAYOUT_CASES.items():
            pack_layout(src, out / name, PackOptions(**fields), LayoutOptions(no_labels=True))


def fingerprints(out: Path) -> list[str]:
    """``"relative/path size sha256[:16]"`` for every output file but ``lock.mdb``, sorted."""
    lines = []
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != "lock.mdb":
            data = p.read_bytes()
            lines.append(f"{p.relative_to(out)} {len(data)} {hashlib.sha256(data).hexdigest()[:16]}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="an ImageFolder")
    ap.add_argument("out", type=Path, help="output folder (replaced)")
    args = ap.parse_args()
    make_outputs(args.src, args.out)
    print("\n".join(fingerprints(args.out)))


if __name__ == "__main__":
    main()
