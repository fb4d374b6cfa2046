"""Workload models, operator graphs and the serving performance model (pure computation)."""
