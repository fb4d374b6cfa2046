"""Recommendations, reports and every command-line entry point (the only package that touches Hydra)."""
