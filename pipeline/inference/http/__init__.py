"""The HTTP back-ends: the keep-alive client (``client``), the retrying base back-end
(``backend``), the OpenAI-compatible (``openai_compat``) and TGI (``tgi``) back-ends and
endpoint addresses (``endpoints``). ``openai_compat`` speaks to servers that run llama.cpp
or vLLM and uses those engines' public probe dialects and sampler models; neither engine
imports this subpackage (``tests/test_import_direction.py``)."""
