"""Shared fixtures: the real SmolLM2 tokenizer, loaded once per session, and both backends."""

from __future__ import annotations

from typing import Any

import pytest

from paretolab.plugins.incremental_bpe import IncrementalBPE, c_extension_available


@pytest.fixture(scope="session")
def hf() -> Any:
    from transformers import AutoTokenizer

    from paretolab.models import SmolLM2

    return AutoTokenizer.from_pretrained(SmolLM2().pull())


@pytest.fixture(scope="session")
def hf_ids(hf: Any) -> Any:
    """The ground truth: ``hf.encode(text, add_special_tokens=False)``."""
    return lambda text: hf.encode(text, add_special_tokens=False)


@pytest.fixture(scope="session")
def tok_py(hf: Any) -> IncrementalBPE:
    return IncrementalBPE.from_hf(hf, backend="python")


@pytest.fixture(scope="session")
def tok_c(hf: Any, tok_py: IncrementalBPE) -> IncrementalBPE:
    if not c_extension_available():
        pytest.fail("the C extension _fast is not built: run `pip install -e .`")
    return IncrementalBPE(tok_py.tables, backend="c")


@pytest.fixture(scope="session", params=["c", "python"])
def tok(request: pytest.FixtureRequest) -> IncrementalBPE:
    return request.getfixturevalue(f"tok_{'py' if request.param == 'python' else 'c'}")
