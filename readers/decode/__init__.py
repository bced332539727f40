"""Bytes to pixels: image decoding, the JPEG header walk, GPU decoding and the CPU transforms
that crop an image into the row of a batch."""
