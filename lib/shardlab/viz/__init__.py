"""Drawing helpers every topic's figures share: :mod:`shardlab.viz.common` fixes device colours and grids.

A topic's own figures and explorers live in its folder (``shardlab.<topic>.figures``). Importing
:mod:`shardlab.viz.common` imports plotly; nothing here imports torch_xla.
"""
