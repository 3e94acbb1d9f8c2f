"""Every YAML the platform reads goes through one loader: duplicate keys, syntax errors, alias bombs, odd files are one line."""

from __future__ import annotations

import time

import pytest

from tests.reliability.conftest import TINY, refused

BOMB = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))


def write(tmp_path, text, name="p.yaml"):
    path = tmp_path / name
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return str(path)


def test_a_top_level_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path):
    line = refused("check", write(tmp_path, TINY + "name: other\n"), cwd=tmp_path)
    assert "key 'name'" in line and "given twice" in line and "line 12" in line and "first on line 1" in line


def test_a_method_param_given_twice_is_refused(tmp_path):
    text = TINY.replace("params: {bits: [4, 8], group_size: 32}", "params: {bits: [4, 8], group_size: 32, bits: 2}")
    line = refused("check", write(tmp_path, text), cwd=tmp_path)
    assert "key 'bits' in stages[0].params is given twice" in line


def test_a_nested_block_key_given_twice_is_refused(tmp_path):
    text = TINY.replace("search: {sampler: random, trials: 2, seed: 0}", "search:\n  sampler: random\n  trials: 2\n  trials: 3\n")
    line = refused("check", write(tmp_path, text), cwd=tmp_path)
    assert "key 'trials' in search is given twice" in line and "line 13" in line


def test_a_merge_key_is_not_a_duplicate():
    from paretolab.study.yaml_read import read_yaml

    assert read_yaml("base: &b {x: 1, y: 2}\nover: {<<: *b, x: 3}\n", "t")["over"] == {"x": 3, "y": 2}


def test_a_syntax_error_keeps_line_column_and_caret(tmp_path):
    from tests.conftest import cli_here
    from tests.reliability.conftest import one_line

    proc = cli_here("check", write(tmp_path, TINY.replace("trials: 2,", "trials: 2: 3,")), cwd=tmp_path, check=False)
    assert "line 10, column 36: not valid YAML" in one_line(proc, lines=3)
    source, caret = proc.stderr.splitlines()[1:3]
    assert "trials: 2: 3" in source and caret.strip() == "^" and caret.index("^") == source.index("trials: 2: 3") + 9


def test_a_pipeline_that_is_a_directory_says_so(tmp_path):
    (tmp_path / "pipe").mkdir()
    assert "is a directory, not a YAML file" in refused("check", str(tmp_path / "pipe"), cwd=tmp_path)


def test_a_pipeline_not_utf8_is_one_line(tmp_path):
    assert "not UTF-8" in refused("check", write(tmp_path, TINY.encode() + b"# \xff\xfe\n"), cwd=tmp_path)


def test_an_unreadable_pipeline_is_one_line(tmp_path):
    import os

    path = write(tmp_path, TINY)
    os.chmod(path, 0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running as root: permissions do not bind")
        assert "cannot read it" in refused("check", path, cwd=tmp_path)
    finally:
        os.chmod(path, 0o644)


# paretolab.yaml, the store config every store-reading command reads first

def test_store_config_syntax_error_is_one_line_with_caret(tmp_path):
    write(tmp_path, "stores:\n  home: [oops\n", "paretolab.yaml")
    line = refused("studies", cwd=tmp_path, lines=3)
    assert "paretolab.yaml, line" in line and "column" in line


def test_store_config_alias_bomb_is_refused_fast(tmp_path):
    write(tmp_path, BOMB + "stores: {home: h}\n", "paretolab.yaml")
    start = time.monotonic()
    assert "aliases expand to more than" in refused("studies", cwd=tmp_path)
    assert time.monotonic() - start < 10


def test_store_config_duplicate_key_is_refused(tmp_path):
    write(tmp_path, "stores:\n  home: a\n  home: b\n", "paretolab.yaml")
    assert "key 'home' in stores is given twice" in refused("studies", cwd=tmp_path)


def test_store_config_that_is_a_directory_is_one_line(tmp_path):
    (tmp_path / "paretolab.yaml").mkdir()
    assert "is a directory" in refused("studies", cwd=tmp_path)


def test_store_config_not_utf8_is_one_line(tmp_path):
    write(tmp_path, b"stores:\n  home: \xff\n", "paretolab.yaml")
    assert "not UTF-8" in refused("studies", cwd=tmp_path)


def test_store_config_named_by_env_as_a_directory(tmp_path):
    (tmp_path / "cfgdir").mkdir()
    assert "is a directory" in refused("frontier", "x", cwd=tmp_path, env={"PARETOLAB_CONFIG": str(tmp_path / "cfgdir")})


def test_a_flow_mapping_duplicate_is_refused():
    from paretolab.study.yaml_read import read_yaml
    from paretolab.errors import ConfigError

    with pytest.raises(ConfigError, match="key 'a' is given twice"):
        read_yaml("{a: 1, b: 2, a: 3}", "t")
