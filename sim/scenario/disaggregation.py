"""Prefill and decode on separate pools (SGLang's and vLLM's disaggregation, NVIDIA Dynamo, llm-d).

A scenario's own layout (`tensor_parallel`, `data_parallel`, `expert_parallel`) is its decode
pool's; `disaggregation` adds the prefill pool and the link the KV cache crosses between them:

    disaggregation:
      prefill:                   # the prefill pool, or `unlimited` (a decode pool measured alone)
        instances: 2             # prefill servers, requests to them round robin
        tensor_parallel: 8       # each server's layout, as the scenario's own fields
        data_parallel: 1
        expert_parallel: false
        prefill_chunk: 16384     # prompt tokens a prefill forward takes
      transfer:
        link: network            # network (the hardware's network_gb_s a GPU) | nvlink (interconnect_gb_s)
        gb_s: null               # a measured rate a GPU instead of the hardware's
        latency_s: 0.0001        # per transfer: the handshake and the first bytes

sim/pools.py runs it.
"""
from __future__ import annotations

from typing import Literal, Union

from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt

from sim.scenario.strict import Strict


class PrefillPool(Strict):
    """The prefill pool: `instances` servers of one layout each, each prefilling its own requests in
    chunks of `prefill_chunk` prompt tokens a forward."""
    instances: PositiveInt = 1
    tensor_parallel: PositiveInt = 1
    data_parallel: PositiveInt = 1
    expert_parallel: bool = False
    prefill_chunk: PositiveInt = 16384

    @property
    def gpus(self) -> int:
        """GPUs of one prefill server."""
        return self.tensor_parallel * self.data_parallel


class Transfer(Strict):
    """The link a request's KV cache crosses from its prefill server to the decode pool: every GPU
    of the prefill server sends its own shard at `gb_s` (default: the hardware's)."""
    link: Literal["network", "nvlink"] = "network"
    gb_s: PositiveFloat | None = None
    latency_s: NonNegativeFloat = 1e-4


class Disaggregation(Strict):
    prefill: Union[PrefillPool, Literal["unlimited"]] = PrefillPool()
    transfer: Transfer = Transfer()

    @property
    def prefill_gpus(self) -> int:
        """GPUs of the whole prefill pool (none when unlimited: it is not part of the deployment priced)."""
        return 0 if self.prefill == "unlimited" else self.prefill.instances * self.prefill.gpus
