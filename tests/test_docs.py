"""The documentation site builds with ``mkdocs --strict``: a link to a missing page or heading, a
page left out of the navigation, an API entry that names a missing object or a command reference
that cannot load fails the build, and so this test.

The second test shows the check is real: the same validation settings, on two small pages one of
which links to a heading that does not exist, make the build fail naming the anchor.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def _mkdocs(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", *args], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=240)


@pytest.mark.slow
def test_site_builds_strict_with_links_and_anchors_checked(tmp_path):
    out = _mkdocs("build", "--strict", "--site-dir", str(tmp_path / "site"), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    site = tmp_path / "site"
    format_page = (site / "format" / "index.html").read_text()
    assert "sfidx" in format_page and "__shardfeed_manifest__" in format_page
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert 'id="shardfeed-pack"' in cli and "--max-bytes" in cli  # from pack --help
    from shardfeed.convert.cli import main
    for name in main.commands:  # every command of the CLI has its section
        assert f'id="shardfeed-{name}"' in cli, name
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "shardfeed.readers.loader.make_loader" in api and "image_size" in api  # from the docstrings


def test_validation_settings_check_anchors():
    import yaml

    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!ENV", ""))
    assert cfg["strict"] is True
    assert cfg["validation"]["links"]["anchors"] == "warn"
    assert cfg["validation"]["links"]["not_found"] == "warn"


@pytest.mark.slow
def test_a_broken_anchor_fails_the_build(tmp_path):
    import yaml

    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n## A heading\n\nSee [the other page](other.md#no-such-heading).\n")
    (docs / "other.md").write_text("# Other\n\nBack to [a heading](index.md#a-heading).\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({
        "site_name": "t", "docs_dir": "docs", "strict": True, "validation": cfg["validation"],
        "markdown_extensions": [{"toc": {"permalink": True}}], "nav": ["index.md", "other.md"]}))
    out = _mkdocs("build", "--strict", "--site-dir", str(tmp_path / "site"), cwd=tmp_path)
    assert out.returncode != 0
    assert "no-such-heading" in out.stderr
    assert "a-heading" not in out.stderr.replace("no-such-heading", "")  # the good anchor passes


@pytest.mark.parametrize("package", ["shardfeed.readers", "shardfeed.convert"])
def test_api_reference_documents_every_public_name(package):
    """Each name a package exports is rendered on the API page, from the module it is defined in."""
    import importlib
    import re

    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    targets = re.findall(r"^::: (\S+)$", page, flags=re.MULTILINE)
    documented = set(targets)
    for target, members in re.findall(r"^::: (\S+)\n(?:    .*\n)*?\s+members: \[([^\]]*)\]", page, flags=re.MULTILINE):
        documented |= {f"{target}.{m.strip()}" for m in members.replace("\n", " ").split(",")}
    pkg = importlib.import_module(package)
    missing = []
    for name in pkg.__all__:
        if name == "__version__":
            continue
        module = getattr(pkg, name).__module__
        if f"{module}.{name}" not in documented:
            missing.append(f"{module}.{name}")
    assert not missing, f"not on docs/reference/api.md: {missing}"
