"""kvretention: an operator and request path for hinted SGLang/Mooncake LLM-serving fleets."""

__version__ = "0.1.0"
