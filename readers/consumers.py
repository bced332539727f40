"""Reading shardfeed's WebDataset shards with other libraries (issue 15, item 4).

Libraries that read a WebDataset sample as a dict of members (``{"__key__": ..., "jpg": bytes,
"cls": bytes, "json": bytes}``, as upstream ``webdataset`` and Ray Data do) see one column per
image extension: on a dataset mixing JPEG and PNG, half the rows lack each column, which breaks
readers that fix their columns from the first rows. :func:`webdataset_row` turns such a dict
into the same columns for every sample. Ray Data, for example::

    import ray.data
    from shardfeed.readers.consumers import webdataset_row

    ds = ray.data.read_webdataset("OUT", file_extensions=["tar"], decoder=webdataset_row)
    # columns: __key__, image (the original bytes), ext, label (int), meta (dict)

``file_extensions=["tar"]`` skips the offset indexes, ``manifest.json`` and the other files beside
the shards; ``decoder=webdataset_row`` replaces Ray's default decoder, which decodes images by
extension into arrays of varying shapes. Decode ``image`` in a ``map`` step (e.g. with
:func:`shardfeed.readers.decode.decode_image`, which gives every mode as RGB).

No import of torch, Ray or webdataset here.
"""

from __future__ import annotations

import json

from .format import DEFAULT_EXTENSIONS, normalize_ext

__all__ = ["webdataset_row", "IMAGE_EXTENSIONS"]

#: Member extensions taken as the image (shardfeed's canonical ones and their aliases).
IMAGE_EXTENSIONS = frozenset(DEFAULT_EXTENSIONS) | {"tif", "jpg"}


def webdataset_row(sample: dict) -> dict:
    """One raw WebDataset sample (a dict of member bytes) as fixed columns.

    Args:
        sample: ``{"__key__": str, "<image ext>": bytes, "cls": bytes, "json": bytes, ...}``;
            member names may carry a leading dot (``".jpg"``, as wids gives them).

    Returns:
        ``{"__key__": str, "image": bytes, "ext": str, "label": int, "meta": dict}``: the image's
        original encoded bytes and its canonical extension (``jpg``, ``png``...), the class index,
        the metadata (``{"path", "class", ...}``; ``{}`` without a ``json`` member).

    Raises:
        ValueError: the sample has no image member, several, or no ``cls`` (names the key).
    """
    members = {k.lstrip("."): v for k, v in sample.items() if not k.startswith("__")}
    images = [k for k in members if k.lower() in IMAGE_EXTENSIONS]
    key = sample.get("__key__", "?")
    if len(images) != 1:
        raise ValueError(f"sample {key}: {len(images)} image members ({', '.join(images) or 'none'}); expected one "
                         f"of {', '.join(sorted(IMAGE_EXTENSIONS))}")
    if "cls" not in members:
        raise ValueError(f"sample {key}: no cls member (class index)")
    meta = members.get("json")
    return {
        "__key__": key,
        "image": bytes(members[images[0]]),
        "ext": normalize_ext(images[0].lower()),
        "label": int(members["cls"]),
        "meta": json.loads(meta) if meta is not None else {},
    }
