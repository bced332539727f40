"""shardfeed.readers: the on-disk format spec and the readers that feed a training loop."""
__all__ = ["__version__"]
__version__ = "0.1.0"
