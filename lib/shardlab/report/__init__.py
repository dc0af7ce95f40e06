"""The report runner: execute notebooks, collect records, compare baselines, sweep parameters, write HTML.

Modules, from the bottom of the import graph up (each imports only modules above it in this list):

``notebooks``      find notebooks, read their parameters cell (the one parser), refuse runner-owned ``-p``
``execute``        one execution: papermill in a process of its own, a timeout, the failure read back
``floor``          the run's floor: bare kernels (start + ``import torch_xla``) timed in the notebooks' pool
``baseline``       structural exact / timing band comparison with ``data/baselines/<profile>.json``
``charts``         the report's curves drawn from the records; a sweep table's charts
``datatypes``      options, per-notebook results, the report, ``EXIT_*``
``nbhtml``         an executed notebook as offline HTML
``rundir``         the report's output directory and manifest
``sweep``          the ``sweep`` command: one notebook over a grid, table and charts
``html``           the report page
``runner``         the ``report`` command

Entry point: ``python -m shardlab report|sweep ...`` (``shardlab/__main__.py``).
"""
