"""``python -m bbrlab.sampling.sockdiag``: build (or find in the cache) the sampler; print its path and SHA-256."""

from .binary import main

main()
