"""The documentation site builds with ``mkdocs --strict``: a link to a missing page or heading, a
page left out of the navigation, an API entry that names a missing object or a command reference
that cannot load fails the build, and so this test.

The second test shows the check is real: the same validation settings, on two small pages one of
which links to a heading that does not exist, make the build fail naming the anchor.

The built site is then opened in headless Chromium at a desktop width (1280 px): on the home page and
two long pages no code block scrolls sideways, and every link resolves on a local server (the page
answers 200, the ``#anchor`` names an element of that page). Links to other hosts are listed, not
fetched. A static test keeps every code line of the Markdown pages within ``MAX_CODE_LINE``.
"""

from __future__ import annotations

import html.parser
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
#: The longest line a fenced code block in the Markdown pages may have, in characters. At 1280 px the
#: theme's content column shows 80 characters of its monospace font; a longer line scrolls sideways.
MAX_CODE_LINE = 80
#: Pages opened in the browser, relative to the site root: the home page and two long pages.
BROWSER_PAGES = ("", "reading/", "performance/")
VIEWPORT = {"width": 1280, "height": 1000}


def _mkdocs(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", *args], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=240)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    """The site as ``make docs`` builds it (``mkdocs build --strict``), in a temporary folder."""
    site = tmp_path_factory.mktemp("docs") / "site"
    out = _mkdocs("build", "--strict", "--site-dir", str(site), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    return site


@pytest.mark.slow
def test_site_builds_strict_with_links_and_anchors_checked(built_site):
    site = built_site
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


def _code_block_lines(text: str) -> list[str]:
    """The lines of every code block of a Markdown text as the site renders it: fenced and indented
    blocks, with the site's Markdown extensions. Files a page includes (``--8<--``) are not read."""
    import markdown
    import yaml

    extensions, configs = [], {}
    for entry in yaml.safe_load((ROOT / "mkdocs.yml").read_text())["markdown_extensions"]:
        name, options = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
        if name not in ("pymdownx.snippets", "mkdocs-click"):
            extensions.append(name)
            configs[name] = options or {}
    rendered = markdown.markdown(text, extensions=extensions, extension_configs=configs)
    return [line for block in re.findall(r"<pre\b[^>]*>(.*?)</pre>", rendered, flags=re.S)
            for line in html.unescape(re.sub(r"<[^>]+>", "", block)).splitlines()]


def test_code_block_lines_are_found():
    text = ("# T\n\n```sh\nx && y  # z\n```\n\nprose\n\n    indented <code>\n\n"
            "- item\n\n    ```py\n    a = [1,\n         2]\n    ```\n\n`inline code`\n")
    assert _code_block_lines(text) == ["x && y  # z", "indented <code>", "a = [1,", "     2]"]


def test_code_lines_fit_the_page():
    """A longer line makes its block scroll sideways on a desktop screen: wrap shell commands with
    ``\\`` and Python inside brackets."""
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    too_long = [f"{page.relative_to(ROOT)}: {len(line)} characters: {line}"
                for page in pages for line in _code_block_lines(page.read_text(encoding="utf-8"))
                if len(line) > MAX_CODE_LINE]
    assert not too_long, f"code lines over {MAX_CODE_LINE} characters:\n" + "\n".join(too_long)


class _Ids(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.ids.update(value for name, value in attrs if name == "id" and value)


def _fetch_ids(url: str) -> tuple[int, set[str]]:
    """HTTP status of ``url`` on the local server and, for an HTML page, the ids of its elements."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = response.read(20_000_000)
            status, kind = response.status, response.headers.get_content_type()
    except urllib.error.HTTPError as exc:
        return exc.code, set()
    parser = _Ids()
    if kind == "text/html":
        parser.feed(body.decode("utf-8", errors="replace"))
    return status, parser.ids


#: For each ``pre > code`` element wider than its box: its width, its box's, and its longest line.
OVERFLOWING_CODE_JS = """codes => codes.filter(c => c.scrollWidth > c.clientWidth + 1).map(c => ({
    scroll: c.scrollWidth, client: c.clientWidth,
    line: c.textContent.split('\\n').reduce((a, b) => b.length > a.length ? b : a, '')}))"""


def _link_problems(page, url: str, host: str, checked: dict) -> tuple[list[str], list[str], int]:
    """The broken links of the open page, its links to other hosts, and how many links have an anchor.

    A link to the local server must answer 200; its ``#anchor`` must be the id of an element of
    the target page. ``checked`` caches ``_fetch_ids`` per target URL.
    """
    problems, external, anchors = [], [], 0
    for raw, absolute in page.eval_on_selector_all("a[href]", "as => as.map(a => [a.getAttribute('href'), a.href])"):
        parts = urlsplit(absolute)
        if parts.scheme not in ("http", "https") or parts.netloc != host:
            external.append(absolute)
            continue
        target = urlunsplit(parts._replace(fragment=""))
        if target not in checked:
            checked[target] = _fetch_ids(target)
        status, ids = checked[target]
        if status != 200:
            problems.append(f"{url}: link {raw!r} answers HTTP {status}")
        elif parts.fragment and unquote(parts.fragment) not in ids:
            problems.append(f"{url}: link {raw!r}: no element with id {unquote(parts.fragment)!r} on {target}")
        anchors += bool(parts.fragment)
    return problems, external, anchors


def _overflow_problems(page, url: str) -> tuple[list[str], int]:
    """The open page's code blocks wider than their box, and how many code blocks it has."""
    problems = [f"{url}: code block {o['scroll']} px wide in {o['client']} px: {o['line']!r}"
                for o in page.eval_on_selector_all("pre > code", OVERFLOWING_CODE_JS)]
    return problems, page.eval_on_selector_all("pre > code", "cs => cs.length")


@pytest.mark.slow
@pytest.mark.network
def test_site_pages_fit_a_desktop_screen_and_their_links_resolve(built_site, start_http_server, launch_chromium):
    base = start_http_server(built_site)
    host = urlsplit(base).netloc
    checked: dict[str, tuple[int, set[str]]] = {}
    problems, external = [], set()
    with launch_chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        # offline: only the local server answers (web fonts and the like fall back to local ones)
        page.route("**/*", lambda route: route.continue_() if urlsplit(route.request.url).netloc == host
                   else route.abort())
        for rel in BROWSER_PAGES:
            url = f"{base}/{rel}"
            response = page.goto(url, wait_until="load")
            assert response is not None and response.status == 200, url
            overflowing, blocks = _overflow_problems(page, url)
            broken, links_out, anchors = _link_problems(page, url, host, checked)
            assert blocks > 0 and anchors > 0, rel  # the checks had something to check
            problems += overflowing + broken
            external.update(links_out)
        # the checks are real: on the last page, a planted long code line overflows, and links to a
        # missing page and to a missing id are reported
        page.evaluate("""() => {
            const pre = document.createElement('pre'), code = document.createElement('code');
            code.textContent = 'x'.repeat(200);
            pre.appendChild(code);
            document.querySelector('article').appendChild(pre);
            for (const href of ['../no-such-page/', '#no-such-id']) {
                const a = document.createElement('a');
                a.href = href;
                document.querySelector('article').appendChild(a);
            } }""")
        planted = [p for p in _overflow_problems(page, url)[0] + _link_problems(page, url, host, checked)[0]
                   if p not in problems]
        assert len(planted) == 3 and planted[0].endswith(f"px: {'x' * 200!r}"), planted
        assert planted[1:] == [f"{url}: link '../no-such-page/' answers HTTP 404",
                               f"{url}: link '#no-such-id': no element with id 'no-such-id' on {url}"]
    assert len(checked) > 3
    print(f"external links, not fetched ({len(external)}):", *sorted(external), sep="\n  ")
    assert not problems, "\n".join(problems)
