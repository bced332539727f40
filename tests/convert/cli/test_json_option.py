"""``--json`` takes a local path or ``-``: a URL is refused as such (it was taken for a local
folder named ``s3:`` and refused as "folder .../s3:/bucket does not exist")."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main


@pytest.mark.parametrize("url", ["s3://bucket/report.json", "http://host/report.json", "gs://b/r.json"])
def test_json_url_is_refused_as_a_url(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "nothing"), "--json", url])
    assert r.exit_code == 2, r.output
    assert url in r.output and "local path" in r.output and "does not exist" not in r.output
    assert not any(tmp_path.iterdir())


def test_json_file_url_is_the_local_path(tmp_path):
    import io

    from PIL import Image

    folder = tmp_path / "images" / "a"
    folder.mkdir(parents=True)
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 0, 0)).save(buf, "PNG")
    (folder / "x.png").write_bytes(buf.getvalue())
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "images"), "--json", f"file://{tmp_path}/r.json"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r.json").is_file()
