"""How each distinct prompt of a planned round is answered over HTTP, chosen by cost.

A prompt that ``k`` agents of the round hold (all partitions together) can be answered in
up to three exact ways, each offered only where the back-end declares it
(``simpipe.inference.base.Backend``):

- ``tree``: its answer distribution, computed once from one-token probes
  (``shares_answers``), every agent drawing from it;
- ``samples``: requests with ``n`` samples, at most ``samples_per_request`` agents each;
- ``per_agent``: one request per agent (always offered).

Each is priced with the back-end's ``CostModel`` (``simpipe.inference.cost_model``: what the
emulated fleet charges, from the emulator's profile where the servers are emulated, else the
back-end's ``default_costs``, each key overridable in ``[agents.cost]``), and the cheapest
wins, the simpler on a tie (``METHODS`` order). The prices, per prompt of ``T`` tokens whose
last two lines (the agent's own numbers and the cue: ``own`` tokens) differ from other
prompts:

- a request of its own evaluates what follows the cached prefix it shares with other
  prompts (the rules, persona and announced numbers come first and are in every server's
  cache after a few requests): ``first = request_cost_s(T, 0, cached(T, T - own))``; each of
  a prompt's requests is counted as the first on its server (the servers are many, the
  agents per prompt few, where it matters);
- ``per_agent``: ``k * (first + answer_tokens * decode)``;
- ``samples``: ``r * first + k * answer_tokens * decode`` for ``r = ceil(k / cap)`` requests;
- ``tree``: ``first`` for its root, then ``tree_probes - 1`` probes, each one token more of
  the prompt than the cache holds (the session's probes go to one server:
  ``OpenAIBackend.logprob_session``), ``request_cost_s(T + L, 1, cached(T + L, T))`` for
  answer prefixes of ``L`` = 1 and 2 tokens (averaged), one decoded token each.

The choice depends only on the round's counts and prompts, never on the workers, the
partitions or the servers' number, so a prompt is answered the same way on any cluster. The
predicted cost counts what the partitions will send: a prompt's agents are grouped into
requests per partition (``OpenAIBackend.generate_many``), so ``samples`` costs
``sum over partitions of ceil(k_p / cap)`` requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simpipe.answers.capabilities import backend_class
from simpipe.config.model import Config
from simpipe.inference.cost_model import CostModel
from simpipe.servers.emulator_profiles import get_profile

METHODS = ("per_agent", "samples", "tree")
#: How the embedded engine's planned rounds answer (its own measured rule, not priced).
LAZY_METHODS = ("walk", "tree")


@dataclass(frozen=True)
class AnswerCosts:
    """What a back-end offers and what it costs (``answer_costs``)."""

    model: CostModel
    trees: bool  # it computes answer distributions from probes
    samples_cap: int  # most samples per request; 1: none
    tree_probes: float
    answer_tokens: float

    def prices(self, agents: np.ndarray, tokens: np.ndarray, own: np.ndarray,
               requests: np.ndarray | None = None) -> np.ndarray:
        """GPU seconds per method (rows in ``METHODS`` order, inf where not offered) and
        prompt (columns): ``agents`` of the round on each, its ``tokens``, ``own`` of them
        its own; ``requests``: the requests ``samples`` sends (default ``ceil(k / cap)``)."""
        k = np.asarray(agents, np.float64)
        tokens = np.asarray(tokens, np.int64)
        own = np.minimum(np.asarray(own, np.int64), tokens)
        first, probe = self._per_prompt(tokens, own)
        decode = self.model.decode_s_per_token * self.answer_tokens
        out = np.full((len(METHODS), k.size), np.inf)
        out[0] = k * (first + decode)
        if self.samples_cap > 1:
            r = np.ceil(k / self.samples_cap) if requests is None else requests
            out[1] = r * first + k * decode
        if self.trees:
            out[2] = first + (self.tree_probes - 1) * probe + self.model.decode_s_per_token
        return out

    def _per_prompt(self, tokens: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per prompt: a request of its own without output (``first``), and one probe
        after the root (``probe``): ``CostModel.request_cost_s`` for each distinct
        (tokens, own) pair."""
        m = self.model
        pairs, inverse = np.unique(np.stack([tokens, own]), axis=1, return_inverse=True)
        first = np.empty(pairs.shape[1])
        probe = np.empty(pairs.shape[1])
        for j, (t, o) in enumerate(pairs.T.tolist()):
            first[j] = m.request_cost_s(t, 0, m.cached(t, t - o))
            probe[j] = sum(m.request_cost_s(t + n, 1, m.cached(t + n, t)) for n in (1, 2)) / 2
        inverse = inverse.ravel()
        return first[inverse], probe[inverse]

    def choose(self, agents: np.ndarray, tokens: np.ndarray, own: np.ndarray) -> np.ndarray:
        """Per prompt, the index in ``METHODS`` of the cheapest offered method (the first
        on a tie)."""
        return np.argmin(self.prices(agents, tokens, own), axis=0)


def answer_costs(config: Config) -> AnswerCosts | None:
    """The back-end's offer and costs for ``config``'s agents: the emulator profile's cost
    model where the servers are emulated, else the back-end's ``default_costs``, with the
    keys ``[agents.cost]`` sets; None for a back-end without servers to price."""
    agents = config.agents
    if not agents.plugin.is_llm:
        return None
    engine = backend_class(agents.backend)
    settings = agents.settings
    servers = config.cluster.servers
    if servers.plugin.emulator:
        base: CostModel | None = get_profile(servers.emulated.profile,
                                             servers.emulated.params).cost_model()
    else:
        base = engine.default_costs(settings)
    if base is None:
        return None
    c = agents.cost

    def pick(value: float | int | None, default: float | int) -> float | int:
        return default if value is None else value

    model = CostModel(pick(c.prefill_s_per_token, base.prefill_s_per_token),
                      pick(c.decode_s_per_token, base.decode_s_per_token),
                      pick(c.request_s, base.request_s),
                      int(pick(c.prefix_block_tokens, base.prefix_block)),
                      base.source if c == type(c)() else f"{base.source}, with [agents.cost]")
    return AnswerCosts(model, engine.shares_answers(settings),
                       engine.samples_per_request(settings), c.tree_probes, c.answer_tokens)


def methods_record(methods: np.ndarray, names: tuple[str, ...], agents: np.ndarray,
                   predicted: float | None = None, source: str = "") -> dict:
    """A round's ``answer_methods`` (run.json): prompts and agents per method, and, where
    priced, the predicted GPU seconds (``spent_gpu_s``: the emulated fleet's, filled in
    after the run by ``record_spent``)."""
    record: dict = {name: {"prompts": int((methods == i).sum()),
                           "agents": int(agents[methods == i].sum())}
                    for i, name in enumerate(names)}
    if predicted is not None:
        record.update(predicted_gpu_s=float(f"{predicted:.6g}"), spent_gpu_s=None,
                      cost_model=source)
    return record


def record_spent(estimate: dict | None) -> dict[int, float]:
    """Per round index (from 0), the GPU seconds the emulated fleet spent on it: the work
    its requests cost (``simpipe.run.estimate``: the per-server mean ``ideal_s`` times the
    servers read)."""
    if not estimate:
        return {}
    servers = estimate.get("servers_read") or 0
    return {r["round"] - 1: float(f"{r['ideal_s'] * servers:.6g}")
            for r in estimate.get("rounds", [])}
