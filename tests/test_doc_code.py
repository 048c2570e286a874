"""scripts/check_doc_code.py, the lint step for the Python blocks of README.md and docs/*.md:
run for real on Markdown files written here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECKER = Path(__file__).resolve().parents[1] / "scripts" / "check_doc_code.py"

FORMATTED = """\
import kronos_audit as ka

with ka.Run("heat", seed=1) as run:
    state = run.restore()  # one space before a comment, as ruff writes it
"""

UNFORMATTED = """\
policy = Auto("24h") | OnPreemption()          # aligned comments
policy = EverySteps(1000)                      # are not ruff's style
"""

# 95 characters: the project's line length (100) keeps it, ruff's default (88) would not.
LONG = (
    'result = supervise(["python", "train.py"], retries=3, backoff=Backoff(1, 60),'
    " on_event=print)\n"
)

DOC = f"""\
# A page

```python
{FORMATTED}```

Text between blocks.

```python
{UNFORMATTED}```

```python
for i in range(3)
    print(i)
```

```python
# fragment: the middle of a loop, shown alone
    run.checkpoint(step, state)
```

```bash
x    =   1   # a shell block is not Python: never checked
```

~~~py
{LONG}~~~

1. In a list:

   ```python
   x  =  1
   ```
"""


def check(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECKER), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line of ``text`` containing ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_unformatted_and_uncompilable_blocks_are_named_by_file_and_line(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(DOC)
    done = check(doc, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    unformatted = line_of(DOC, "aligned comments")
    uncompilable = line_of(DOC, "for i in range(3)")
    in_list = line_of(DOC, "x  =  1")
    named = sorted(
        int(line.split(":")[1]) for line in done.stdout.splitlines() if line.startswith("page.md:")
    )
    assert named == [unformatted, uncompilable, in_list], done.stdout
    assert f"page.md:{uncompilable}: line 1 of the block does not compile" in done.stdout
    # ruff's own formatting is shown, as a diff
    assert '+policy = Auto("24h") | OnPreemption()  # aligned comments' in done.stdout
    assert "+x = 1" in done.stdout
    assert "5 python block(s) checked, 1 fragment(s) skipped, 3 failing" in done.stderr


def test_formatted_blocks_pass(tmp_path: Path) -> None:
    doc = tmp_path / "ok.md"
    doc.write_text(f"```python\n{FORMATTED}```\n\n~~~py\n{LONG}~~~\n\n```text\nx  =  1\n```\n")
    done = check(doc, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""
    assert "2 python block(s) checked, 0 fragment(s) skipped, 0 failing" in done.stderr


def test_fix_rewrites_only_the_unformatted_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(DOC)
    done = check("--fix", doc, cwd=tmp_path)
    assert done.returncode == 1  # the block that does not compile is left for a person
    fixed = doc.read_text()
    expected = DOC.replace(
        UNFORMATTED,
        'policy = Auto("24h") | OnPreemption()  # aligned comments\n'
        "policy = EverySteps(1000)  # are not ruff's style\n",
    ).replace("   x  =  1\n", "   x = 1\n")
    assert fixed == expected
    again = check(doc, cwd=tmp_path)
    assert again.returncode == 1
    assert [line.split(":")[1] for line in again.stdout.splitlines()] == [
        str(line_of(DOC, "for i in range(3)"))
    ]


def test_an_unclosed_fence_is_bad_input(tmp_path: Path) -> None:
    doc = tmp_path / "broken.md"
    doc.write_text("text\n\n```python\nx = 1\n")
    done = check(doc, cwd=tmp_path)
    assert done.returncode == 2
    assert "broken.md:3: the fence opened here is never closed" in done.stderr
    missing = check(tmp_path / "missing.md", cwd=tmp_path)
    assert missing.returncode == 2
    assert "missing.md" in missing.stderr


IMPORTS = """\
# Imports

```python
from kronos_audit.checkpoint.shards import ShardRecord, shard_path
```

```python
import kronos_audit as ka

policy = ka.EverySteps(10)
run = ka.NoSuchName("heat")
```

```python
import json

import no_such_module_of_kaudit_docs
```

```python
import json

import torch

import kronos_audit as ka
from kronos_audit.checkpoint.layout import shard_path, step_directory

rng = ka.runtime.batch_rng(1, 2)
```
"""


def test_imports_are_run_and_each_one_that_fails_is_named(tmp_path: Path) -> None:
    doc = tmp_path / "imports.md"
    doc.write_text(IMPORTS)
    done = check(doc, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    moved, name, missing = (line_of(IMPORTS, n) for n in ("ShardRecord", "ka.No", "no_such"))
    assert done.stdout.splitlines() == [
        f"imports.md:{moved}: line 1 of the block: import: ImportError: cannot import name "
        "'shard_path' from 'kronos_audit.checkpoint.shards'",
        f"imports.md:{name - 3}: line 4 of the block: ka.NoSuchName: module 'kronos_audit' "
        "has no attribute 'NoSuchName'",
        f"imports.md:{missing - 2}: line 3 of the block: import: no module named "
        "'no_such_module_of_kaudit_docs' is installed",
    ]
    assert "4 python block(s) checked, 0 fragment(s) skipped, 3 failing" in done.stderr
