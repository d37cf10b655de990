"""Discrete-event simulation: the Program scheduler and the engine model, driven in virtual time.

``Simulation(trace, FleetSpec(...), arm).run()`` replays a trace closed loop under one routing arm on a cold
fleet of ``EngineCore`` Ranks and returns the live bench's figures; ``progrouter simulate`` compares arms.
"""

from progrouter.sim.arms import SimArm, standard_arm, variant_arm
from progrouter.sim.ranks import FleetSpec
from progrouter.sim.report import build_report, write_report
from progrouter.sim.simulation import ArmResult, Simulation

__all__ = [
    "ArmResult",
    "FleetSpec",
    "SimArm",
    "Simulation",
    "build_report",
    "standard_arm",
    "variant_arm",
    "write_report",
]
