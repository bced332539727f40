"""shardfeed.readers: the on-disk format spec and the readers that feed a training loop.

``open_dataset``, ``make_loader``, ``to_device`` and ``watch`` (time the user's own loop) are
imported on first use (module ``__getattr__``), so ``import shardfeed.readers`` stays cheap and does not import torch.
"""
__all__ = ["__version__", "open_dataset", "make_loader", "to_device", "watch"]
__version__ = "0.1.0"

_LAZY = {
    "open_dataset": "shardfeed.readers.dataset",
    "make_loader": "shardfeed.readers.loader",
    "to_device": "shardfeed.readers.loader",
    "watch": "shardfeed.readers.measure.watch",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardfeed.readers' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
