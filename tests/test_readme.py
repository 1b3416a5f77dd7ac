"""The README's example and set-up commands stay true."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md has no python example"
    namespaces = []
    for block in blocks:  # each on its own, as a reader copying one block would run it
        namespaces.append({})
        exec(compile(block, str(README), "exec"), namespaces[-1])
    model = namespaces[0]["model"]
    assert model.n_heads_ == 2 and bool(model.certificate_)
    executors = [ns["executor"] for ns in namespaces if "executor" in ns]
    assert all(e.V.shape == (6, 44, 44) for e in executors)


def test_readme_has_exactly_two_setup_commands():
    setup = README.read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", setup, re.S)
    assert [c.strip() for c in commands] == [
        "pip install . && python -m sklearn_linattn demo",
        'pip install -e ".[test]" && python -m pytest',
    ]
