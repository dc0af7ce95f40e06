"""The report runner: execute notebooks, collect records, compare baselines, sweep parameters, write HTML.

Modules (one concern each): ``notebooks`` (find notebooks, read their parameters cell), ``execute`` (one
papermill run in a child process with a timeout), ``runner`` (the ``report`` command), ``rundir`` (its
output directory and manifest), ``baseline``
(structural exact / timing band comparison), ``sweep`` + ``sweep_charts`` (the ``sweep`` command),
``sweeps_config`` (the sweeps embedded in the report), ``nbhtml`` and ``html`` (offline HTML).
Entry point: ``python -m shardlab report|sweep ...`` (``shardlab/__main__.py``).
"""
