"""The llama.cpp engine: the embedded back-end (``backend``), its batched and hidden-state
probes, its GGUF vocabulary reader, llama.cpp's sampler chain as a model (``sampler``) and
the probe dialect of llama.cpp's own HTTP server (``logprobs``). Imports no other engine's
subpackage (``tests/test_import_direction.py``)."""
