"""A typed name -> object registry that refuses duplicates and answers a miss with "did you mean"."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from typing import Generic, TypeVar

from paretolab.errors import DuplicateNameError, UnknownNameError

T = TypeVar("T")
SHORT_LIST = 12  # a registry this small lists every name in an unknown-name error


class Registry(Generic[T]):
    """Holds one kind of plugin object (methods, tasks, ...) by its ``name``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._owners: dict[str, str] = {}

    def register(self, item: T, *, owner: str = "?") -> None:
        """Add ``item`` under ``item.name``; a second object with the same name is refused."""
        name = getattr(item, "name", None)
        if not isinstance(name, str) or not name:
            raise DuplicateNameError(
                f"{self.kind} from plugin {owner!r} has no usable `name` (got {name!r}); "
                f"set a class attribute like name = 'my_{self.kind}'"
            )
        if name in self._items:
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered twice: by plugin {self._owners[name]!r} "
                f"and by plugin {owner!r}; rename one of them"
            )
        self._items[name] = item
        self._owners[name] = owner

    def get(self, name: str) -> T:
        """The object registered as ``name``, or an error that suggests the closest names."""
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        """One short line: the closest few names (or those whose description names the word), and where the rest are.

        A short registry lists every name; a long one (metrics: ~200) says which command lists them, instead of
        printing them all on one line after the suggestions.
        """
        close = self.closest(name)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        if len(self._items) <= SHORT_LIST:
            return f"unknown {self.kind} {name!r}{hint} (known: {', '.join(sorted(self._items)) or 'none'})"
        where = "`paretolab models list`" if self.kind == "model" else "`paretolab plugins`"
        return f"unknown {self.kind} {name!r}{hint} ({where} lists all {len(self._items)} {self.kind}s)"

    def closest(self, name: str, n: int = 3) -> list[str]:
        """Up to ``n`` names spelled like ``name``; failing those, names whose description mentions it, or a word
        spelled like it (``perplexity`` or ``perplexty`` -> ppl)."""
        close = difflib.get_close_matches(str(name), list(self._items), n=n, cutoff=0.6)
        wanted = str(name).lower().strip()
        if close or not wanted:
            return close
        described = {k: str(getattr(item, "description", "")).lower() for k, item in self._items.items()}
        vocabulary = sorted({w for text in described.values() for w in re.findall(r"[a-z][a-z0-9_-]+", text)})
        words = [wanted] if wanted in vocabulary else difflib.get_close_matches(wanted, vocabulary, n=2, cutoff=0.8)
        found: dict[str, int] = {}
        for word in words:
            pattern = re.compile(rf"\b{re.escape(word)}\b")
            for k, text in described.items():
                hit = pattern.search(text)
                if hit and hit.start() < found.get(k, 1 << 30):
                    found[k] = hit.start()
        # the word earliest in its description first (what the name *is*, not what it is compared with), then the shortest name
        return sorted(found, key=lambda k: (found[k], len(k), k))[:n]

    def owner(self, name: str) -> str:
        """The plugin that registered ``name``."""
        self.get(name)
        return self._owners[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[T]:
        return iter(self._items[n] for n in self.names())

    def __len__(self) -> int:
        return len(self._items)
