"""kvscope: see what is in a vLLM prefix cache, what a reset did to it, and how it recovered."""

__version__ = "0.1.0"
