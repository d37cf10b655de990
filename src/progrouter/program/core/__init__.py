"""The scheduler's components: each owns its state and is wired once by ``ProgramScheduler``."""
