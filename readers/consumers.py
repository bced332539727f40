"""Reading shardfeed's WebDataset shards with other libraries.

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
:func:`shardfeed.readers.decode.image.decode_image`, which gives every mode as RGB).

No import of torch, Ray or webdataset here.
"""

from __future__ import annotations

import json

from .format.sample_members import sample_from_members

__all__ = ["webdataset_row"]


def webdataset_row(sample: dict) -> dict:
    """One raw WebDataset sample (a dict of member bytes) as fixed columns.

    The members are grouped by shardfeed's one rule
    (:func:`~shardfeed.readers.format.sample_members.sample_from_members`), as in its own readers and tools.

    Args:
        sample: ``{"__key__": str, "<image ext>": bytes, "cls": bytes, "json": bytes, ...}``;
            member names may carry a leading dot (``".jpg"``, as wids gives them).

    Returns:
        ``{"__key__": str, "image": bytes, "ext": str, "label": int, "meta": dict}``: the image's
        original encoded bytes and its canonical extension (``jpg``, ``png``...), the class index,
        the metadata (``{"path", "class", ...}``; ``{}`` without a ``json`` member).

    Raises:
        shardfeed.readers.errors.CorruptDataError: no image member or several, or no class index
            (names the key).
    """
    key = sample.get("__key__", "?")
    parts = {k.lstrip("."): v for k, v in sample.items() if not k.startswith("__")}
    data, ext, label, meta = sample_from_members(key, parts, None, str(sample.get("__url__", "<sample>")))
    return {"__key__": key, "image": bytes(data), "ext": ext, "label": label,
            "meta": json.loads(meta) if meta is not None else {}}
