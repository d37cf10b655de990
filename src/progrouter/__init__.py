"""progrouter: a router for fleets of vLLM servers that understands AI-agent Programs."""

from progrouter.config import ProgramSchedulingConfig, RouterConfig

__all__ = ["ProgramSchedulingConfig", "RouterConfig", "__version__"]
__version__ = "0.1.0"
