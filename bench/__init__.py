"""blpickle's benchmarks: ``python -m bench`` reproduces the Bloscpack paper's study."""
