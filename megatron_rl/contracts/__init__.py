"""The ledger and batch contracts every seam validates (ground floor: needs only torch)."""

from megatron_rl.contracts.batch import GeneratorInput, GeneratorOutput, PromptItem, TrainingBatch
from megatron_rl.contracts.errors import ContractError
from megatron_rl.contracts.ledger import from_record, to_record
from megatron_rl.contracts.trajectory import FAILED, Trajectory, TrajectoryId

__all__ = [
    "FAILED",
    "ContractError",
    "GeneratorInput",
    "GeneratorOutput",
    "PromptItem",
    "TrainingBatch",
    "Trajectory",
    "TrajectoryId",
    "from_record",
    "to_record",
]
