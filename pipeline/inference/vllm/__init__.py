"""The vLLM engine as simpipe meets it over HTTP: its sampler as a model (``sampler``) and
the probe dialect of its OpenAI-compatible server (``logprobs``). Imports no other engine's
subpackage (``tests/test_import_direction.py``)."""
