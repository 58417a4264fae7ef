"""The base of every validated input (a scenario's sections, a study, the published catalogue):
unknown keys, assignment and non-finite numbers are errors."""
from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
