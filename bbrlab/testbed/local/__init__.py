"""The local testbed on this machine: guest image, QEMU VMs, host plumbing, state."""
