"""Reproduction scripts for the figures of the papers that jaxdp implements.

Each module is runnable with ``python -m experiments.<name> --help``.
"""
