"""Benchmarks of sklearn-linattn: ratios measured in one run, written as a markdown table.

Run from the repository root (after ``pip install -e .``)::

    python -m benchmarks                 # every row; writes benchmarks/README.md
    python -m benchmarks --quick         # tiny sizes, prints the table (a smoke test)
    python -m benchmarks --only gram adam --output -   # some rows, table on stdout

Modules
-------
measure
    Timing (interleaved repeats), peak memory (tracemalloc and process peak
    RSS) and running a measurement in a fresh process.
rows
    The benchmark rows (``gram``, ``adam``, ``samples``, ``memory``, ``cg``).
report
    Machine information and the markdown report.
adam_vs_closed_form, certificate_lambda_min
    Stand-alone scripts, runnable on their own.
"""
