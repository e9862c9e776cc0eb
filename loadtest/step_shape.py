"""A step-load shape for the locust users: load rises in equal steps, each held a while.

    locust -f loadtest/locustfile.py,loadtest/step_shape.py --step-users 4 --step-seconds 30 \\
        --steps 5 --headless --host http://127.0.0.1:8000

gives 4, 8, 12, 16 and 20 users for 30 s each, then stops: one run shows how latency grows
with load, and where throughput stops following it (saturation).
"""

from __future__ import annotations

from locust import LoadTestShape, events
from locust.argument_parser import LocustArgumentParser


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _options(parser: LocustArgumentParser) -> None:
    group = parser.add_argument_group("step load")
    group.add_argument("--step-users", type=int, default=4, help="users added at each step")
    group.add_argument("--step-seconds", type=float, default=30.0, help="how long each step lasts")
    group.add_argument("--steps", type=int, default=5, help="number of steps")


class StepLoad(LoadTestShape):
    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options if self.runner else None
        if options is None:
            return None
        step = int(self.get_run_time() // options.step_seconds)  # type: ignore[no-untyped-call]
        if step >= options.steps:
            return None
        # Each step's users arrive within about a second.
        return (step + 1) * options.step_users, float(options.step_users)
