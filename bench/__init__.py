"""Benchmarks: each module is a program (python bench/bench_x.py, or python -m bench.bench_x);
bench._common holds their shared set-up."""
