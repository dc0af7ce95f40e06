"""Figures and ipywidgets explorers, one module per topic; :mod:`shardlab.viz.common` fixes device colours.

Importing a topic module imports plotly/ipywidgets; nothing here imports torch_xla.
"""
