"""The core every topic builds on: the case protocol, the harness, the views, the parameter base, the topic
registry and the exercises' grader (the device world, ``shardlab.runtime``, sits below: profile needs it too).

case         Case: what a topic knows about one configuration (formula, program, oracle, graph, read, ...)
harness      the four views of any case (formula, ledger, XLA:CPU, XLA:TPU), compare, record, gloo — written once
views        View (one source's values, checks, notes) and the helpers that fill it; COMPILERS
params       NotebookParams: one frozen dataclass per notebook, validated once; the shared one-field rules
topics       the registry: Topic, Lesson, Solution, ChartSpec; every notebook found through its topic folder
explorer     a notebook's explorer built from its topic's declaration (controls, evaluate, show): ipywidgets
exercises    the grader of a notebook's exercises; answer_keys: the hand-written keys in data/answers

Importing this package imports nothing; ``harness`` and ``case`` import torch_xla (after ``runtime.setup()``).
"""
