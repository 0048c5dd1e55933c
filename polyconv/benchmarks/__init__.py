"""Benchmarks (not tests): run them as modules, e.g. ``python -m polyconv.benchmarks.jax_vs_lax``.

Nothing here is imported by ``import polyconv``.
"""
