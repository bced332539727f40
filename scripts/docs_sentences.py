#!/usr/bin/env python3
"""Words per sentence in the documentation's prose, page by page.

How it counts:

* Prose only. Fenced code blocks (```` ``` ```` or ``~~~``, indented or not), indented code blocks
  (four spaces after a blank line, outside a list), table rows (lines that start with ``|``),
  headings (``#``), HTML lines (``<``) and snippet includes (``--8<--``) are left out.
* List items count. Each list item starts a new paragraph; its continuation lines belong to it.
  The ``-``, ``*``, ``+`` or ``1.`` marker is not a word.
* Sentences never cross a paragraph. Inside one, a sentence ends at ``.``, ``!`` or ``?`` followed
  by white space and then a capital letter, a digit, a backtick, an opening parenthesis, a quote
  or the word "shardfeed" (the product's name is written in lower case).
* Inline code counts as one word, whatever it holds. A link counts as its text, not its address.
  Emphasis marks are dropped.
* A word is a run of non-space characters with at least one letter or digit; a lone dash or
  arrow is not a word.
* Sentences under 3 words are ignored: they are labels, not sentences.
* ``--tables`` also counts table cells, each cell a paragraph (the rule rows left out). The test
  and ``--max-average`` use the default, prose only.

The average is words divided by sentences. The overall average pools every sentence of every
page, so a long page weighs more than a short one.

Usage::

    python scripts/docs_sentences.py                     # docs/*.md
    python scripts/docs_sentences.py --max-average 25    # exit 1 above 25 words a sentence
    python scripts/docs_sentences.py --long 40 docs/reading.md   # list sentences over 40 words
    python scripts/docs_sentences.py --tables            # table cells counted too
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: A sentence needs at least this many words to count.
MIN_WORDS = 3
#: A sentence over this many words is "long" in the report.
LONG_WORDS = 40

_FENCE = re.compile(r"^\s*(```|~~~)")
_LIST_ITEM = re.compile(r"^(\s*)(?:[-*+]|\d+[.)])\s+")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]*)\](?:\([^)]*\)|\[[^\]]*\])")
_AUTOLINK = re.compile(r"<(?:https?://|mailto:)[^>]+>")
_EMPHASIS = re.compile(r"(\*\*|__|\*|(?<!\w)_(?=\w)|(?<=\w)_(?!\w))")
_SPLIT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9`(\"']|shardfeed\b)")
_WORD = re.compile(r"\w")
_TABLE_RULE = re.compile(r"^\|?[\s:|-]+$")
#: Inline code becomes this single token; it starts with a backtick so a sentence may begin with it.
_CODE_TOKEN = "`code`"


@dataclass(frozen=True)
class Sentence:
    """One counted sentence: its page, its word count and its text (inline code shown as `code`)."""

    page: str
    words: int
    text: str


def paragraphs(text: str, tables: bool = False) -> list[str]:
    """The prose paragraphs of a Markdown text, each joined into one line (see the module docstring).

    With ``tables``, each cell of a table row is a paragraph too (``--tables``).
    """
    paras: list[list[str]] = []
    current: list[str] = []
    fence = ""
    in_list = False
    in_indented_code = False
    blank_before = True

    def close() -> None:
        nonlocal current
        if current:
            paras.append(current)
        current = []

    for line in text.splitlines():
        stripped = line.strip()
        match = _FENCE.match(line)
        if fence:
            if match and stripped.startswith(fence):
                fence = ""
            continue
        if match:
            close()
            fence = match.group(1)
            continue
        if not stripped:
            close()
            blank_before = True
            continue
        indent = len(line) - len(line.lstrip(" "))
        if tables and stripped.startswith("|") and not _TABLE_RULE.match(stripped):
            close()
            paras.extend([cell.strip()] for cell in re.split(r"(?<!\\)\|", stripped.strip("|")))
            in_list = in_list and indent > 0
            blank_before = False
            continue
        item = _LIST_ITEM.match(line)
        if in_indented_code and indent >= 4:
            continue  # the indented code block goes on
        in_indented_code = False
        if item:
            close()
            in_list = True
            current.append(line[item.end():].strip())
        elif indent >= 4 and blank_before and not in_list:
            close()  # an indented code block starts
            in_indented_code = True
        elif indent == 0 and blank_before:
            in_list = False
            if stripped.startswith(("|", "#", "<", "--8<--")):
                close()
            else:
                current.append(stripped)
        elif stripped.startswith(("|", "#", "<", "--8<--")):
            close()
        else:
            current.append(stripped)
        blank_before = False
    close()
    return [" ".join(p) for p in paras]


def split_sentences(paragraph: str) -> list[str]:
    """The sentences of one prose paragraph, with inline code, links and emphasis simplified."""
    text = _INLINE_CODE.sub(_CODE_TOKEN, paragraph)
    text = _IMAGE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _AUTOLINK.sub("link", text)
    text = _EMPHASIS.sub("", text)
    return [s.strip() for s in _SPLIT.split(text) if s.strip()]


def word_count(sentence: str) -> int:
    """Words of a sentence: runs of non-space characters holding a letter or a digit."""
    return sum(1 for token in sentence.split() if token == _CODE_TOKEN or _WORD.search(token))


def page_sentences(text: str, page: str = "", tables: bool = False) -> list[Sentence]:
    """Every counted sentence (``MIN_WORDS`` words or more) of a Markdown text; table cells too with
    ``tables``."""
    out = []
    for para in paragraphs(text, tables):
        for sentence in split_sentences(para):
            words = word_count(sentence)
            if words >= MIN_WORDS:
                out.append(Sentence(page, words, sentence))
    return out


def measure(pages: list[Path], tables: bool = False) -> dict[str, list[Sentence]]:
    """The counted sentences of each page, by the page's file name; table cells too with ``tables``."""
    return {page.name: page_sentences(page.read_text(encoding="utf-8"), page.name, tables) for page in pages}


def average(sentences: list[Sentence]) -> float:
    """Words per sentence; 0.0 for no sentences."""
    return sum(s.words for s in sentences) / len(sentences) if sentences else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="Markdown files (default: docs/*.md)")
    parser.add_argument("--max-average", type=float, help="exit 1 when the overall average is above this")
    parser.add_argument("--long", type=int, metavar="N", help="also list every sentence over N words")
    parser.add_argument("--tables", action="store_true", help="count the text of table cells too")
    args = parser.parse_args(argv)
    pages = args.pages or sorted((ROOT / "docs").glob("*.md"))
    by_page = measure(pages, args.tables)
    print(f"{'page':24s} {'sentences':>9s} {'avg words':>9s} {'>40 words':>9s}")
    every: list[Sentence] = []
    for name, sentences in by_page.items():
        every += sentences
        if sentences:
            long_share = sum(s.words > LONG_WORDS for s in sentences) / len(sentences)
            print(f"{name:24s} {len(sentences):9d} {average(sentences):9.1f} {long_share:9.0%}")
    long_share = sum(s.words > LONG_WORDS for s in every) / len(every) if every else 0.0
    overall = average(every)
    print(f"{'all pages':24s} {len(every):9d} {overall:9.1f} {long_share:9.0%}")
    if args.long is not None:
        for s in every:
            if s.words > args.long:
                print(f"\n{s.page}: {s.words} words: {s.text}")
    if args.max_average is not None and overall > args.max_average:
        print(f"the average, {overall:.1f} words a sentence, is over {args.max_average:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
