"""The order of an epoch, as pure functions of positions: the split across ranks and workers, resuming,
the seeded permutation and the shuffle buffer's order."""
