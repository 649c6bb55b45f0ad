"""The topology advisor: which of colocated, or PD with which P:D split, serves a load best.

It simulates the load against one server's measured speeds, DistServe's way, for every
topology the devices allow, and ranks them by goodput under TTFT and TPOT SLOs:

- ``speeds.py``: the measured speeds (prefill, decode step, KV hand-off, colocated
  interference) and their JSON; ``curves.py`` interpolates between measured points;
- ``load.py``: the load profile (arrivals, prompt and output lengths) and its JSON;
  ``recorded.py`` builds one from the router's request timelines;
- ``engine.py``: one server's continuous batching, step by step; ``simulate.py``: the
  discrete-event simulation of a topology; ``goodput.py``: percentiles and goodput;
- ``candidates.py``: the topologies, simulated over several seeds and ranked; ``cli.py``.

    python -m inference.advisor --speeds speeds.json --load load.json \\
        --ttft-slo-ms 500 --tpot-slo-ms 100 --devices 2

No Django here (the data plane never imports it), and nothing is measured: the speeds come in.

What the model leaves out, so a prediction can be wrong in these directions:
- memory: the KV cache's capacity is not modelled, so no request ever waits for KV blocks
  and none is preempted or recomputed (a busy server with a small ``VLLM_CPU_KVCACHE_SPACE``
  does both); ``max_num_seqs`` is the only cap on a batch;
- prefix caching: every prompt is computed in full;
- the prefill cost of a batch depends on its prompt count and total tokens only, not on how
  they split (attention grows with the square of each prompt); a prompt's later chunks cost as
  much as its first, although they attend to the earlier ones;
- the KV hand-off: a fixed time per prompt length, whatever else is moving; no contention on
  the network or the shared-storage directory, no CPU taken from the servers by the transfer
  (NIXL's busy-polling progress thread on a CPU node), and decode computes none of the prompt
  (the last, partial KV block that the shared-storage channel does not move);
- the router: requests are spread by least-outstanding only; its own latency, tokenization,
  retries and ``pd_adaptive``'s per-request choices (short prompts decoded where they
  arrive) are not simulated, so PD here is every request through prefill;
- servers on one machine slow each other by one measured factor whenever their steps overlap
  (``speeds.py``'s ``neighbour``), whatever the neighbour's batch or prompt; a server never
  fails, restarts or warms up;
- the output length is what the load says: no early end of sequence, no ``max_tokens`` cut;
- streaming: a token is seen the moment its step ends; no network or coalescing of tokens.
"""
