"""bbrlab: TCP congestion control measured from VMs under controlled CPU contention."""

__version__ = "0.1.0"
