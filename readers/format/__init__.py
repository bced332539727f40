"""The on-disk format: the manifest and its naming rules, the offset index, the LMDB record, tar reading,
the image-folder layout and its link rule, and the one registry of formats."""
