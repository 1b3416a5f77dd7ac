"""The README's example and set-up commands stay true."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README.md has no python example"
    namespace = {}
    for block in blocks:  # in order, sharing imports, as a reader would run them
        exec(compile(block, str(README), "exec"), namespace)
    model = namespace["model"]
    assert model.n_heads_ == 2 and bool(model.certificate_)
    if "executor" in namespace:
        assert namespace["executor"].V.shape == (6, 44, 44)


def test_readme_has_exactly_two_setup_commands():
    setup = README.read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", setup, re.S)
    assert [c.strip() for c in commands] == [
        "pip install . && python -m sklearn_linattn demo",
        'pip install -e ".[test]" && python -m pytest',
    ]
