"""bbrlab benchmarks: `make bench` (python -m benchmarks [NAME ...]) runs each module's main().

Benchmarks print numbers and ratios; they never assert on time (that is what tests must not do)."""
