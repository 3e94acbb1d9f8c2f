"""The one check of a name and the one escape of untrusted text (paretolab.data.names)."""

from __future__ import annotations

import pytest

from paretolab.data.names import check_name, is_name, printable
from paretolab.errors import ConfigError


@pytest.mark.parametrize("bad", ["", "x\n", "a\nb", "../x", "/abs", "a/b", ".hidden", "-x", "x" * 101, "naïve", "x\x1b[31m", "a b"])
def test_a_bad_name_is_refused_naming_field_and_rule(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_name(bad, "--as")
    line = str(err.value)
    assert line.startswith("--as: ") and "letters, digits" in line
    assert "\n" not in line and "\x1b" not in line  # the refusal itself prints safely


def test_a_trailing_newline_is_not_a_name() -> None:
    assert not is_name("demo\n")  # re.match's '$' would accept it


def test_names_equal_under_nfkc_are_one_name() -> None:
    assert check_name("ｄｅｍｏ") == check_name("demo") == "demo"


def test_printable_escapes_what_a_terminal_obeys() -> None:
    assert printable("a\nb\x1b[31mc\x07\u202ed") == "a\\nb\\x1b[31mc\\x07\\u202ed"
    assert printable("naïve — ok") == "naïve — ok"
