"""The one error type a broken contract raises: a ValueError naming the trajectory and the field."""


class ContractError(ValueError):
    """A record broke the ledger contract; the message names the trajectory and the field."""

    def __init__(self, trajectory: str, field: str, problem: str):
        self.trajectory = trajectory
        self.field = field
        super().__init__(f"trajectory {trajectory}: field '{field}': {problem}")
