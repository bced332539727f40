"""The public API at the two packages' top level: every name in ``__all__`` resolves to the object
its defining module exports, ``__version__`` is the installed distribution's version, and the
top-level imports stay light (no torch for ``shardfeed.convert``)."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", ["shardfeed.convert", "shardfeed.readers"])
def test_every_public_name_resolves(package):
    pkg = importlib.import_module(package)
    for name in pkg.__all__:
        value = getattr(pkg, name)
        if name == "__version__":
            continue
        module = importlib.import_module(value.__module__)
        assert getattr(module, name) is value, (package, name)
        assert name in module.__all__, (value.__module__, name)
    assert set(pkg.__all__) <= set(dir(pkg))
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        pkg.nonexistent  # noqa: B018


def test_pack_is_the_function_even_after_its_module_was_imported():
    code = ("import shardfeed.convert.write.pack, shardfeed.convert.cli; from shardfeed.convert import pack, "
            "PackOptions;"
            "assert callable(pack) and not hasattr(pack, '__path__') and pack.__name__ == 'pack', pack")
    subprocess.run([sys.executable, "-P", "-c", code], check=True, cwd=ROOT)


def test_version_is_single_sourced():
    import shardfeed.convert
    import shardfeed.readers
    from shardfeed.readers.format.manifest import created_by

    installed = importlib.metadata.version("shardfeed")
    assert shardfeed.convert.__version__ == shardfeed.readers.__version__ == installed
    assert created_by() == f"shardfeed {installed}"
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and "\nversion =" not in text.split("[project.optional")[0]


def test_top_level_imports_stay_light():
    code = ("import sys, shardfeed.convert, shardfeed.readers;"
            "bad = [m for m in ('torch', 'webdataset', 'cv2', 'click') if m in sys.modules];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-P", "-c", code], check=True, cwd=ROOT)


def test_both_packages_ship_py_typed():
    for folder in ("convert", "readers"):
        assert (ROOT / folder / "py.typed").is_file()
    text = (ROOT / "pyproject.toml").read_text()
    assert '"shardfeed.convert" = ["py.typed"]' in text and '"shardfeed.readers" = ["py.typed"]' in text


@pytest.mark.parametrize("package", ["shardfeed.convert", "shardfeed.readers"])
def test_all_lists_every_lazy_name(package):
    pkg = importlib.import_module(package)
    assert set(pkg._LAZY) <= set(pkg.__all__)
    assert len(pkg.__all__) == len(set(pkg.__all__))
