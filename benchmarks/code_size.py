"""Lines of code and of docstrings in the package, and its longest docstrings.

A code line is a non-blank line that is neither a comment nor part of a
docstring (of a module, class or function); a docstring line is any line of
one.  Usage::

    python benchmarks/code_size.py                 # the package: totals, longest docstrings
    python benchmarks/code_size.py --per-file      # also one line per file
    python benchmarks/code_size.py PATH [PATH ...] # some files or folders
"""

import argparse
import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sklearn_linattn"


def measure(path):
    """``(code_lines, docstring_lines, [(lines, name), ...])`` of one Python file."""
    source = Path(path).read_text()
    doc_lines, docstrings = set(), []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            doc_lines.update(range(first.lineno, first.end_lineno + 1))
            docstrings.append((first.end_lineno - first.lineno + 1,
                               f"{path}:{getattr(node, 'name', '<module>')}"))
    comments = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    code = sum(1 for i, line in enumerate(source.splitlines(), 1)
               if line.strip() and i not in doc_lines
               and not (i in comments and line.strip().startswith("#")))
    return code, len(doc_lines), docstrings


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=[str(PACKAGE)])
    parser.add_argument("--per-file", action="store_true")
    parser.add_argument("--longest", type=int, default=5, help="docstrings to list")
    args = parser.parse_args(argv)
    files = sorted(f for p in map(Path, args.paths)
                   for f in ([p] if p.is_file() else p.rglob("*.py")))
    total_code = total_doc = 0
    docstrings = []
    for f in files:
        code, doc, found = measure(f)
        total_code, total_doc = total_code + code, total_doc + doc
        docstrings += found
        if args.per_file:
            print(f"{code:6d} code {doc:6d} docstring  {f}")
    print(f"code lines: {total_code}, docstring lines: {total_doc}, files: {len(files)}")
    for n, name in sorted(docstrings, reverse=True)[:args.longest]:
        print(f"  {n:4d}-line docstring: {name}")


if __name__ == "__main__":
    main()
