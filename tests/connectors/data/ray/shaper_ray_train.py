"""A Ray job for the connector tests: a two-bundle placement group of GPUs, one actor per
bundle, then it works until stopped. It records, one line per run, where it resumed from
(``SHAPER_RESUME_FROM``), so a test sees its resubmission resume from its checkpoint."""

import os
import sys
import time
from pathlib import Path

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

gpus_per_bundle, bundles, record = float(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
ray.init()
group = placement_group([{"GPU": gpus_per_bundle, "CPU": 0.1}] * bundles, strategy="STRICT_SPREAD")
ray.get(group.ready())


@ray.remote(num_gpus=gpus_per_bundle, num_cpus=0.1)
class Worker:
    def ready(self) -> bool:
        return True


workers = [
    Worker.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
    ).remote()
    for i in range(bundles)
]
ray.get([w.ready.remote() for w in workers])
with record.open("a") as stream:
    stream.write(f"resumed_from={os.environ.get('SHAPER_RESUME_FROM', '')}\n")
while True:
    time.sleep(1)
