"""The report runner: execute notebooks, collect records, compare baselines, sweep parameters, write HTML.

Modules, from the bottom of the import graph up (each imports only modules above it in this list):

``notebooks``      find notebooks, read their parameters cell (the one parser), refuse runner-owned ``-p``
``execute``        one execution: the runner's prologue / epilogue cells, reading a finished run back
``baseline``       structural exact / timing band comparison with ``data/baselines/<profile>.json``
``kernel_worker``  the child process that holds one kernel and runs notebooks in it
``pool``           many executions on ``--jobs`` kernels; sweep points share kernels, with a compile-cache guard
``datatypes``      options, per-notebook results, sweep summaries, the report, ``EXIT_*``
``nbhtml``         an executed notebook as offline HTML
``rundir``         the report's output directory and manifest
``sweep`` + ``sweep_charts``   the ``sweep`` command: one notebook over a grid, table and charts
``sweeps_config``  the sweeps embedded in the report
``html``           the report page
``runner``         the ``report`` command

Entry point: ``python -m shardlab report|sweep ...`` (``shardlab/__main__.py``).
"""
