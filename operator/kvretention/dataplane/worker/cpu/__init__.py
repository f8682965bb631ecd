"""SGLang's real engine where there is no GPU: the worker's CPU flags and a tiny model it can serve."""
