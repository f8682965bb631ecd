"""Development tools that never ship in the runtime package or its images: the real local
control plane the tests, the demo and the benchmarks run against (``kvretention cluster``)."""
