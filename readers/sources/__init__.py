"""The datasets a loader reads: ``open_dataset`` and its options, what every source shares, the folder,
WebDataset, LMDB and in-memory sources, and mixing several sources."""
