"""Answers: how agents' answers are obtained from a back-end, as one concern. The answer
tree and its walk (``tree``), the answer distribution (``distribution``), the cache of
shared distributions (``shared``), the planner that prices each way to answer a prompt
(``planner``) and the round plan's layout of a round's prompts (``round_plan``). What each
back-end can do is declared on ``simpipe.inference.base.Backend`` and asked here
(``capabilities``); the LLM agents (``simpipe.agents.llm``) ask this package and take its
answers. The price list the planner uses (``simpipe.inference.cost_model``) stays below,
with the back-ends that declare their default costs and the emulated servers that charge
with it: both sit in layers under this one. The round plan's Dask tasks, which render and
play partitions, are ``simpipe.run.planned_round``."""
