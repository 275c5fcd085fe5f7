"""radixchat: a terminal chat app with its own radix-tree KV-cache inference engine."""

__version__ = "0.1.0"
