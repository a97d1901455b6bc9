"""Benchmarks that print JSON (`python -m benchmarks.<name> --help`); a regular package, so that
no installed distribution's top-level `benchmarks` (Opacus ships one) shadows it."""
