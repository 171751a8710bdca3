"""The host layer: everything that loads backstop.wasm and calls its ABI
(wasm/ABI.md), in one place. ``runtime`` compiles (cached on disk),
instantiates and calls the module under wasmtime; ``abi`` makes a
policy's calls, encoding the failure fields as the module takes them and
decoding the words it answers. The rest of the SDK (``Policy``, the retry
loop, the queue workers) calls the module through these two only."""

from .runtime import ABI_VERSION, Instance, StateLostError, shared

__all__ = ["ABI_VERSION", "Instance", "StateLostError", "shared"]
