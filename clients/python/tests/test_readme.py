"""README.md's Python quick start, run as written against the real server (only the
address, the token and the repository's path are substituted), so it cannot rot."""

from __future__ import annotations

import re

from .conftest import ALICE, REPO_ROOT, Grove


def test_the_readme_quick_start_runs(grove: Grove, capsys: object) -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("### Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "README.md's Python section has no python block"
    url = grove.repo("hello", {"src/lib.rs": "pub fn alpha() {}\n"})
    source = (
        code.group(1)
        .replace('"http://127.0.0.1:8080"', repr(grove.base_url))
        .replace('"file:///path/to/hello"', repr(url))
    )
    namespace: dict[str, object] = {"TOKEN": ALICE}
    exec(compile(source, "README.md", "exec"), namespace)
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert out == "first\nsecond\n"
