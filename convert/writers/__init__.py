"""Writers of the dataset formats (the model: MosaicML streaming's ``format/``).

* :mod:`.shard`: the one WebDataset shard writer (:class:`~.shard.ShardWriter`) and its one
  rollover rule (:class:`~.shard.ShardLimits`).
* :mod:`.webdataset`: the streaming :class:`~.webdataset.WebDatasetWriter` and the WebDataset
  packers (planned shards; shards cut from re-encoded sizes).
* :mod:`.lmdb_store` and :mod:`.lmdb`: the one ``data.mdb`` writer, the LMDB packer and
  :class:`~.lmdb.LmdbWriter`.

Importing this package registers each format's packer, writer, checker and record reader in the
format registry (:mod:`shardfeed.readers.format.registry`) by dotted reference; the modules load on first use.
"""

from shardfeed.readers.format.registry import register_format

__all__: list[str] = []

register_format("webdataset", packer="shardfeed.convert.writers.webdataset:pack_webdataset",
                writer="shardfeed.convert.writers.webdataset:WebDatasetWriter",
                checker="shardfeed.convert.tools.check:check_tar_shards")
register_format("lmdb", packer="shardfeed.convert.writers.lmdb:pack_lmdb",
                writer="shardfeed.convert.writers.lmdb:LmdbWriter",
                checker="shardfeed.convert.tools.check:check_lmdb_records",
                records="shardfeed.convert.tools.common:iter_lmdb_records")
