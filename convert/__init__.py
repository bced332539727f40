"""shardfeed.convert: scan image folders and pack them into WebDataset shards or LMDB."""
__all__ = []
