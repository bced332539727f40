"""Batches: the buffers workers fill, their reuse and the ring of shared-memory slots the main process
reads them from."""
