"""A Ray Serve application for the connector tests: one GPU per replica."""

from ray import serve


@serve.deployment(ray_actor_options={"num_gpus": 1, "num_cpus": 0.1})
class Echo:
    def __call__(self, request: object) -> str:
        return "ok"


app = Echo.bind()
