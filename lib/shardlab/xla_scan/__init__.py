"""scan over layers (see model.py design note)."""
