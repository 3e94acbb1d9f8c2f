"""Every document write is all-or-nothing (issue 69): `results render` under a file-size limit, on a full disk or killed
with SIGKILL leaves the previous document byte for byte as it was and no temporary file; the error is one line."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from paretolab.data.outputs import write_atomic
from tests.conftest import cli_here
from tests.reliability.conftest import one_line
from tests.results.test_documents import checkout  # noqa: F401 - fixture

PREVIOUS = "# One\n\nthe previous document, which a failed render must leave as it is\n"


def render(root: Path, before: str = "") -> subprocess.CompletedProcess:
    """`paretolab results render` in a fresh process; ``before``: Python run first (a limit, a planted kill)."""
    code = f"import os, sys, signal, resource\n{before}\nfrom paretolab.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "results", "render", "--root", str(root)], cwd=root,
                          capture_output=True, text=True, timeout=600)


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


@pytest.fixture
def rendered(checkout):  # noqa: F811 - the fixture imported above
    """The checkout rendered once (the size of ONE.md known), then ONE.md set back to a short previous text."""
    cli_here("results", "render", "--root", str(checkout), cwd=checkout)
    document = checkout / "pipelines" / "ONE.md"
    size = document.stat().st_size
    document.write_text(PREVIOUS)
    return checkout, document, size


def test_render_under_a_file_size_limit_keeps_the_previous_document(rendered):
    root, document, size = rendered
    limit = size // 2  # the new document does not fit; the previous one does
    assert len(PREVIOUS) < limit
    proc = render(root, f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))")
    line = one_line(proc)
    assert "results render: writing pipelines/ONE.md failed (File too large)" in line, line
    assert document.read_text() == PREVIOUS and temporaries(document.parent) == []


def test_render_killed_mid_write_keeps_the_previous_document_and_the_next_render_clears_its_temporary(rendered):
    root, document, size = rendered
    proc = render(root, "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)")  # every byte written, not yet renamed
    assert proc.returncode == -9
    assert document.read_text() == PREVIOUS
    assert len(temporaries(document.parent)) == 1  # what a SIGKILL leaves: a hidden temporary, never a cut document
    proc = render(root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert document.stat().st_size == size and temporaries(document.parent) == []


def test_render_on_a_full_disk_is_one_line_and_keeps_the_previous_document(rendered, monkeypatch):
    root, document, _ = rendered
    real = os.fdopen

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            self.handle.write(data[:100])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.handle, name)

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Full(real(fd, *a, **k)))
    line = one_line(cli_here("results", "render", "--root", str(root), cwd=root, check=False))
    assert "writing pipelines/ONE.md failed (No space left on device)" in line
    assert document.read_text() == PREVIOUS and temporaries(document.parent) == []


def test_write_atomic_replaces_whole_with_the_umask_and_cleans_up_on_any_failure(tmp_path):
    target = tmp_path / "doc.md"
    target.write_text("old")
    before = os.umask(0o027)
    try:
        write_atomic(target, "new")
    finally:
        os.umask(before)
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640 and temporaries(tmp_path) == []
    with pytest.raises(TypeError):
        write_atomic(target, 3)  # type: ignore[arg-type]
    assert target.read_text() == "new" and temporaries(tmp_path) == []
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    left = tmp_path / f".doc.md.p{dead}-abc.tmp"  # a killed writer's
    left.write_text("half")
    write_atomic(target, "newer")
    assert target.read_text() == "newer" and temporaries(tmp_path) == []
