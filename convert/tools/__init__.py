"""The dataset tools, one module per ``shardfeed`` command (none imports torch or webdataset).

* :mod:`.inspect` — ``shardfeed inspect``: describe a dataset (format, classes with counts, shards).
* :mod:`.check` — ``shardfeed check``: recompute sha256, sizes, sample counts, CRC-32s.
* :mod:`.unpack` — ``shardfeed unpack``: the image folder back, byte for byte.
* :mod:`.convert` — ``shardfeed convert``: WebDataset <-> LMDB, re-sharding.
* :mod:`.stage` — ``shardfeed stage``: copy to fast local storage, verified and resumable.
* :mod:`.index` — ``shardfeed index``: manifest + offset index for shards made by other tools.
* :mod:`.serve` — ``shardfeed serve``: a threaded HTTP server with Range requests.
* :mod:`.common` — what they share: :class:`~.common.DatasetLocation`, sequential reading,
  problem lists.

Each function returns a report object (``to_json()`` for ``--json``, ``summary()`` for the human
line); only the command line (:mod:`shardfeed.convert.cli`) prints.
"""

__all__: list[str] = []
