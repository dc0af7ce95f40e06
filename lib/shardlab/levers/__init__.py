"""Compiler levers (TorchAcc's: combining, overlap, memory order, automatic strategy), measured off vs on.

- ``order``: peak memory of every operator order of a small dataflow graph; XLA's chosen order.
"""
