"""The tokenizer benchmark's prose: two corpora, each long enough to be cut to every size without repeating.

A corpus repeated to reach a size is not prose of that size: from its second copy on every word is
a word-cache hit, so it costs less per byte than prose does (pydoc, 0.47 MB, repeated 4 times to
reach 2 MB cost 11.2 ns/B against 17 for 2 MB of text that does not repeat, 2026-12-06) and every
ratio against it was stricter than the one the benchmark claims to report. Each corpus therefore
continues with more text of its kind:

- ``wikitext2``: the WikiText-2 test split (1.29 MB), then the Wikipedia passages of BoolQ's dev
  set (1.9 MB, ``mc/boolq.jsonl``): 3.2 MB of encyclopaedia prose.
- ``pydoc``: the Python reference manual's topics (``pydoc_data``, 0.47 MB), then every docstring
  of the standard library's modules, classes and functions (the ``pystdlib`` corpus's files, in
  path order): Python documentation, about 2 MB more.

Where the second part is not on this machine (no BoolQ file) the corpus is what it is; ``cut``
then repeats it and says so (the benchmark records which corpora were repeated at which size).
"""

from __future__ import annotations

import ast
from functools import lru_cache

from paretolab.data.corpora import load_corpus, pystdlib_files
from paretolab.errors import ConfigError

PROSE = ("wikitext2", "pydoc")


@lru_cache(maxsize=None)
def prose_corpora() -> dict[str, str]:
    """The two corpora, by name."""
    return {"wikitext2": "\n\n".join([load_corpus("wikitext2")[0], *boolq_passages()]),
            "pydoc": "\n\n".join([load_corpus("pydoc")[0], *stdlib_docstrings()])}


def boolq_passages() -> list[str]:
    """BoolQ's passages (Wikipedia paragraphs), without its questions; [] where the file is missing."""
    from paretolab.data.files import read_jsonl

    try:
        rows = read_jsonl("boolq")
    except ConfigError:
        return []
    passages = []
    for row in rows:
        query = str(row.get("query", ""))
        passage = query.split("Passage:", 1)[-1].split("\nQuestion:", 1)[0].strip()
        if passage:
            passages.append(passage)
    return passages


def stdlib_docstrings() -> list[str]:
    """Every docstring of the standard library's modules, classes and functions, in file then source order."""
    out = []
    for _, path in pystdlib_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    out.append(doc)
    return out


def cut(text: str, size: int) -> tuple[str, bool]:
    """``text`` cut to ``size`` UTF-8 bytes (whole characters); repeated first (blank line between) when shorter, and True then."""
    repeated = False
    while len(text.encode("utf-8")) < size:
        text, repeated = text + "\n\n" + text, True
    return text.encode("utf-8")[:size].decode("utf-8", errors="ignore"), repeated
