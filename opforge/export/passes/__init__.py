"""The export passes, one per file, in the order ``pipeline.run_pipeline`` runs them."""

from opforge.export.passes.decompose import DecomposeToCoreAten
from opforge.export.passes.debug_handles import TagDebugHandles
from opforge.export.passes.symbolic_sizes import SymbolicSizes
from opforge.export.passes.check_functional import CheckFunctional
from opforge.export.passes.drop_assertions import DropAssertions
from opforge.export.passes.to_out_variant import ToOutVariant
from opforge.export.passes.lift_constants import LiftConstants
from opforge.export.passes.update_state_in_place import UpdateStateInPlace
from opforge.export.passes.plan_memory import PlanMemory

__all__ = [
    "DecomposeToCoreAten", "TagDebugHandles", "SymbolicSizes", "CheckFunctional", "DropAssertions", "ToOutVariant", "LiftConstants",
    "UpdateStateInPlace", "PlanMemory",
]
