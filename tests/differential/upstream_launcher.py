"""Run the wheel's own launcher, ``vllm_router.launch_router.main``, by the wheel's interpreter.

Identical to the ``vllm-router`` script except that the Python MiniLB module (a PD-only debugging load
balancer behind ``--mini-lb``) is not imported: it pulls in FastAPI and aiohttp, which is seconds per
router start on a busy 2-core machine. Argument parsing, validation and the Rust router are the wheel's.
"""

import sys
import types


class MiniLoadBalancer:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("--mini-lb is not available in the differential tests' launcher")


stub = types.ModuleType("vllm_router.mini_lb")
stub.MiniLoadBalancer = MiniLoadBalancer  # type: ignore[attr-defined]
sys.modules["vllm_router.mini_lb"] = stub

from vllm_router.launch_router import main  # noqa: E402  (after the stub, on purpose)

if __name__ == "__main__":
    main()
