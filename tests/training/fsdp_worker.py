"""One rank of tests/training/test_learner_fsdp.py: joins a gloo group, shards the policy with FSDP2
(runtime/fsdp.shard_model), updates on the shared batch and (rank 0) writes the full weights
after the update. Run as a script: ``fsdp_worker.py RANK WORLD PORT POLICY_DIR OUT_DIR``."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_cases import CASES, learner_for, shared_batch  # noqa: E402

from polyrl.runtime.data_parallel import TorchDistributedGroup  # noqa: E402
from polyrl.runtime.fsdp import full_model_state, shard_model  # noqa: E402


def main(rank: int, world: int, port: int, policy_dir: str, out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=45)
    )
    try:
        for name in CASES:
            learner = learner_for(policy_dir, name, shard=shard_model, group=TorchDistributedGroup(shards_parameters=True))
            metrics = learner.update(shared_batch(), 0)
            state = full_model_state(learner.policy, sharded=True)  # a collective: every rank calls it
            if rank == 0:
                save_file({k: v.contiguous() for k, v in state.items()}, str(out / f"{name}.safetensors"))
                (out / f"{name}.json").write_text(json.dumps({**metrics, "optimizer_step": learner.optimizer_step}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
